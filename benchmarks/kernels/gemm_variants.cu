// Kernel-level harness for the Hopper GEMMs of a BERT layer: every CUTLASS configuration of
// gemm_variants.h, cuBLAS (cublasGemmEx, what the engine calls) and cuBLASLt's heuristic
// candidates, at the layer's four shapes, each checked against an fp32-output reference and timed.
// For tuning on a GPU machine (CUTLASS headers from the nvidia-cutlass wheel; each configuration
// builds in parallel):
//
//   CUTLASS=$(python3 -c 'import cutlass_library, os; print(os.path.dirname(cutlass_library.__file__))')/source/include
//   for ve in 0_0 0_1 0_2 0_3 1_0 1_1 2_0 2_1 3_0 3_1 4_0 4_1 4_2 4_3 5_0 5_1 5_2 5_3 6_0 6_1 \
//             7_0 7_1 8_0 8_1 9_0 9_1 10_0 10_1 11_0 11_1 12_0 12_1 13_0 13_1; do v=${ve%_*} e=${ve#*_}
//     nvcc -O3 -DNDEBUG -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
//       -Icpp -Icpp/include -I$CUTLASS -DFTBERT_VARIANT=$v -DFTBERT_EPILOGUE=$e -c -o /tmp/gv_$ve.o \
//       benchmarks/kernels/gemm_variant.cu & done; wait
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icpp -Icpp/include -o /tmp/gemm_variants \
//     benchmarks/kernels/gemm_variants.cu cpp/cuda/launch.cu cpp/cuda/cuda_check.cu /tmp/gv_*.o \
//     -lcublas -lcublasLt && /tmp/gemm_variants
//
// Times: 20 launches captured in a CUDA graph, the graph replayed 15 times between CUDA events
// after a warm-up, the median replay / 20. TFLOP/s counts 2 m n k. `rows128` times the four
// GEMMs at 128 and 256 rows instead (built with -DFTBERT_FIRST_VARIANT=9, only the small-tile
// configurations 9-13 are needed); `ffn-in` FFN-in alone (bias + erf-GELU, bias + ReLU, plain)
// at both row counts; `residual` the output projections plain and with the bias and the residual
// in cuBLASLt's epilogue (C = the residual, beta = 1), `qkv-bias` QKV plain and with its bias in
// cuBLASLt's epilogue (no CUTLASS configuration in these two, so -DFTBERT_FIRST_VARIANT=14 builds
// them without their units). `sustain [seconds]` runs the
// FFN-in kernels back to back for that long instead (see sustain() below), e.g. beside
//   nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active \
//     --format=csv -lms 100
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "gemm_variants.h"
#include "harness_check.h"

namespace fb = ftbert::bench;

// -DFTBERT_FIRST_VARIANT=n builds and times only the CUTLASS configurations from n on (the
// others' translation units are then not needed), e.g. 9 for the small-tile ones with `rows128`;
// -DFTBERT_LAST_VARIANT=n up to n: with both at 4, only the engine's FFN-in kernel (four
// translation units), e.g. to compare builds of its epilogue with `ffn-in`.
#ifndef FTBERT_FIRST_VARIANT
#define FTBERT_FIRST_VARIANT 0
#endif
constexpr int kFirstVariant = FTBERT_FIRST_VARIANT;
#ifndef FTBERT_LAST_VARIANT
#define FTBERT_LAST_VARIANT (ftbert::bench::kGemmVariants - 1)
#endif
constexpr int kLastVariant = FTBERT_LAST_VARIANT;

namespace {

// Uniform in [-scale, scale) from a hash of the index: the same data on every run.
__global__ void fill(__half* x, int64_t n, uint32_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += gridDim.x * int64_t(blockDim.x)) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    x[i] = __float2half((float(h & 0xffffff) / 8388608.0f - 1.0f) * scale);
  }
}

// ref [m, n] (fp32 accumulators of the fp16 product) -> act(ref + bias) in place (no bias:
// nullptr), act erf-GELU, ReLU or (none) the identity; with a residual, ref + bias + residual.
__global__ void bias_act_reference(float* ref, const __half* bias, bool relu, int64_t rows,
                                   int n, const __half* residual = nullptr, bool none = false) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * n;
       i += gridDim.x * int64_t(blockDim.x)) {
    const float x = ref[i] + (bias ? __half2float(bias[i % n]) : 0.0f);
    if (residual || none) {
      ref[i] = x + (residual ? __half2float(residual[i]) : 0.0f);
      continue;
    }
    ref[i] = relu ? fmaxf(x, 0.0f) : 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
  }
}

// The largest |out - ref| and |ref|, as two floats' bits (both non-negative, so int max orders
// them); a NaN in out counts as +inf.
__global__ void max_error(const __half* out, const float* ref, int64_t n, unsigned* result) {
  float err = 0.0f, mag = 0.0f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += gridDim.x * int64_t(blockDim.x)) {
    const float d = fabsf(__half2float(out[i]) - ref[i]);
    err = fmaxf(err, d != d ? INFINITY : d);
    mag = fmaxf(mag, fabsf(ref[i]));
  }
  atomicMax(result, __float_as_uint(err));
  atomicMax(result + 1, __float_as_uint(mag));
}

struct Shape {
  const char* name;
  int m, n, k;
  int epilogue;  // 0 plain, 1 bias + erf-GELU, 2 erf-GELU alone, 3 bias + ReLU,
                // 4 bias + residual (C, beta = 1), 5 bias alone (both cuBLASLt only)
};

struct Buffers {
  __half *a, *w, *bias, *c, *residual;
  float* ref;
  unsigned* err;
};

// kLaunches launches of enqueue captured into a CUDA graph (destroyed with this).
constexpr int kLaunches = 20;
struct Recorded {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  Recorded(cudaStream_t stream, const std::function<void()>& enqueue) {
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < kLaunches; ++i) enqueue();
    CHECK(cudaStreamEndCapture(stream, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
  }
  ~Recorded() {
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
  }
};

// Two events around work on a stream; ms() waits for the second.
struct Events {
  cudaEvent_t start, stop;
  Events() {
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
  }
  ~Events() {
    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(stop));
  }
  float ms() const {
    CHECK(cudaEventSynchronize(stop));
    float t = 0;
    CHECK(cudaEventElapsedTime(&t, start, stop));
    return t;
  }
};

// Milliseconds per launch of enqueue (see the header comment).
double time_ms(cudaStream_t stream, const std::function<void()>& enqueue) {
  constexpr int kReplays = 15;
  const Recorded recorded(stream, enqueue);
  const Events events;
  CHECK(cudaGraphLaunch(recorded.exec, stream));
  std::vector<float> ms;
  for (int r = 0; r < kReplays; ++r) {
    CHECK(cudaEventRecord(events.start, stream));
    CHECK(cudaGraphLaunch(recorded.exec, stream));
    CHECK(cudaEventRecord(events.stop, stream));
    ms.push_back(events.ms() / kLaunches);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// max |c - ref| / max |ref| after one launch of enqueue.
double rel_error(const Shape& s, const Buffers& b, cudaStream_t stream,
                 const std::function<void()>& enqueue) {
  CHECK(cudaMemsetAsync(b.c, 0xff, size_t(s.m) * s.n * sizeof(__half), stream));  // NaNs
  enqueue();
  CHECK(cudaMemsetAsync(b.err, 0, 2 * sizeof(unsigned), stream));
  max_error<<<264, 256, 0, stream>>>(b.c, b.ref, int64_t(s.m) * s.n, b.err);
  unsigned host[2];
  CHECK(cudaMemcpyAsync(host, b.err, sizeof(host), cudaMemcpyDeviceToHost, stream));
  CHECK(cudaStreamSynchronize(stream));
  float err, mag;
  std::memcpy(&err, &host[0], 4);
  std::memcpy(&mag, &host[1], 4);
  return err / mag;
}

template <int kVariant>
void run_variants(const Shape& s, const Buffers& b, int sm_count, cudaStream_t stream,
                  std::vector<std::pair<std::string, std::function<void()>>>& out) {
  if constexpr (kVariant <= kLastVariant && kVariant < fb::kGemmVariants) {
    static const char* const kNames[] = {
#define FTBERT_NAME(index, name, ...) name,
        FTBERT_GEMM_VARIANTS(FTBERT_NAME)
#undef FTBERT_NAME
    };
    auto fn = s.epilogue == 1 ? &fb::run_variant<kVariant, 1> : &fb::run_variant<kVariant, 0>;
    if (s.epilogue >= 2) {
      if constexpr (fb::epilogue_built(kVariant)) {
        fn = s.epilogue == 2 ? &fb::run_variant<kVariant, 2> : &fb::run_variant<kVariant, 3>;
      } else {
        run_variants<kVariant + 1>(s, b, sm_count, stream, out);
        return;
      }
    }
    if (fn(s.m, s.n, s.k, b.a, b.w, b.bias, b.c, sm_count, stream)) {
      out.emplace_back(std::string("cutlass ") + kNames[kVariant], [=, &s, &b] {
        fn(s.m, s.n, s.k, b.a, b.w, b.bias, b.c, sm_count, stream);
      });
    } else {
      std::printf("  %-34s cannot take the shape\n", kNames[kVariant]);
    }
    run_variants<kVariant + 1>(s, b, sm_count, stream, out);
  }
}

// `sustain` mode: enqueue's launches back to back for `seconds`, one line per half second with
// the time per launch and the wall clock (to read beside a clock and power log: whether a
// kernel's speed holds once the GPU is hot).
void sustain(const std::string& name, cudaStream_t stream, const std::function<void()>& enqueue,
             double seconds) {
  const Recorded recorded(stream, enqueue);
  const Events events;
  const auto t0 = std::chrono::steady_clock::now();
  for (double elapsed = 0; elapsed < seconds;) {
    int replays = 0;
    CHECK(cudaEventRecord(events.start, stream));
    const auto w0 = std::chrono::steady_clock::now();
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count() < 0.5) {
      for (int i = 0; i < 8; ++i) CHECK(cudaGraphLaunch(recorded.exec, stream));
      replays += 8;
      CHECK(cudaStreamSynchronize(stream));
    }
    CHECK(cudaEventRecord(events.stop, stream));
    const float ms = events.ms();
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto wall = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
    std::printf("sustain %-40s t %5.2f s  wall_ms %lld  %8.1f us per launch\n", name.c_str(),
                elapsed, static_cast<long long>(wall), ms * 1e3 / (replays * kLaunches));
    std::fflush(stdout);
  }
}

double g_sustain_seconds = 0;  // > 0: sustain mode (main)

void run_shape(const Shape& s, cublasHandle_t blas, cublasLtHandle_t lt, void* workspace,
               size_t workspace_bytes, int sm_count, cudaStream_t stream) {
  Buffers b{};
  CHECK(cudaMalloc(&b.a, size_t(s.m) * s.k * sizeof(__half)));
  CHECK(cudaMalloc(&b.w, size_t(s.k) * s.n * sizeof(__half)));
  CHECK(cudaMalloc(&b.bias, size_t(s.n) * sizeof(__half)));
  CHECK(cudaMalloc(&b.c, size_t(s.m) * s.n * sizeof(__half)));
  CHECK(cudaMalloc(&b.residual, size_t(s.m) * s.n * sizeof(__half)));
  fill<<<264, 256, 0, stream>>>(b.residual, int64_t(s.m) * s.n, 4, 2.0f);
  CHECK(cudaMalloc(&b.ref, size_t(s.m) * s.n * sizeof(float)));
  CHECK(cudaMalloc(&b.err, 2 * sizeof(unsigned)));
  fill<<<264, 256, 0, stream>>>(b.a, int64_t(s.m) * s.k, 1, 1.0f);
  fill<<<264, 256, 0, stream>>>(b.w, int64_t(s.k) * s.n, 2, 1.7f / std::sqrt(float(s.k)));
  fill<<<264, 256, 0, stream>>>(b.bias, s.n, 3, 0.5f);

  // Row-major c [m, n] = a · w is, column-major, cᵀ = wᵀ · aᵀ (cuda_backend.cu says more).
  const float one = 1.0f, zero = 0.0f;
  CHECK_BLAS(cublasSetStream(blas, stream));
  CHECK_BLAS(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, s.n, s.m, s.k, &one, b.w, CUDA_R_16F,
                          s.n, b.a, CUDA_R_16F, s.k, &zero, b.ref, CUDA_R_32F, s.n,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  if (s.epilogue) {
    bias_act_reference<<<528, 256, 0, stream>>>(b.ref, s.epilogue == 2 ? nullptr : b.bias,
                                                s.epilogue == 3, s.m, s.n,
                                                s.epilogue == 4 ? b.residual : nullptr,
                                                s.epilogue == 5);
  }
  CHECK(cudaGetLastError());

  std::vector<std::pair<std::string, std::function<void()>>> candidates;
  if (!s.epilogue) {
    candidates.emplace_back("cublasGemmEx (default)", [&] {
      CHECK_BLAS(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, s.n, s.m, s.k, &one, b.w,
                              CUDA_R_16F, s.n, b.a, CUDA_R_16F, s.k, &zero, b.c, CUDA_R_16F,
                              s.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    });
  }
  // cuBLASLt's heuristic candidates, with its own epilogues where the shape has one: its GELU is
  // the tanh form (not what a BERT checkpoint asks for; here to see what an epilogue of the
  // library's costs, its error against erf-GELU printed).
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t lw = nullptr, la = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  std::vector<cublasLtMatmulHeuristicResult_t> heur(8);
  int found = 0;
  {
    CHECK_BLAS(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasLtEpilogue_t kLtEpilogues[] = {
        CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_GELU_BIAS, CUBLASLT_EPILOGUE_GELU,
        CUBLASLT_EPILOGUE_RELU_BIAS, CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_BIAS};
    const cublasLtEpilogue_t epilogue = kLtEpilogues[s.epilogue];
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                              sizeof(epilogue)));
    if (s.epilogue == 1 || s.epilogue >= 3) {  // along cᵀ's rows: one per column of c
      CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b.bias,
                                                sizeof(b.bias)));
    }
    CHECK_BLAS(cublasLtMatrixLayoutCreate(&lw, CUDA_R_16F, s.n, s.k, s.n));
    CHECK_BLAS(cublasLtMatrixLayoutCreate(&la, CUDA_R_16F, s.k, s.m, s.k));
    CHECK_BLAS(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16F, s.n, s.m, s.n));
    CHECK_BLAS(cublasLtMatmulPreferenceCreate(&pref));
    CHECK_BLAS(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes, sizeof(workspace_bytes)));
    CHECK_BLAS(cublasLtMatmulAlgoGetHeuristic(lt, desc, lw, la, lc, lc, pref, int(heur.size()),
                                              heur.data(), &found));
    // With a residual: C = residual (beta = 1), D = c, both laid out as c.
    const float* beta = s.epilogue == 4 ? &one : &zero;
    const __half* source = s.epilogue == 4 ? b.residual : b.c;
    for (int i = 0; i < found; ++i) {
      const cublasLtMatmulAlgo_t* algo = &heur[i].algo;
      candidates.emplace_back("cublasLt heuristic #" + std::to_string(i), [&, algo, beta, source] {
        CHECK_BLAS(cublasLtMatmul(lt, desc, &one, b.w, lw, b.a, la, beta, source, lc, b.c, lc,
                                  algo, workspace, workspace_bytes, stream));
      });
    }
  }
  if (s.epilogue < 4) run_variants<kFirstVariant>(s, b, sm_count, stream, candidates);

  const double flop = 2.0 * s.m * s.n * s.k;
  static const char* const kEpilogues[] = {"plain", "bias + erf-GELU", "erf-GELU, no bias",
                                           "bias + ReLU", "bias + residual", "bias"};
  std::printf("%s %d x %d x %d (%s)\n", s.name, s.m, s.n, s.k, kEpilogues[s.epilogue]);
  for (auto& [name, enqueue] : candidates) {
    if (g_sustain_seconds > 0) {
      // The engine's FFN-in kernel and cuBLASLt's fastest at this shape (gemm-variants-h100.txt).
      if (name == "cutlass pingpong 128x128 c2x1" || name == "cublasLt heuristic #6") {
        // cuBLASLt's GELU epilogue is the tanh form, whatever this shape's epilogue says.
        const bool lt_gelu = name.rfind("cublasLt", 0) == 0 && (s.epilogue == 1 || s.epilogue == 2);
        const std::string epilogue = !lt_gelu          ? kEpilogues[s.epilogue]
                                     : s.epilogue == 1 ? "bias + GELU, tanh form"
                                                       : "GELU, tanh form, no bias";
        sustain(std::string(s.name) + " " + epilogue + " " + name, stream, enqueue,
                g_sustain_seconds);
      }
      continue;
    }
    const double err = rel_error(s, b, stream, enqueue);
    const double ms = time_ms(stream, enqueue);
    std::printf("  %-34s %8.1f us %6.0f TFLOP/s  rel err %.1e%s\n", name.c_str(), ms * 1e3,
                flop / ms * 1e-9, err, err < 1e-2 ? "" : "  WRONG");
  }
  std::fflush(stdout);
  if (desc) cublasLtMatmulDescDestroy(desc);
  for (auto l : {lw, la, lc})
    if (l) cublasLtMatrixLayoutDestroy(l);
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  for (void* p : {(void*)b.a, (void*)b.w, (void*)b.bias, (void*)b.c, (void*)b.residual,
                  (void*)b.ref, (void*)b.err})
    CHECK(cudaFree(p));
}

}  // namespace

int main(int argc, char** argv) {
  // BERT-base's four GEMMs at 16,384 rows (batch 32 x 512, 128 x 128) and 4,096 (32 x 128);
  // FFN-in both fused (what the engine runs there) and plain (against cuBLAS).
  std::vector<Shape> shapes;
  for (int m : {16384, 4096}) {
    shapes.push_back({"qkv", m, 2304, 768, 0});
    shapes.push_back({"attn-out", m, 768, 768, 0});
    shapes.push_back({"ffn-in", m, 3072, 768, 1});
    shapes.push_back({"ffn-in", m, 3072, 768, 2});
    shapes.push_back({"ffn-in", m, 3072, 768, 3});
    shapes.push_back({"ffn-in", m, 3072, 768, 0});
    shapes.push_back({"ffn-out", m, 768, 3072, 0});
  }
  // rows128: the layer's GEMMs at 128 and 256 rows (batch 1-2 x 128), where few tiles fill the GPU.
  if (argc > 1 && std::string(argv[1]) == "rows128") {
    shapes.clear();
    for (int m : {128, 256}) {
      shapes.push_back({"qkv", m, 2304, 768, 0});
      shapes.push_back({"attn-out", m, 768, 768, 0});
      shapes.push_back({"ffn-in", m, 3072, 768, 1});
      shapes.push_back({"ffn-out", m, 768, 3072, 0});
    }
  }
  // ffn-in: FFN-in alone, bias + erf-GELU, bias + ReLU and plain, at both row counts.
  if (argc > 1 && std::string(argv[1]) == "ffn-in") {
    shapes.clear();
    for (int m : {16384, 4096}) {
      for (int epilogue : {1, 3, 0}) shapes.push_back({"ffn-in", m, 3072, 768, epilogue});
    }
  }
  // residual: the output projections (attention output, FFN output) plain and with the bias and
  // the residual in cuBLASLt's epilogue, at 16,384, 8,192 and 4,096 rows; qkv-bias: QKV plain and
  // with its bias in cuBLASLt's epilogue (what taking the bias out of attention would cost it).
  if (argc > 1 && std::string(argv[1]) == "residual") {
    shapes.clear();
    for (int m : {16384, 8192, 4096}) {
      for (int epilogue : {0, 4}) {
        shapes.push_back({"attn-out", m, 768, 768, epilogue});
        shapes.push_back({"ffn-out", m, 768, 3072, epilogue});
      }
    }
  }
  if (argc > 1 && std::string(argv[1]) == "qkv-bias") {
    shapes.clear();
    for (int m : {16384, 4096, 128}) {
      for (int epilogue : {0, 5}) shapes.push_back({"qkv", m, 2304, 768, epilogue});
    }
  }
  if (argc > 1 && std::string(argv[1]) == "small") shapes = {{"odd", 333, 200, 72, 0},
                                                             {"odd", 333, 200, 72, 1}};
  // sustain [seconds]: FFN-in at 16,384 rows, plain, bias + ReLU and bias + erf-GELU, each
  // kernel run back to back for that long (default 4 s), for a clock and power log beside it.
  if (argc > 1 && std::string(argv[1]) == "sustain") {
    g_sustain_seconds = argc > 2 ? std::atof(argv[2]) : 4.0;
    shapes = {{"ffn-in", 16384, 3072, 768, 0}, {"ffn-in", 16384, 3072, 768, 3},
              {"ffn-in", 16384, 3072, 768, 1}};
  }
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasHandle_t blas;
  cublasLtHandle_t lt;
  CHECK_BLAS(cublasCreate(&blas));
  CHECK_BLAS(cublasLtCreate(&lt));
  size_t workspace_bytes = size_t{32} << 20;
  void* workspace;
  CHECK(cudaMalloc(&workspace, workspace_bytes));
  CHECK_BLAS(cublasSetWorkspace(blas, workspace, workspace_bytes));
  int device = 0, sm_count = 0;
  CHECK(cudaGetDevice(&device));
  CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  for (const Shape& s : shapes) run_shape(s, blas, lt, workspace, workspace_bytes, sm_count, stream);
  return 0;
}
