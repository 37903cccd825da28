// One tile of the CPU's fused attention kernel (cpp/cpu/kernels_impl.h, `attention`) on one thread,
// without the op's threading and layout work around it: the kernel's own rate, steadier than the
// whole op's on a machine whose two cores drift. Built against a checkout's cpp/ folder, so two
// builds compare two versions of the kernel:
//
//   g++ -O3 -std=gnu++17 -mavx2 -mfma -Icpp -Icpp/include -o /tmp/attention_tile
//       benchmarks/kernels/cpu_attention_tile.cpp    (one command)
//   /tmp/attention_tile QUERIES KEYS HEAD_DIM [WINDOW [FIRST_QUERY_POSITION]]
//
// The tile: QUERIES queries at positions FIRST_QUERY_POSITION.. against KEYS keys at 0..KEYS-1, of
// one head of a [KEYS, 3 x 12 heads x HEAD_DIM] qkv with biases; a window (0: none) as ModernBERT's
// local layers have. Prints the best of 7 rounds of 0.3 s: ms per tile and GFLOP/s counting full
// attention's two products, 4 x QUERIES x KEYS x HEAD_DIM (a window's rate says what it saved).
#define FTBERT_ISA_NS avx2
#define FTBERT_VBYTES 32
#include "cpu/kernels_impl.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

using namespace ftbert;

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s QUERIES KEYS HEAD_DIM [WINDOW [FIRST_QUERY_POSITION]]\n", argv[0]);
    return 2;
  }
  const int nq = std::atoi(argv[1]), nk = std::atoi(argv[2]), d = std::atoi(argv[3]);
  const int window = argc > 4 ? std::atoi(argv[4]) : 0, first = argc > 5 ? std::atoi(argv[5]) : 0;
  if (nq < 1 || nq > cpu::kAttentionQueries || nk < 1 || d < 1 || window < 0 || first < 0) {
    std::fprintf(stderr, "QUERIES must be in [1, %d], KEYS and HEAD_DIM at least 1, WINDOW and the "
                 "first position at least 0\n", cpu::kAttentionQueries);
    return 2;
  }
  const int heads = 12;
  const int64_t ld = int64_t{3} * heads * d;
  std::mt19937 gen(0);
  std::uniform_real_distribution<float> uniform(-0.5f, 0.5f);
  std::vector<float> qkv(static_cast<size_t>(nk + first + nq) * ld), bias(3 * d);
  for (float& x : qkv) x = uniform(gen);
  for (float& x : bias) x = 0.1f * uniform(gen);
  std::vector<float> out(static_cast<size_t>(nk + first + nq) * heads * d);
  std::vector<int32_t> query_rows(nq), key_rows(nk);
  for (int i = 0; i < nq; ++i) query_rows[i] = first + i;
  for (int j = 0; j < nk; ++j) key_rows[j] = j;
  // Scratch as cpp/cpu/attention_ops.cpp sizes it (attention_scratch_floats), with room to spare.
  std::vector<float> scratch(static_cast<size_t>(d + 64) * 256 * 4 + 4096);

  cpu::AttentionTile t{};
  t.q = qkv.data();
  t.k = qkv.data() + heads * d;
  t.v = qkv.data() + 2 * heads * d;
  t.ld = ld;
  t.q_bias = bias.data();
  t.k_bias = bias.data() + d;
  t.v_bias = bias.data() + 2 * d;
  t.query_rows = query_rows.data();
  t.key_rows = key_rows.data();
  t.n_queries = nq;
  t.n_keys = nk;
  t.head_dim = d;
  t.scale = 1.0f / std::sqrt(static_cast<float>(d));
  t.out = out.data();
  t.ldo = int64_t{heads} * d;
  t.window = window;
  t.query_pos = query_rows.data();  // rows are positions here
  t.key_pos = key_rows.data();

  const cpu::Kernels& kernels = cpu::avx2::table();
  double best = 0;
  for (int round = 0; round < 7; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    int64_t runs = 0;
    double seconds = 0;
    do {
      kernels.attention(t, scratch.data());
      ++runs;
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } while (seconds < 0.3);
    const double rate = 4.0 * nq * nk * d * runs / seconds / 1e9;
    if (rate > best) best = rate;
  }
  std::printf("queries %d from position %d, keys %d, head dim %d, window %d: %.4f ms per tile, %.1f "
              "GFLOP/s (full)\n", nq, first, nk, d, window, 4.0 * nq * nk * d / best / 1e6, best);
  return 0;
}
