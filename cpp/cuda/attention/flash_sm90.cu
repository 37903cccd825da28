// Fused attention for Hopper (sm_90a): the algorithm, inputs and outputs of flash.cu's kernel,
// with both matrix products on warpgroup MMA (wgmma) instead of mma.sync. Head dims 64 (BERT-base
// and BERT-large) and 128; flash.cu's kernel covers the other head dims and other GPUs.
//
// Two kernels run that algorithm (launch_flash_sm90 picks by grid size): one where every block
// copies its own tiles with cp.async (a block is 1-2 warpgroups, several blocks per
// multiprocessor), and a persistent warp-specialized one where a producer warp loads tiles with
// TMA for consumer warpgroups that take turns at the tensor cores. This file is the dispatch; the
// parts, one translation unit (built for sm_90a alone, cpp/cuda/CMakeLists.txt):
//   flash_sm90_wgmma.cuh    the wgmma primitives and the device helpers both kernels share, and
//                           what changes against flash.cu's kernel
//   flash_sm90_cpasync.cuh  the cp.async kernel and its launcher
//   flash_sm90_ws.cuh       the warp-specialized kernel and its launcher
#include "cuda/attention/flash_sm90.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/attention/flash_common.cuh"
#include "cuda/attention/flash_sm90_cpasync.cuh"
#include "cuda/attention/flash_sm90_ws.cuh"
#include "ftbert/check.h"

namespace ftbert::cuda {

// The kernel by head dim and shape, from benchmarks/kernels/flash_variants.cu on an H100 (L2
// flushed, medians of 100, float16). Head dim 64, one run (32 x 512 / 32 x 128 / 1 x 128 / 3 x 197
// tokens, 12 heads, us):
//   one warpgroup per block, 128-key tiles, 3 blocks per SM   94.8  18.9  8.0  10.8
//   persistent, 2 consumers taking turns, 2-stage ring         92.4  18.0  8.9  12.1
//     (the same without turns                                  92.4  18.2  8.9  12.3)
//     (the same with row sums through the tensor cores         90.4  18.1  8.8  12.1)
//   persistent, 3 consumers of 160 registers taking turns,     87.5  19.7  9.6  13.6
//     3-stage ring
//     (the same with row sums through the tensor cores         84.8  20.4 10.1  14.2)
// The persistent kernels run with the row sums through the tensor cores (WsTile's kMmaRowSums).
// The persistent kernels win once there are two work items per multiprocessor; three consumers
// (192 query rows an item) only on long sequences, where an item's rows are mostly used. Below
// that grid the one-warpgroup kernel's several independent blocks per multiprocessor win, and so
// they do at any grid when sequences are at most 64 long, where a 128-row item is half padding
// (flash_variants scan, back to back, us: S = 64, batch 32 / 64 / 128: persistent 13.5 / 24.0 /
// 51.7, one-warpgroup 7.1 / 11.8 / 27.1; at S = 128 the persistent kernel from batch 64: 25.0
// against 27.6, 43.0 against 50.4 at 128).
// Head dim 128, one run (32 x 512 / 32 x 128 tokens with 8 heads, 1 x 128 with 16, us):
//   persistent, 2 consumers of 240 registers taking turns, 2-stage ring   90.0  22.5  11.1
//     (the same with 64-key tiles and a 3-stage ring                      110.6  22.5  11.1)
//   one warpgroup per block, 64-key tiles, 2 blocks per SM                129.1  24.3  10.5
//   one warpgroup per block, 128-key tiles (1 block per SM: 144 KiB)      175.3  32.6   9.8
//   two warpgroups per block, 128-key tiles                               122.3  24.2  10.6
//   (flash.cu's kernel                                                    164.1  27.6   9.9)
// Twice the head dim is twice the products per exponential, so the persistent kernel already wins
// from about one work item per multiprocessor (32 x 128: 256 items for 132); on smaller grids the
// one-warpgroup kernel, with 128-key tiles while its blocks fit one wave.
template <typename T>
void launch_flash_sm90(const FlashParams& p, int batch, int head_dim, int device,
                       cudaStream_t stream, bool batch_invariant) {
  // A relative position bias (MPNet) or a sliding window (ModernBERT's local layers), not both
  // (flash.cu keeps such calls): the one-warpgroup kernel, which adds the bias and masks the
  // scores outside a row's window from the rows' and keys' positions, and visits only the key
  // tiles within the block's rows' windows (the persistent kernels take neither). It is also the
  // batch-invariant one.
  FTBERT_CHECK(p.relative_bias == nullptr || p.window == 0,
               "flash attention (Hopper): a relative position bias and a window together");
  FTBERT_CHECK(head_dim == 64 || head_dim == 128, "flash attention (Hopper): head dim " << head_dim);
  if (p.relative_bias != nullptr) {
    if (head_dim == 128) {
      launch_sm90<T, 128, 1, 64, 2, true, false>(p, batch, device, stream);
    } else {
      launch_sm90<T, 64, 1, 128, 3, true, false>(p, batch, device, stream);
    }
    return;
  }
  if (p.window > 0) {
    if (head_dim == 128) {
      launch_sm90<T, 128, 1, 64, 2, false, true>(p, batch, device, stream);
    } else {
      launch_sm90<T, 64, 1, 128, 3, false, true>(p, batch, device, stream);
    }
    return;
  }
  const int64_t sms = multiprocessor_count(device);
  const auto items = [&](int rows) {
    return static_cast<int64_t>((p.seq + rows - 1) / rows) * p.heads * batch;
  };
  // Batch-invariant: the one-warpgroup kernel at every grid (128-key tiles at head dim 64, 64-key
  // at 128), so each row's keys are summed in the same tiles whatever the batch; the persistent
  // kernels sum a row's terms differently (through the tensor cores).
  if (batch_invariant) {
    if (head_dim == 128) {
      launch_sm90<T, 128, 1, 64, 2>(p, batch, device, stream);
    } else {
      FTBERT_CHECK(head_dim == 64, "flash attention (Hopper): head dim " << head_dim);
      launch_sm90<T, 64, 1, 128, 3>(p, batch, device, stream);
    }
    return;
  }
  if (head_dim == 128) {
    if (items(128) >= sms && items(128) <= INT32_MAX) {
      launch_sm90_ws<T, 128, 2, 128, 2, 240, true>(p, batch, device, stream);
    } else if (items(64) <= sms) {
      launch_sm90<T, 128, 1, 128, 1>(p, batch, device, stream);
    } else {
      launch_sm90<T, 128, 1, 64, 2>(p, batch, device, stream);
    }
    return;
  }
  FTBERT_CHECK(head_dim == 64, "flash attention (Hopper): head dim " << head_dim);
  if (p.seq >= 384 && items(192) >= 2 * sms && items(192) <= INT32_MAX) {
    launch_sm90_ws<T, 64, 3, 128, 3, 160, true, true>(p, batch, device, stream);
  } else if (p.seq > 64 && items(128) >= 2 * sms && items(128) <= INT32_MAX) {
    launch_sm90_ws<T, 64, 2, 128, 2, 0, true, true>(p, batch, device, stream);
  } else {
    launch_sm90<T, 64, 1, 128, 3>(p, batch, device, stream);
  }
}
template void launch_flash_sm90<__half>(const FlashParams&, int, int, int, cudaStream_t, bool);
template void launch_flash_sm90<__nv_bfloat16>(const FlashParams&, int, int, int, cudaStream_t,
                                               bool);

}  // namespace ftbert::cuda
