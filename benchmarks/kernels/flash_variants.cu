// Kernel-level harness for the flash-attention tile configurations: builds every configuration
// listed below into one program, checks each against an fp32 reference attention on random data
// (with a ragged key mask, and with none) and times it at BERT shapes. For tuning on a GPU machine:
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icpp -Icpp/include \
//        --expt-relaxed-constexpr -o /tmp/flash_variants \
//        benchmarks/kernels/flash_variants.cu cpp/cuda/cuda_check.cu cpp/cuda/launch.cu &&
//        /tmp/flash_variants
//
// (`flash_variants profile` launches each configuration once at 32 x 512 tokens, for ncu;
// `flash_variants small` once at small odd shapes of head dims 64 and 128, for compute-sanitizer;
// `flash_variants d128` times the head-dim-128 shapes only; `flash_variants ws` the persistent
// head-dim-64 kernels against the launcher's choice at BERT shapes in both dtypes, with
// FLASH_B2B=1 also back to back, for A/B builds of one change.)
//
// Times: median of 100 launches between CUDA events, L2 flushed before each, after 10 warm-ups.
// TFLOP/s counts the two matrix products, 4 * B * heads * S * S * d.
#include "cuda/attention/flash.cu"
#include "cuda/attention/flash_sm90.cu"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

#include "harness_check.h"

namespace fc = ftbert::cuda;

namespace {

// One thread per (batch, head, query row): softmax(q·k * scale) v in fp32 from the rounded inputs.
template <typename T>
__global__ void reference_attention(const T* qkv, const T* bias, const int32_t* mask, float* out,
                                    int B, int S, int heads, int d, float scale) {
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= int64_t(B) * heads * S) return;
  const int s = idx % S, h = (idx / S) % heads, b = idx / (int64_t(S) * heads);
  const int H = heads * d;
  const T* row = qkv + (int64_t(b) * S + s) * 3 * H;
  float q[128], acc[128];
  for (int i = 0; i < d; ++i) {
    q[i] = float(row[h * d + i]) + float(bias[h * d + i]);
    acc[i] = 0.0f;
  }
  float mx = -INFINITY, sum = 0.0f;
  for (int j = 0; j < S; ++j) {
    if (!mask[int64_t(b) * S + j]) continue;
    const T* kr = qkv + (int64_t(b) * S + j) * 3 * H + H + h * d;
    float x = 0.0f;
    for (int i = 0; i < d; ++i) x += q[i] * (float(kr[i]) + float(bias[H + h * d + i]));
    x *= scale;
    const float m2 = fmaxf(mx, x);
    const float c = expf(mx - m2), p = expf(x - m2);
    sum = sum * c + p;
    const T* vr = kr + H;
    for (int i = 0; i < d; ++i) acc[i] = acc[i] * c + p * (float(vr[i]) + float(bias[2 * H + h * d + i]));
    mx = m2;
  }
  float* o = out + (int64_t(b) * S + s) * H + h * d;
  for (int i = 0; i < d; ++i) o[i] = sum > 0.0f ? acc[i] / sum : 0.0f;
}

template <typename T>
__global__ void to_float(const T* x, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * int64_t(blockDim.x))
    y[i] = float(x[i]);
}

struct Shape {
  const char* name;
  int B, S, heads, d;
};

template <typename T>
struct Bench {
  Shape sh;
  T *qkv, *bias, *out;
  int32_t *mask_ragged, *mask_ones;
  float *ref_ragged, *ref_ones, *outf;
  char* flush;
  int64_t n_out;
  float scale;
  bool profile_ragged = true;  // the mask of a profile-mode launch: ragged, or the timed all-ones
  bool b2b = false;            // also time back to back, and print bytes per second

  explicit Bench(Shape s) : sh(s) {
    const int H = s.heads * s.d;
    const int64_t n_qkv = int64_t(s.B) * s.S * 3 * H;
    n_out = int64_t(s.B) * s.S * H;
    scale = 1.0f / std::sqrt(float(s.d));
    std::mt19937 gen(1234 + s.S + s.d);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<T> h_qkv(n_qkv), h_bias(3 * H);
    for (auto& x : h_qkv) x = T(nd(gen));
    for (auto& x : h_bias) x = T(0.1f * nd(gen));
    std::vector<int32_t> h_ragged(int64_t(s.B) * s.S), h_ones(h_ragged.size(), 1);
    for (int b = 0; b < s.B; ++b) {  // alternate right and left padding; one empty row
      const int len = b == 1 ? 0 : 1 + int(gen() % s.S);
      for (int j = 0; j < s.S; ++j)
        h_ragged[int64_t(b) * s.S + j] = (b % 2 == 0) ? (j < len) : (j >= s.S - len);
    }
    CHECK(cudaMalloc(&qkv, n_qkv * sizeof(T)));
    CHECK(cudaMalloc(&bias, 3 * H * sizeof(T)));
    CHECK(cudaMalloc(&out, n_out * sizeof(T)));
    CHECK(cudaMalloc(&mask_ragged, h_ragged.size() * 4));
    CHECK(cudaMalloc(&mask_ones, h_ragged.size() * 4));
    CHECK(cudaMalloc(&ref_ragged, n_out * 4));
    CHECK(cudaMalloc(&ref_ones, n_out * 4));
    CHECK(cudaMalloc(&outf, n_out * 4));
    CHECK(cudaMalloc(&flush, 128 << 20));
    CHECK(cudaMemcpy(qkv, h_qkv.data(), n_qkv * sizeof(T), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(bias, h_bias.data(), 3 * H * sizeof(T), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(mask_ragged, h_ragged.data(), h_ragged.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(mask_ones, h_ones.data(), h_ones.size() * 4, cudaMemcpyHostToDevice));
    const int64_t rows = int64_t(s.B) * s.heads * s.S;
    reference_attention<T><<<(rows + 127) / 128, 128>>>(qkv, bias, mask_ragged, ref_ragged, s.B, s.S,
                                                        s.heads, s.d, scale);
    reference_attention<T><<<(rows + 127) / 128, 128>>>(qkv, bias, mask_ones, ref_ones, s.B, s.S,
                                                        s.heads, s.d, scale);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
  }
  ~Bench() {
    cudaFree(qkv), cudaFree(bias), cudaFree(out), cudaFree(mask_ragged), cudaFree(mask_ones);
    cudaFree(ref_ragged), cudaFree(ref_ones), cudaFree(outf), cudaFree(flush);
  }

  // max |out - ref| over all elements, after poisoning the output with NaN.
  float error(const std::function<void(const int32_t*)>& run, const int32_t* mask, const float* ref) {
    CHECK(cudaMemset(out, 0xff, n_out * sizeof(T)));
    run(mask);
    CHECK(cudaGetLastError());
    to_float<T><<<1024, 256>>>(out, outf, n_out);
    std::vector<float> a(n_out), r(n_out);
    CHECK(cudaMemcpy(a.data(), outf, n_out * 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(r.data(), ref, n_out * 4, cudaMemcpyDeviceToHost));
    float e = 0.0f;
    for (int64_t i = 0; i < n_out; ++i) {
      const float di = std::fabs(a[i] - r[i]);
      if (!(di <= e)) e = std::isnan(di) ? INFINITY : di;
    }
    return e;
  }

  // Back to back: `reps` launches between two events, per launch (no flush; launch costs hidden,
  // as in a CUDA graph, each kernel's ramp and tail not).
  float time_b2b_us(const std::function<void(const int32_t*)>& run) {
    for (int i = 0; i < 10; ++i) run(mask_ones);
    const int reps = 50;
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    std::vector<float> ms(5);
    for (float& m : ms) {
      CHECK(cudaEventRecord(e0));
      for (int i = 0; i < reps; ++i) run(mask_ones);
      CHECK(cudaEventRecord(e1));
      CHECK(cudaEventSynchronize(e1));
      CHECK(cudaEventElapsedTime(&m, e0, e1));
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    std::nth_element(ms.begin(), ms.begin() + 2, ms.end());
    return ms[2] * 1000.0f / reps;
  }

  float time_us(const std::function<void(const int32_t*)>& run) {
    for (int i = 0; i < 10; ++i) run(mask_ones);
    const int reps = 100;
    std::vector<cudaEvent_t> ev(2 * reps);
    for (auto& e : ev) CHECK(cudaEventCreate(&e));
    for (int i = 0; i < reps; ++i) {
      CHECK(cudaMemsetAsync(flush, i, 128 << 20));
      CHECK(cudaEventRecord(ev[2 * i]));
      run(mask_ones);
      CHECK(cudaEventRecord(ev[2 * i + 1]));
    }
    CHECK(cudaDeviceSynchronize());
    std::vector<float> ms(reps);
    for (int i = 0; i < reps; ++i) CHECK(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
    for (auto& e : ev) cudaEventDestroy(e);
    std::nth_element(ms.begin(), ms.begin() + reps / 2, ms.end());
    return ms[reps / 2] * 1000.0f;
  }

  template <typename C>
  void variant(const char* name, bool profile) {
    if (C::D != sh.d) return;
    fc::flash_detail::FlashParams p;
    p.qkv = qkv, p.bias = bias, p.out = out, p.seq = sh.S, p.heads = sh.heads;
    p.rows = sh.B * sh.S;
    p.cu_seqlens = nullptr;  // padded batches (the mask) here
    p.scale_log2 = scale * fc::flash_detail::kLog2e;
    auto run = [&](const int32_t* mask) {
      p.mask = mask;
      C::template launch<T>(p, sh.B);
    };
    if (profile) {  // one launch each, for compute-sanitizer (ragged mask) or a profiler (timed mask)
      run(profile_ragged ? mask_ragged : mask_ones);
      CHECK(cudaDeviceSynchronize());
      std::printf("profiled %s\n", name);
      return;
    }
    const float e_r = error(run, mask_ragged, ref_ragged);
    const float e_o = error(run, mask_ones, ref_ones);
    const float us = time_us(run);
    if (b2b) {
      const float bb = time_b2b_us(run);
      // bytes a memory-bound kernel moves: q, k, v read once, out written once
      const double gbs = (4.0 * sh.B * sh.S * sh.heads * sh.d * sizeof(T)) / (bb * 1e-6) / 1e9;
      std::printf("%-10s %-5s B%-3d S%-4d d%-3d %-28s err %.2e  flushed %7.1f us  b2b %7.1f us  %6.0f GB/s\n",
                  sh.name, std::is_same<T, __half>::value ? "fp16" : "bf16", sh.B, sh.S, sh.d,
                  name, e_r, us, bb, gbs);
      return;
    }
    const double tflops = 4.0 * sh.B * sh.heads * double(sh.S) * sh.S * sh.d / (us * 1e-6) / 1e12;
    std::printf("%-10s %-5s B%-2d S%-4d d%-3d %-28s err %.2e / %.2e  %8.1f us  %6.1f TFLOP/s\n",
                sh.name, sizeof(T) == 2 && std::is_same<T, __half>::value ? "fp16" : "bf16", sh.B,
                sh.S, sh.d, name, e_r, e_o, us, tflops);
  }
};

// The portable kernel (flash.cu): head dim, Br, Bc, warps, min blocks/SM, stages, Q in registers.
template <int D_, int Br, int Bc, int kWarps, int kMinBlocks, int kStages, bool kQRegs>
struct Portable {
  static constexpr int D = D_;
  template <typename T>
  static void launch(const fc::flash_detail::FlashParams& p, int batch) {
    fc::launch_flash<T, fc::FlashConfig<D, Br, Bc, kWarps, kMinBlocks, kStages, kQRegs>>(p, batch, 0, 0);
  }
};
// The Hopper kernel (flash_sm90.cu): head dim, warpgroups per block, Bc, min blocks/SM.
template <int D_, int kWarpgroups, int Bc, int kMinBlocks>
struct Hopper {
  static constexpr int D = D_;
  template <typename T>
  static void launch(const fc::flash_detail::FlashParams& p, int batch) {
    fc::launch_sm90<T, D, kWarpgroups, Bc, kMinBlocks>(p, batch, 0, 0);
  }
};

// The warp-specialized Hopper kernel: head dim, consumer warpgroups per block, Bc, ring stages,
// consumer registers (0: as compiled), turns, row sums through the tensor cores.
template <int D_, int kConsumers, int Bc, int kStages, int kConsumerRegs, bool kPingPong,
          bool kMmaRowSums = false>
struct HopperWs {
  static constexpr int D = D_;
  template <typename T>
  static void launch(const fc::flash_detail::FlashParams& p, int batch) {
    fc::launch_sm90_ws<T, D, kConsumers, Bc, kStages, kConsumerRegs, kPingPong, kMmaRowSums>(
        p, batch, 0, 0);
  }
};

// The kernel launch_flash_sm90 picks for the shape.
template <int D_>
struct Chosen {
  static constexpr int D = D_;
  template <typename T>
  static void launch(const fc::flash_detail::FlashParams& p, int batch) {
    fc::launch_flash_sm90<T>(p, batch, D, 0, 0);
  }
};

// Not attention: reads q, k and v once and writes out, 16 bytes a thread, for the memory floor.
template <typename T>
__global__ void copy_floor(const uint4* qkv, uint4* out, int64_t rows, int h_chunks) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * h_chunks;
       i += gridDim.x * int64_t(blockDim.x)) {
    const int64_t r = i / h_chunks, c = i % h_chunks;
    const uint4* src = qkv + r * 3 * h_chunks + c;
    uint4 a = src[0], b = src[h_chunks], d = src[2 * h_chunks];
    a.x ^= b.x ^ d.x, a.y ^= b.y ^ d.y, a.z ^= b.z ^ d.z, a.w ^= b.w ^ d.w;
    out[i] = a;
  }
}
template <int D_>
struct Copy {
  static constexpr int D = D_;
  template <typename T>
  static void launch(const fc::flash_detail::FlashParams& p, int batch) {
    (void)batch;
    const int h_chunks = p.heads * D * int(sizeof(T)) / 16;
    copy_floor<T><<<132 * 8, 256>>>(static_cast<const uint4*>(p.qkv), static_cast<uint4*>(p.out),
                                    p.rows, h_chunks);
  }
};

template <typename T>
void run_shape(Shape s, bool profile = false, bool ragged = true) {
  Bench<T> bench(s);
  bench.profile_ragged = ragged;
  bench.template variant<Portable<64, 128, 128, 4, 2, 2, false>>("d64 w128x128 q-smem", profile);
  bench.template variant<Portable<64, 128, 64, 4, 2, 2, true>>("d64 w128x64", profile);
  bench.template variant<Portable<64, 64, 64, 4, 3, 2, true>>("d64 n64x64", profile);
  bench.template variant<Hopper<64, 1, 128, 3>>("sm90 wg1 bc128 min3", profile);
  bench.template variant<Hopper<64, 1, 64, 4>>("sm90 wg1 bc64 min4", profile);
  bench.template variant<Hopper<64, 2, 64, 2>>("sm90 wg2 bc64 min2", profile);
  bench.template variant<HopperWs<64, 2, 128, 2, 0, false>>("sm90 ws c2 st2", profile);
  bench.template variant<HopperWs<64, 2, 128, 2, 0, true>>("sm90 ws c2 st2 pingpong", profile);
  bench.template variant<HopperWs<64, 3, 128, 3, 160, true>>("sm90 ws c3 st3 r160 pingpong",
                                                              profile);
  bench.template variant<HopperWs<64, 2, 128, 2, 0, true, true>>("sm90 ws c2 st2 pp mma-sums",
                                                                 profile);
  bench.template variant<HopperWs<64, 3, 128, 3, 160, true, true>>("sm90 ws c3 r160 pp mma-sums",
                                                                   profile);
  bench.template variant<Portable<32, 128, 64, 4, 3, 2, true>>("d32 w128x64", profile);
  bench.template variant<Portable<32, 64, 64, 4, 4, 2, true>>("d32 n64x64", profile);
  bench.template variant<Portable<128, 64, 64, 4, 2, 2, true>>("d128 n64x64", profile);
  bench.template variant<Hopper<128, 1, 64, 2>>("sm90 d128 wg1 bc64 min2", profile);
  bench.template variant<Hopper<128, 1, 128, 1>>("sm90 d128 wg1 bc128", profile);
  bench.template variant<Hopper<128, 2, 64, 1>>("sm90 d128 wg2 bc64", profile);
  bench.template variant<Hopper<128, 2, 128, 1>>("sm90 d128 wg2 bc128", profile);
  bench.template variant<HopperWs<128, 2, 128, 2, 240, true>>("sm90 d128 ws c2 st2 r240 pp",
                                                               profile);
  bench.template variant<HopperWs<128, 2, 128, 2, 240, false>>("sm90 d128 ws c2 st2 r240",
                                                                profile);
  bench.template variant<HopperWs<128, 2, 64, 3, 240, true>>("sm90 d128 ws c2 bc64 st3 r240 pp",
                                                              profile);
}

}  // namespace

int main(int argc, char** argv) {
  const Shape shapes[] = {
      {"bert-base", 32, 512, 12, 64}, {"bert-base", 32, 128, 12, 64}, {"bert-base", 1, 128, 12, 64},
      {"minilm", 32, 128, 12, 32},    {"odd", 3, 197, 12, 64},
      {"d128", 32, 512, 8, 128},      {"d128", 32, 128, 8, 128},    {"d128", 1, 128, 16, 128},
  };
  if (argc > 1 && std::string(argv[1]) == "profile") {  // 32 x 512 at d 64 and 128, as timed
    run_shape<__half>(shapes[0], true, false);
    run_shape<__half>({"d128", 32, 512, 8, 128}, true, false);
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "small") {  // small odd shapes, one launch each
    run_shape<__half>({"small", 3, 77, 2, 64}, true);
    run_shape<__half>({"many-items", 3, 300, 24, 64}, true);  // persistent blocks: 2 items each
    run_shape<__half>({"small", 3, 77, 2, 128}, true);
    run_shape<__half>({"many-items", 3, 300, 24, 128}, true);
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "scan") {  // short sequences by batch, d 64
    for (int S : {64, 128, 256}) {
      for (int B : {1, 8, 32, 64, 128}) {
        Bench<__half> bench({"scan", B, S, 12, 64});
        bench.b2b = true;
        bench.template variant<Chosen<64>>("launcher's choice", false);
        bench.template variant<Hopper<64, 1, 128, 3>>("sm90 wg1 bc128 min3", false);
        bench.template variant<HopperWs<64, 2, 128, 2, 0, true, true>>("sm90 ws c2 st2 pp mma-sums", false);
        bench.template variant<Copy<64>>("copy (memory floor)", false);
      }
    }
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "ws") {  // the persistent d64 kernels, both dtypes
    const bool b2b = std::getenv("FLASH_B2B") != nullptr;  // also back to back: inputs in L2
    auto run = [&](const Shape& s, auto dtype) {
      Bench<decltype(dtype)> bench(s);
      bench.b2b = b2b;
      bench.template variant<HopperWs<64, 2, 128, 2, 0, true, true>>("ws c2 st2 pp mma-sums", false);
      bench.template variant<HopperWs<64, 3, 128, 3, 160, true, true>>("ws c3 r160 pp mma-sums",
                                                                       false);
      bench.template variant<Hopper<64, 1, 128, 3>>("sm90 wg1 bc128 min3", false);
      bench.template variant<Chosen<64>>("launcher's choice", false);
    };
    for (const Shape& s : {Shape{"bert-base", 32, 512, 12, 64}, Shape{"bert-base", 32, 128, 12, 64},
                           Shape{"bert-base", 128, 128, 12, 64}, Shape{"odd", 3, 197, 12, 64}}) {
      run(s, __half{});
      run(s, __nv_bfloat16{});
    }
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "d128") {  // the head-dim-128 shapes only
    for (const Shape& s : shapes) {
      if (s.d == 128) run_shape<__half>(s);
    }
    run_shape<__nv_bfloat16>({"d128", 32, 512, 8, 128});
    return 0;
  }
  for (const Shape& s : shapes) run_shape<__half>(s);
  run_shape<__nv_bfloat16>(shapes[0]);
  run_shape<__nv_bfloat16>({"d128", 32, 512, 8, 128});
  return 0;
}
