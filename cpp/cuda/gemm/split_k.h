// dense_residual_layernorm's split of the reduction dimension. With few rows a GEMM has too few
// output tiles to keep the GPU busy (BERT-base's output projections at 128 rows: 24 tiles of
// 64 x 64 for 132 multiprocessors), and each tile walks the whole of k. Split k into `splits`
// slices, the GEMM runs as one strided-batched product per slice into fp32 partials (more tiles,
// each a slice long), and the LayerNorm that follows anyway sums them as it reads its row: the
// split's reduction costs no pass of its own, and the sum is rounded once, as an unsplit GEMM's.
// (What such GEMMs wait on is not their weights' reads from HBM: fetched into L2 a layer ahead,
// they ran no faster; benchmarks/results/levers-tried-h100.txt.)
#pragma once

#include <cstddef>
#include <cstdint>

namespace ftbert::cuda {

// Splits by output size (m * n) and k, measured on an H100 with BERT-base (n = 768): splitting
// pays below 512 rows and not from there on, so none is made there (docs/performance.md, "Kernel
// choices").
struct DenseSplitStep {
  int min_k;            // k at least this
  int64_t max_outputs;  // m * n at most this
  int splits;
};
constexpr DenseSplitStep kDenseSplitSteps[] = {{2048, 256 * 768, 4}, {512, 256 * 768, 2}};
// The LayerNorm that sums the partials issues every split's loads at once, up to this many.
constexpr int kDenseMaxSplits = 4;
constexpr bool dense_splits_within_max() {
  for (const DenseSplitStep& s : kDenseSplitSteps) {
    if (s.splits > kDenseMaxSplits) return false;
  }
  return true;
}
static_assert(dense_splits_within_max(), "a split step exceeds kDenseMaxSplits");
// A slice's k stays a multiple of 8, so every slice of a 16-byte aligned row starts aligned.
constexpr int kDenseSliceAlign = 8;

inline int dense_layernorm_splits(int m, int n, int k) {
  const int64_t outputs = static_cast<int64_t>(m) * n;
  int splits = 1;
  for (const DenseSplitStep& s : kDenseSplitSteps) {
    if (k >= s.min_k && outputs <= s.max_outputs) {
      splits = s.splits;
      break;
    }
  }
  while (splits > 1 && k % (kDenseSliceAlign * splits) != 0) --splits;
  return splits;
}

// fp32 partials of one split call.
inline size_t dense_layernorm_partials_bytes(int m, int n, int splits) {
  return static_cast<size_t>(splits) * m * n * sizeof(float);
}

// The most partials any m <= rows can need, whatever k.
inline size_t dense_layernorm_workspace_bytes(int rows, int n) {
  if (rows <= 0 || n <= 0) return 0;
  size_t most = 0;
  for (const DenseSplitStep& s : kDenseSplitSteps) {
    const int64_t m = s.max_outputs / n < rows ? s.max_outputs / n : rows;
    const size_t bytes = dense_layernorm_partials_bytes(static_cast<int>(m), n, s.splits);
    if (bytes > most) most = bytes;
  }
  return most;
}

}  // namespace ftbert::cuda
