// What other arithmetic costs the tensor cores on Hopper: one block per multiprocessor, warpgroup 0
// issuing wgmma (m64n128k16, float16 in, float32 accumulators in two tiles: the 128 registers a
// thread of a ping-pong GEMM consumer or an attention consumer holds), warpgroup 1 running one kind
// of instruction at a time. Each kind is timed alone and beside the wgmma stream; a kind that costs
// the tensor cores lengthens warpgroup 0's cycles. Why it matters here: the FFN-in GEMM's erf-GELU
// epilogue and the attention softmax are such code beside wgmma (cpp/cuda/gemm/gemm_sm90.cuh,
// cpp/cuda/attention/flash_sm90.cu). On a GPU machine:
//
//   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -Icpp -o /tmp/wgmma_overlap \
//        benchmarks/kernels/wgmma_overlap.cu && /tmp/wgmma_overlap
//
// The shared-memory operands are fixed small values (no swizzle; the products are not checked:
// only their issue rate matters). Times: median of 7 launches between CUDA events; cycles: clock64
// per warpgroup, averaged over the blocks.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/gemm/erf_gelu.cuh"

#define CHECK(x)                                                                  \
  do {                                                                            \
    const cudaError_t e_ = (x);                                                   \
    if (e_ != cudaSuccess) {                                                      \
      std::printf("%s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)

namespace {

#define ACC16(d)                                                                              \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),   \
      "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
      "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), \
      "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
      "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), \
      "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), \
      "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]),               \
      "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]),           \
      "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]),           \
      "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),           \
      "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]),           \
      "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
#define REGS64                                                                                 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "  \
  "%56, %57, %58, %59, %60, %61, %62, %63}"

// d += A·B, A [64 x 16] and B [16 x 128] from shared memory (descriptors).
__device__ __forceinline__ void wgmma(float (&d)[16][4], unsigned long long a,
                                      unsigned long long b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " REGS64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
      : ACC16(d)
      : "l"(a), "l"(b));
}

// A no-swizzle shared-memory descriptor: start address, leading and stride byte offsets.
__device__ unsigned long long descriptor(const void* p, int lead, int stride) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  return static_cast<unsigned long long>((a >> 4) & 0x3fff) |
         (static_cast<unsigned long long>((lead >> 4) & 0x3fff) << 16) |
         (static_cast<unsigned long long>((stride >> 4) & 0x3fff) << 32);
}

// Warpgroup 1's kinds of work; kGelu is the FFN-in epilogue's erf-GELU (erf_gelu.cuh): 8 FFMA,
// one MUFU.EX2 and one FMNMX an element.
enum Work { kNone, kFfma, kGelu, kIalu, kMufu, kHfma2, kFmnmx };
constexpr const char* kWorkNames[] = {"none", "FFMA", "erf-GELU", "IADD3/LOP3", "MUFU.EX2",
                                      "HFMA2", "FMNMX"};

// Warpgroup 1's instruction stream: 16 independent chains a thread, `iters` rounds.
__device__ float side_work(Work work, int iters) {
  float sink = 0.f;
  switch (work) {
    case kFfma: {
      float x[16];
      for (int i = 0; i < 16; ++i) x[i] = threadIdx.x * 1e-3f + i;
      const float m = 0.999f, c = 1e-4f * (threadIdx.x & 7);
      for (int it = 0; it < iters; ++it)
#pragma unroll
        for (int r = 0; r < 8; ++r)
#pragma unroll
          for (int i = 0; i < 16; ++i) x[i] = fmaf(x[i], m, c);
      for (int i = 0; i < 16; ++i) sink += x[i];
      break;
    }
    case kGelu: {
      float x[16];
      for (int i = 0; i < 16; ++i) x[i] = (threadIdx.x % 13) * 0.3f - 2.f + i * 0.1f;
      for (int it = 0; it < iters; ++it)
#pragma unroll
        for (int i = 0; i < 16; ++i) x[i] = ftbert::cuda::erf_gelu(x[i]) - 0.5f;
      for (int i = 0; i < 16; ++i) sink += x[i];
      break;
    }
    case kIalu: {
      unsigned u[16];
      for (int i = 0; i < 16; ++i) u[i] = threadIdx.x * 7 + i;
      const unsigned m = 0x9e3779b9u ^ threadIdx.x, c = 12345u + blockIdx.x;
      for (int it = 0; it < iters; ++it)
#pragma unroll
        for (int r = 0; r < 8; ++r)
#pragma unroll
          for (int i = 0; i < 16; ++i) u[i] = (u[i] ^ m) + c;
      for (int i = 0; i < 16; ++i) sink += static_cast<float>(u[i] & 7);
      break;
    }
    case kMufu: {
      float x[16];
      for (int i = 0; i < 16; ++i) x[i] = threadIdx.x * 1e-3f + i * 0.01f;
      for (int it = 0; it < iters; ++it)
#pragma unroll
        for (int r = 0; r < 8; ++r)
#pragma unroll
          for (int i = 0; i < 16; ++i) asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(x[i]) : "f"(-x[i]));
      for (int i = 0; i < 16; ++i) sink += x[i];
      break;
    }
    case kHfma2: {
      __half2 x[16];
      for (int i = 0; i < 16; ++i) x[i] = __floats2half2_rn(threadIdx.x * 1e-3f, i * 0.01f);
      const __half2 m = __floats2half2_rn(0.999f, 0.998f), c = __floats2half2_rn(1e-3f, 2e-3f);
      for (int it = 0; it < iters; ++it)
#pragma unroll
        for (int r = 0; r < 8; ++r)
#pragma unroll
          for (int i = 0; i < 16; ++i) x[i] = __hfma2(x[i], m, c);
      for (int i = 0; i < 16; ++i) sink += __low2float(x[i]) + __high2float(x[i]);
      break;
    }
    case kFmnmx: {
      float x[16];
      for (int i = 0; i < 16; ++i) x[i] = threadIdx.x * 1e-3f + i;
      const float lo = -1.f - threadIdx.x * 1e-3f, hi = 100.f + blockIdx.x;
      for (int it = 0; it < iters; ++it)
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
          for (int i = 0; i < 16; ++i) x[i] = fminf(fmaxf(x[i], lo), hi);
      for (int i = 0; i < 16; ++i) sink += x[i];
      break;
    }
    case kNone:
      break;
  }
  return sink;
}

__global__ void __launch_bounds__(256, 1)
    overlap(int mma_iters, Work work, int work_iters, float* out, long long* cycles) {
  extern __shared__ __align__(1024) unsigned char smem[];
  for (int i = threadIdx.x; i < 16384; i += blockDim.x) {
    reinterpret_cast<__half*>(smem)[i] = __float2half(((i * 37) % 17 - 8) * 0.01f);
  }
  __syncthreads();
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // visible to wgmma
  const int wg = threadIdx.x / 128;
  const long long t0 = clock64();
  float sink = 0.f;
  if (wg == 0 && mma_iters > 0) {
    float d0[16][4], d1[16][4];
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 4; ++j) d0[i][j] = d1[i][j] = 0.f;
    const unsigned long long a0 = descriptor(smem, 128, 256), a1 = descriptor(smem + 2048, 128, 256);
    const unsigned long long b = descriptor(smem + 8192, 128, 256);
    for (int it = 0; it < mma_iters; ++it) {
      asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        wgmma(d0, a0 + 2 * k, b + 8 * k);
        wgmma(d1, a1 + 2 * k, b + 8 * k);
      }
      asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 4; ++j) sink += d0[i][j] + d1[i][j];
  }
  if (wg == 1) sink += side_work(work, work_iters);
  const long long t1 = clock64();
  if (threadIdx.x % 128 == 0) cycles[blockIdx.x * 2 + wg] = t1 - t0;
  if (sink == 12345.f) out[threadIdx.x] = sink;  // keeps the work
}

}  // namespace

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  float* out = nullptr;
  long long* cycles = nullptr;
  CHECK(cudaMalloc(&out, 4096));
  CHECK(cudaMalloc(&cycles, sms * 2 * sizeof(long long)));
  const int smem = 200 * 1024;  // one block per multiprocessor
  CHECK(cudaFuncSetAttribute(overlap, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  const int kMmaIters = 4000;
  // Rounds of warpgroup 1's work: about a tenth to two thirds of the wgmma stream's time alone.
  const int rounds[] = {0, 1500, 6000, 1500, 400, 1500, 1500};
  std::printf("%-12s %16s %16s %16s %10s\n", "warpgroup 1", "wg1 alone (cyc)",
              "wgmma alone (cyc)", "both: wgmma (cyc)", "TFLOP/s");
  auto run = [&](int mma_iters, Work work, double* ms_out) {
    std::vector<float> ms;
    for (int r = 0; r < 7; ++r) {
      CHECK(cudaEventRecord(start));
      overlap<<<sms, 256, smem>>>(mma_iters, work, rounds[work], out, cycles);
      CHECK(cudaEventRecord(stop));
      CHECK(cudaEventSynchronize(stop));
      float t = 0;
      CHECK(cudaEventElapsedTime(&t, start, stop));
      ms.push_back(t);
    }
    CHECK(cudaGetLastError());
    std::sort(ms.begin(), ms.end());
    *ms_out = ms[ms.size() / 2];
    std::vector<long long> c(sms * 2);
    CHECK(cudaMemcpy(c.data(), cycles, c.size() * sizeof(long long), cudaMemcpyDeviceToHost));
    double w0 = 0, w1 = 0;
    for (int i = 0; i < sms; ++i) {
      w0 += c[2 * i];
      w1 += c[2 * i + 1];
    }
    return std::make_pair(w0 / sms, w1 / sms);
  };
  double ms = 0;
  const double mma_alone = run(kMmaIters, kNone, &ms).first;
  const double flops = double(sms) * kMmaIters * 8 * 64 * 128 * 16 * 2;
  std::printf("%-12s %16s %16.0f %16s %10.0f\n", "none", "-", mma_alone, "-", flops / ms / 1e9);
  for (int w = kFfma; w <= kFmnmx; ++w) {
    const double alone = run(0, Work(w), &ms).second;
    const auto both = run(kMmaIters, Work(w), &ms);
    std::printf("%-12s %16.0f %16.0f %16.0f %10.0f   (wg1 beside wgmma: %.0f cycles)\n",
                kWorkNames[w], alone, mma_alone, both.first, flops / ms / 1e9, both.second);
  }
  return 0;
}
