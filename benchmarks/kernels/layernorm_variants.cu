// Kernel-level harness for the residual LayerNorm (x = LN(x + bias + residual) · gamma + beta, in
// place) at BERT-base's rows: the engine's kernel against variants of its warp-per-row form and a
// copy floor (the same bytes moved, no statistics), each checked against the engine's output and
// timed two ways:
//   alone       20 launches back to back (inputs in L2), captured in a CUDA graph;
//   after GEMM  20 pairs of cuBLAS's GEMM that writes x (as the output projections do) and the
//               LayerNorm, minus the same graph without the LayerNorms: what a LayerNorm adds to
//               a forward's critical path.
// Times: the graph replayed 15 times between CUDA events after a warm-up, median replay / 20.
// On a GPU machine:
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icpp -Icpp/include \
//        -o /tmp/layernorm_variants benchmarks/kernels/layernorm_variants.cu \
//        cpp/cuda/launch.cu cpp/cuda/cuda_check.cu -lcublas && /tmp/layernorm_variants
#include "cuda/kernels/layernorm.cu"

#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "harness_check.h"

namespace fc = ftbert::cuda;
using half = __half;

namespace {

constexpr int kHidden = 768;
constexpr int kVec = 8;                          // 16-byte vectors of float16
constexpr int kChunks = kHidden / kVec / 32;     // vectors per lane: 3
constexpr float kEps = 1e-12f;

// R rows per warp, their loads all issued before the first reduction; W warps a block.
// kFlag: a non-finite output sets *nonfinite, as the forward asks of the engine's kernel.
template <int R, int W, bool kFlag = false>
__global__ void __launch_bounds__(32 * W)
    ln_rows_per_warp(half* x, const half* __restrict__ residual, const half* __restrict__ bias,
                     const half* __restrict__ gamma, const half* __restrict__ beta, int rows,
                     int32_t* nonfinite) {
  const int lane = threadIdx.x % 32;
  fc::Vec<half, kVec> b[kChunks], g[kChunks], e[kChunks];
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    b[j] = fc::load_vec<kVec>(bias + (lane + 32 * j) * kVec);
    g[j] = fc::load_vec<kVec>(gamma + (lane + 32 * j) * kVec);
    e[j] = fc::load_vec<kVec>(beta + (lane + 32 * j) * kVec);
  }
  fc::begin_dependent_kernel();
  const int first = (blockIdx.x * W + threadIdx.x / 32) * R;
  float v[R][kChunks][kVec];
  float sum[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    sum[r] = 0.0f;
    if (first + r >= rows) continue;
    const int64_t off = static_cast<int64_t>(first + r) * kHidden;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const auto a = fc::load_vec<kVec>(x + off + (lane + 32 * j) * kVec);
      const auto c = fc::load_vec<kVec>(residual + off + (lane + 32 * j) * kVec);
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        v[r][j][i] = fc::to_float(a.v[i]) + fc::to_float(b[j].v[i]) + fc::to_float(c.v[i]);
        sum[r] += v[r][j][i];
      }
    }
  }
  float mean[R], sq[R];
#pragma unroll
  for (int r = 0; r < R; ++r) mean[r] = fc::warp_sum(sum[r]) / kHidden;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    sq[r] = 0.0f;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const float d = v[r][j][i] - mean[r];
        sq[r] += d * d;
      }
    }
  }
  bool finite = true;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (first + r >= rows) continue;
    const float rstd = rsqrtf(fc::warp_sum(sq[r]) / kHidden + kEps);
    const int64_t off = static_cast<int64_t>(first + r) * kHidden;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      fc::Vec<half, kVec> y;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        y.v[i] = fc::from_float<half>((v[r][j][i] - mean[r]) * rstd * fc::to_float(g[j].v[i]) +
                                      fc::to_float(e[j].v[i]));
        if (kFlag) finite = finite && isfinite(fc::to_float(y.v[i]));
      }
      fc::store_vec<kVec>(x + off + (lane + 32 * j) * kVec, y);
    }
  }
  if (kFlag && !finite) *nonfinite = 1;
}

// The same bytes as the LayerNorm (x and residual read, x written), no statistics: x += residual.
__global__ void __launch_bounds__(128) copy_floor(half* x, const half* __restrict__ residual,
                                                  int rows) {
  fc::begin_dependent_kernel();
  const int row = blockIdx.x * 4 + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const int64_t off = static_cast<int64_t>(row) * kHidden;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    auto a = fc::load_vec<kVec>(x + off + (lane + 32 * j) * kVec);
    const auto c = fc::load_vec<kVec>(residual + off + (lane + 32 * j) * kVec);
#pragma unroll
    for (int i = 0; i < kVec; ++i) a.v[i] = __hadd(a.v[i], c.v[i]);
    fc::store_vec<kVec>(x + off + (lane + 32 * j) * kVec, a);
  }
}

struct Buffers {
  int rows, k;
  half *x, *x0, *residual, *bias, *gamma, *beta, *a, *w;
  int32_t* nonfinite;
};

template <int R, int W, bool kFlag = false>
void run_rows_per_warp(const Buffers& b, cudaStream_t s) {
  fc::launch(ln_rows_per_warp<R, W, kFlag>, fc::ceil_div(b.rows, R * W), 32 * W, 0, s, b.x,
             b.residual, b.bias, b.gamma, b.beta, b.rows, b.nonfinite);
}

float graph_us(cudaStream_t s, const std::function<void()>& body, int per_graph) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < per_graph; ++i) body();
  CHECK(cudaStreamEndCapture(s, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i) CHECK(cudaGraphLaunch(exec, s));
  std::vector<float> t;
  for (int i = 0; i < 15; ++i) {
    CHECK(cudaEventRecord(e0, s));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaEventRecord(e1, s));
    CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(ms * 1000.0f / per_graph);
  }
  std::sort(t.begin(), t.end());
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  return t[t.size() / 2];
}

half* upload(const std::vector<float>& v) {
  std::vector<half> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = __float2half(v[i]);
  half* d = nullptr;
  CHECK(cudaMalloc(&d, h.size() * sizeof(half)));
  CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(half), cudaMemcpyHostToDevice));
  return d;
}

std::vector<float> download(const half* d, size_t n) {
  std::vector<half> h(n);
  CHECK(cudaMemcpy(h.data(), d, n * sizeof(half), cudaMemcpyDeviceToHost));
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = __half2float(h[i]);
  return v;
}

void run_rows(int rows, int k, cublasHandle_t blas, cudaStream_t s, bool engine_only) {
  std::mt19937 gen(rows + k);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto random = [&](size_t n, float scale, float shift) {
    std::vector<float> v(n);
    for (auto& x : v) x = shift + scale * nd(gen);
    return v;
  };
  const size_t n = static_cast<size_t>(rows) * kHidden;
  Buffers b{rows, k};
  b.x0 = upload(random(n, 1.0f, 0.0f));
  b.residual = upload(random(n, 1.0f, 0.0f));
  b.bias = upload(random(kHidden, 0.1f, 0.0f));
  b.gamma = upload(random(kHidden, 0.1f, 1.0f));
  b.beta = upload(random(kHidden, 0.1f, 0.0f));
  b.a = upload(random(static_cast<size_t>(rows) * k, 1.0f, 0.0f));
  b.w = upload(random(static_cast<size_t>(k) * kHidden, 1.0f / std::sqrt(float(k)), 0.0f));
  CHECK(cudaMalloc(&b.x, n * sizeof(half)));
  CHECK(cudaMalloc(&b.nonfinite, sizeof(int32_t)));
  CHECK(cudaMemset(b.nonfinite, 0, sizeof(int32_t)));

  const std::vector<std::pair<const char*, std::function<void()>>> variants = {
      {"engine", [&] {
         fc::invoke_add_bias_residual_layernorm<half>(b.x, b.residual, b.bias, b.gamma, b.beta,
                                                      rows, kHidden, kEps, nullptr, s);
       }},
      {"engine + flag", [&] {
         fc::invoke_add_bias_residual_layernorm<half>(b.x, b.residual, b.bias, b.gamma, b.beta,
                                                      rows, kHidden, kEps, b.nonfinite, s);
       }},
      {"1 row/warp 4 warps", [&] { run_rows_per_warp<1, 4>(b, s); }},
      {"1 row/warp 4 w + flag", [&] { run_rows_per_warp<1, 4, true>(b, s); }},
      {"2 rows/warp 4 warps", [&] { run_rows_per_warp<2, 4>(b, s); }},
      {"2 rows/warp 2 warps", [&] { run_rows_per_warp<2, 2>(b, s); }},
      {"4 rows/warp 2 warps", [&] { run_rows_per_warp<4, 2>(b, s); }},
      {"1 row/warp 8 warps", [&] { run_rows_per_warp<1, 8>(b, s); }},
      {"copy floor", [&] {
         fc::launch(copy_floor, fc::ceil_div(rows, 4), 128, 0, s, b.x, b.residual, rows);
       }},
  };
  const __half one = __float2half(1.0f), zero = __float2half(0.0f);
  auto gemm = [&] {
    CHECK_BLAS(cublasHgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, kHidden, rows, k, &one, b.w, kHidden,
                           b.a, k, &zero, b.x, kHidden));
  };

  // Reference: the engine's output from x0.
  CHECK(cudaMemcpy(b.x, b.x0, n * sizeof(half), cudaMemcpyDeviceToDevice));
  variants[0].second();
  CHECK(cudaStreamSynchronize(s));
  const std::vector<float> want = download(b.x, n);

  std::printf("rows %d (GEMM k %d): us per LayerNorm\n", rows, k);
  std::printf("  %-22s %8s %8s %10s %10s\n", "variant", "alone", "TB/s", "after GEMM", "max diff");
  const float gemm_only = graph_us(s, gemm, 20);
  for (const auto& variant : variants) {
    if (engine_only && &variant - variants.data() > 1) break;
    const char* name = variant.first;
    const std::function<void()>& run = variant.second;
    CHECK(cudaMemcpy(b.x, b.x0, n * sizeof(half), cudaMemcpyDeviceToDevice));
    run();
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaGetLastError());
    const std::vector<float> got = download(b.x, n);
    double diff = 0;
    for (size_t i = 0; i < n; ++i) diff = std::max(diff, double(std::fabs(got[i] - want[i])));
    const float alone = graph_us(s, run, 20);
    const float after = graph_us(s, [&] { gemm(); run(); }, 20) - gemm_only;
    const double tbs = 3.0 * n * sizeof(half) / (alone * 1e-6) / 1e12;
    std::printf("  %-22s %8.2f %8.2f %10.2f %10.2e\n", name, alone, tbs, after, diff);
  }
  std::printf("  (GEMM alone %.2f us)\n", gemm_only);
  for (half* p : {b.x, b.x0, b.residual, b.bias, b.gamma, b.beta, b.a, b.w}) CHECK(cudaFree(p));
  CHECK(cudaFree(b.nonfinite));
}

// Few rows (batch 1 to 16 x 128), where the engine's kernel is picked by row count: its residual
// LayerNorm from the GEMM's output, and from a k-split GEMM's fp32 partials (2 and 4 splits, as the
// output projections at up to 256 rows), us per LayerNorm back to back. Builds that move
// kWarpMinRows compare the block and warp-per-row kernels here.
void run_small(cudaStream_t s) {
  std::mt19937 gen(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int rows : {128, 256, 1024, 2048}) {
    const size_t n = static_cast<size_t>(rows) * kHidden;
    std::vector<float> host(4 * n);
    for (auto& x : host) x = nd(gen);
    half *x = upload(std::vector<float>(host.begin(), host.begin() + n));
    half *residual = upload(std::vector<float>(host.begin() + n, host.begin() + 2 * n));
    std::vector<float> w(kHidden);
    for (auto& v : w) v = 1.0f + 0.1f * nd(gen);
    half *bias = upload(w), *gamma = upload(w), *beta = upload(w);
    float* partials = nullptr;
    CHECK(cudaMalloc(&partials, 4 * n * sizeof(float)));
    CHECK(cudaMemcpy(partials, host.data(), 4 * n * sizeof(float), cudaMemcpyHostToDevice));
    half* out = nullptr;
    CHECK(cudaMalloc(&out, n * sizeof(half)));
    const float dense = graph_us(s, [&] {
      fc::invoke_add_bias_residual_layernorm<half>(x, residual, bias, gamma, beta, rows, kHidden,
                                                   kEps, nullptr, s);
    }, 20);
    float split[2];
    for (int i = 0; i < 2; ++i) {
      split[i] = graph_us(s, [&] {
        fc::invoke_partials_residual_layernorm<half>(partials, 2 + 2 * i, residual, bias, gamma,
                                                     beta, out, rows, kHidden, kEps, nullptr, s);
      }, 20);
    }
    CHECK(cudaGetLastError());
    std::printf("rows %5d: us per LayerNorm  dense %6.2f   2 splits %6.2f   4 splits %6.2f\n", rows,
                dense, split[0], split[1]);
    for (half* p : {x, residual, bias, gamma, beta, out}) CHECK(cudaFree(p));
    CHECK(cudaFree(partials));
  }
}

}  // namespace

// `layernorm_variants small` times the engine's kernel at 128 to 2,048 rows (run_small above);
// `layernorm_variants engine` times the engine's kernel only (without and with the flag), for
// A/B builds of one change to it.
int main(int argc, char** argv) {
  const bool engine_only = argc > 1 && std::string(argv[1]) == "engine";
  if (argc > 1 && std::string(argv[1]) == "small") {
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    run_small(s);
    return 0;
  }
  cublasHandle_t blas;
  CHECK_BLAS(cublasCreate(&blas));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK_BLAS(cublasSetStream(blas, s));
  for (int rows : {4096, 16384}) {
    run_rows(rows, 768, blas, s, engine_only);   // attention output
    run_rows(rows, 3072, blas, s, engine_only);  // FFN output
  }
  CHECK_BLAS(cublasDestroy(blas));
  return 0;
}
