// Two facts about the edges of a CUDA graph that decide how ftbert records its forward:
//
//   graph_edges steps   the time a step between two kernels of a graph takes, with plain edges and
//                       with programmatic ones (programmatic dependent launch), before and after
//                       another stream of the process has run kernels;
//   graph_edges cublas  whether cuBLAS's and cuBLASLt's kernels wait for the kernel before them
//                       when the edge into them is made programmatic: a writer kernel lets its
//                       dependents start at once, then spins 30 us before it writes the GEMM's
//                       input, so a GEMM that does not wait (griddepcontrol.wait) reads the old,
//                       zeroed input and its result differs from the reference.
//
// On a GPU machine:
//   nvcc -O2 -gencode=arch=compute_90a,code=sm_90a -o /tmp/graph_edges \
//        benchmarks/kernels/graph_edges.cu -lcublas -lcublasLt && /tmp/graph_edges steps
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#define CHECK(x)                                                                         \
  do {                                                                                   \
    const int e_ = static_cast<int>(x);                                                  \
    if (e_ != 0) {                                                                       \
      std::printf("error %d from %s at %s:%d\n", e_, #x, __FILE__, __LINE__);            \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

namespace {

__device__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

__device__ void spin(int ns) {
  const unsigned long long s = global_ns();
  while (global_ns() - s < static_cast<unsigned long long>(ns)) {
  }
}

// ---- steps ------------------------------------------------------------------------------------

template <bool kProgrammatic>
__global__ void step_kernel(float* x, int spin_ns) {
  if (kProgrammatic) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  }
  spin(spin_ns);
  x[blockIdx.x * blockDim.x + threadIdx.x] += 1.f;
}

__global__ void tiny(float* x) { x[threadIdx.x] += 1.f; }

constexpr int kSteps = 200, kSpinNs = 2000;

cudaGraphExec_t chain(cudaStream_t s, float* x, bool programmatic) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaGraph_t g;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kSteps; ++i) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = 132;
    cfg.blockDim = 256;
    cfg.stream = s;
    if (programmatic) {
      cfg.attrs = &attr;
      cfg.numAttrs = 1;
      CHECK(cudaLaunchKernelEx(&cfg, step_kernel<true>, x, kSpinNs));
    } else {
      CHECK(cudaLaunchKernelEx(&cfg, step_kernel<false>, x, kSpinNs));
    }
  }
  CHECK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t e;
  CHECK(cudaGraphInstantiate(&e, g, 0));
  CHECK(cudaGraphDestroy(g));
  return e;
}

void time_steps(const char* state, cudaStream_t s, const cudaGraphExec_t (&graphs)[2]) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int p = 0; p < 2; ++p) {
    std::vector<float> ms;
    for (int r = 0; r < 21; ++r) {
      CHECK(cudaEventRecord(a, s));
      CHECK(cudaGraphLaunch(graphs[p], s));
      CHECK(cudaEventRecord(b, s));
      CHECK(cudaEventSynchronize(b));
      float t;
      CHECK(cudaEventElapsedTime(&t, a, b));
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    std::printf("%-50s %-13s %.3f us a step beyond the kernels' own %d ns\n", state,
                p ? "programmatic" : "plain", (1e3 * ms[10] - kSteps * kSpinNs * 1e-3) / kSteps,
                kSpinNs);
  }
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
}

int steps() {
  float *x, *y;
  CHECK(cudaMalloc(&x, 132 * 256 * sizeof(float)));
  CHECK(cudaMalloc(&y, 4096 * sizeof(float)));
  int lowest, highest;
  CHECK(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
  cudaStream_t s, high, other;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithPriority(&high, cudaStreamNonBlocking, highest));
  CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  const cudaGraphExec_t on_s[2] = {chain(s, x, false), chain(s, x, true)};
  const cudaGraphExec_t on_high[2] = {chain(high, x, false), chain(high, x, true)};
  time_steps("one stream so far", s, on_s);
  time_steps("one stream so far, high-priority stream", high, on_high);
  for (int i = 0; i < 100; ++i) tiny<<<1, 32, 0, s>>>(y);
  CHECK(cudaStreamSynchronize(s));
  time_steps("after 100 small kernels on the same stream", s, on_s);
  for (int i = 0; i < 100; ++i) tiny<<<1, 32, 0, other>>>(y);
  CHECK(cudaStreamSynchronize(other));
  time_steps("after 100 small kernels on another stream", s, on_s);
  time_steps("  the same, high-priority stream", high, on_high);
  CHECK(cudaStreamDestroy(other));
  usleep(200000);
  time_steps("the other stream destroyed, 0.2 s later", s, on_s);
  sleep(2);
  time_steps("2 s idle later", s, on_s);
  return 0;
}

// ---- cublas -----------------------------------------------------------------------------------

__global__ void slow_writer(__half* dst, const __half* src, int64_t n, int spin_ns) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  spin(spin_ns);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += gridDim.x * int64_t(blockDim.x)) {
    dst[i] = src[i];
  }
}

__global__ void read_without_wait(float* out, const __half* a) { out[0] = __half2float(a[5]); }

__global__ void fill(__half* x, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += gridDim.x * int64_t(blockDim.x)) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    x[i] = __float2half((h & 1023) / 512.f - 1.f);
  }
}

// The next node captured on s depends on the current ones through programmatic edges.
void programmatic_next(cudaStream_t s) {
  cudaStreamCaptureStatus status;
  unsigned long long id;
  cudaGraph_t g;
  const cudaGraphNode_t* deps;
  const cudaGraphEdgeData* data;
  size_t n;
  CHECK(cudaStreamGetCaptureInfo(s, &status, &id, &g, &deps, &data, &n));
  std::vector<cudaGraphNode_t> nodes(deps, deps + n);
  std::vector<cudaGraphEdgeData> edges(n);
  for (cudaGraphEdgeData& e : edges) {
    e = {};
    e.type = cudaGraphDependencyTypeProgrammatic;
    e.from_port = cudaGraphKernelNodePortProgrammatic;
  }
  CHECK(cudaStreamUpdateCaptureDependencies(s, nodes.data(), edges.data(), n,
                                            cudaStreamSetCaptureDependencies));
}

int cublas() {
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cublasHandle_t handle;
  CHECK(cublasCreate(&handle));
  CHECK(cublasSetStream(handle, s));
  cublasLtHandle_t lt;
  CHECK(cublasLtCreate(&lt));
  const int64_t most = 16384LL * 3072;
  __half *a, *a_src, *w;
  void *c, *ref, *workspace;
  float* flag;
  CHECK(cudaMalloc(&a, most * 2));
  CHECK(cudaMalloc(&a_src, most * 2));
  CHECK(cudaMalloc(&w, 3072LL * 3072 * 2));
  CHECK(cudaMalloc(&c, most * 4));
  CHECK(cudaMalloc(&ref, most * 4));
  CHECK(cudaMalloc(&flag, 4));
  const size_t workspace_bytes = 32 << 20;
  CHECK(cudaMalloc(&workspace, workspace_bytes));
  fill<<<1024, 256, 0, s>>>(a_src, most, 1);
  fill<<<1024, 256, 0, s>>>(w, 3072LL * 3072, 2);
  auto writer = [&](int64_t n) {
    slow_writer<<<264, 256, 0, s>>>(a, a_src, n, 30000);
    CHECK(cudaGetLastError());
  };
  {  // The check can fail: a kernel of ours without the wait reads the stale input.
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    writer(4096);
    programmatic_next(s);
    read_without_wait<<<1, 1, 0, s>>>(flag, a);
    CHECK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t e;
    CHECK(cudaGraphInstantiate(&e, g, 0));
    CHECK(cudaMemsetAsync(a, 0, 4096 * 2, s));
    CHECK(cudaGraphLaunch(e, s));
    float read = -1;
    CHECK(cudaMemcpyAsync(&read, flag, 4, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    __half written;
    CHECK(cudaMemcpy(&written, a_src + 5, 2, cudaMemcpyDeviceToHost));
    std::printf("control: a kernel without the wait read %g where the writer writes %g\n", read,
                __half2float(written));
  }
  struct Shape {
    int m, n, k;
    bool fp32_out;  // the split-k partials' GEMMs
  };
  const Shape shapes[] = {{128, 2304, 768, false},  {128, 3072, 768, false},
                          {128, 768, 3072, true},   {128, 768, 768, true},
                          {4096, 2304, 768, false}, {4096, 768, 3072, false},
                          {16384, 3072, 768, false}};
  auto check = [&](const std::string& what, const Shape& sh, const std::function<void()>& gemm) {
    const int64_t outputs = int64_t(sh.m) * sh.n;
    const size_t bytes = outputs * (sh.fp32_out ? 4 : 2);
    CHECK(cudaMemcpyAsync(a, a_src, int64_t(sh.m) * sh.k * 2, cudaMemcpyDeviceToDevice, s));
    gemm();
    CHECK(cudaMemcpyAsync(ref, c, bytes, cudaMemcpyDeviceToDevice, s));
    int differ = 0;
    for (int trial = 0; trial < 3; ++trial) {
      cudaGraph_t g;
      CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      writer(int64_t(sh.m) * sh.k);
      programmatic_next(s);
      gemm();
      CHECK(cudaStreamEndCapture(s, &g));
      cudaGraphExec_t e;
      CHECK(cudaGraphInstantiate(&e, g, 0));
      CHECK(cudaMemsetAsync(a, 0, int64_t(sh.m) * sh.k * 2, s));
      CHECK(cudaMemsetAsync(c, 0, bytes, s));
      CHECK(cudaGraphLaunch(e, s));
      CHECK(cudaStreamSynchronize(s));
      std::vector<unsigned char> got(bytes), want(bytes);
      CHECK(cudaMemcpy(got.data(), c, bytes, cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(want.data(), ref, bytes, cudaMemcpyDeviceToHost));
      differ += got != want;
      CHECK(cudaGraphExecDestroy(e));
      CHECK(cudaGraphDestroy(g));
    }
    std::printf("%-40s %5d x %4d x %4d  %s\n", what.c_str(), sh.m, sh.n, sh.k,
                differ ? "differs: does not wait" : "as the reference: waits");
  };
  const float one = 1.f, zero = 0.f;
  for (const Shape& sh : shapes) {
    // Row-major c = a · w as the column-major cᵀ = wᵀ · aᵀ, as the engine calls it.
    check("cublasGemmEx", sh, [&] {
      CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, sh.n, sh.m, sh.k, &one, w, CUDA_R_16F,
                         sh.n, a, CUDA_R_16F, sh.k, &zero, c,
                         sh.fp32_out ? CUDA_R_32F : CUDA_R_16F, sh.n, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT));
    });
    if (sh.fp32_out) {
      check("cublasGemmStridedBatchedEx, k split in 4", sh, [&] {
        const int kk = sh.k / 4;
        CHECK(cublasGemmStridedBatchedEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, sh.n, sh.m, kk, &one, w,
                                         CUDA_R_16F, sh.n, int64_t(kk) * sh.n, a, CUDA_R_16F, sh.k,
                                         kk, &zero, c, CUDA_R_32F, sh.n, int64_t(sh.m) * sh.n, 4,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      });
      continue;
    }
    cublasLtMatmulDesc_t desc;
    CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasLtMatrixLayout_t lw, la, lc;
    CHECK(cublasLtMatrixLayoutCreate(&lw, CUDA_R_16F, sh.n, sh.k, sh.n));
    CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16F, sh.k, sh.m, sh.k));
    CHECK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16F, sh.n, sh.m, sh.n));
    for (const size_t ws : {workspace_bytes, size_t{0}}) {
      cublasLtMatmulPreference_t pref;
      CHECK(cublasLtMatmulPreferenceCreate(&pref));
      CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &ws, sizeof(ws)));
      cublasLtMatmulHeuristicResult_t found[8];
      int count = 0;
      CHECK(cublasLtMatmulAlgoGetHeuristic(lt, desc, lw, la, lc, lc, pref, 8, found, &count));
      for (int i = 0; i < count; ++i) {
        const cublasLtMatmulAlgo_t algo = found[i].algo;
        check("cublasLt heuristic #" + std::to_string(i) + (ws ? ", workspace" : ", none"), sh,
              [&] {
                CHECK(cublasLtMatmul(lt, desc, &one, w, lw, a, la, &zero, c, lc, c, lc, &algo,
                                     ws ? workspace : nullptr, ws, s));
              });
      }
      CHECK(cublasLtMatmulPreferenceDestroy(pref));
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "";
  if (what == "steps") return steps();
  if (what == "cublas") return cublas();
  std::printf("usage: graph_edges steps | cublas\n");
  return 2;
}
