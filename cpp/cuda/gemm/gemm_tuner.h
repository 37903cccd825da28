// The measured choice of a weight GEMM's kernel. Which kernel is fastest depends on the shape,
// the dtype and the GPU, and cuBLAS's own pick is measurably off at BERT's shapes: on an H100,
// BERT-base at 16,384 rows, float16, kernel times with model-like data: QKV cuBLAS 90.1 us, the
// best of cuBLASLt's heuristic candidates 77.5; attention output 30.6 / 27.5; FFN-in with its
// bias + erf-GELU epilogue, CUTLASS cooperative 128 x 256 tiles 150.5, ping-pong 128 x 128 143.6
// (while at 4,096 rows the cooperative one is the faster). So the CUDA backend times the
// candidates of a shape on its first use and keeps the fastest, for the whole process and every
// backend on the device: all sessions run the same kernels, so their outputs agree bit for bit.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/gemm/gemm_sm90.h"
#include "ftbert/backend.h"
#include "ftbert/config.h"
#include "ftbert/dtype.h"

namespace ftbert::cuda {

// Shapes of fewer rows keep the fixed choice: their GEMMs take a few microseconds, about what
// the candidates differ by, and there are many more of them (every packed token count). Measured
// from 1 row on an H100, BERT-base forwards from 1 x 32 to 8 x 32 tokens moved within 0.5%
// (benchmarks/results/levers-tried-h100.txt).
constexpr int kTunedMinRows = 512;

// The picks are shared by every row count of a bucket: packed batches have any token count, and
// one measurement per count would never end. Four buckets an octave (m rounded up to a multiple
// of an eighth of the power of two at or above it: ..., 5120, 6144, 7168, 8192, 10240, ...),
// since a pick can be off by 9% a third of an octave away: on an H100, BERT-base float16,
// forwards back to back with the picks measured at 6,144 rows (48 x 128) / 8,192 (64 x 128),
// 48 x 128 2.29 / 2.43 ms, 56 x 128 3.00 / 2.74, 64 x 128 3.26 / 3.01. With one bucket an octave
// (up to 8,192) whichever of them a process ran first set the others' picks.
int rows_bucket(int m);

// What a pick is made for.
struct GemmShapeKey {
  int device;
  DType dt;
  int rows_bucket;
  int n, k;
  Activation act;  // the epilogue: kIdentity (no bias) or act(a·W + bias)
  bool operator<(const GemmShapeKey& o) const;
};

// Which library's kernel a candidate runs: kCutlass the fused bias + erf-GELU GEMM, kCutlassPlain
// the plain one (gemm_sm90.h).
enum class GemmKernel { kCublas, kCublasLt, kCutlass, kCutlassPlain };

// A pick: the candidate's name (CudaBackend names them; for tests and reports) and what it runs,
// resolved once, so that running it compares no names. cuBLASLt's carry the algorithm (the
// heuristic's ranking differs from one row count to the next; the algorithm itself is kept),
// CUTLASS's their tiling.
struct GemmPick {
  std::string name;
  GemmKernel kernel = GemmKernel::kCublas;
  cublasLtMatmulAlgo_t algo{};             // kCublasLt
  GemmTiles tiles = GemmTiles::k128x256;  // kCutlass, kCutlassPlain
  size_t workspace = 0;                   // kCublasLt: the workspace bytes it runs with
};

// The process-wide picks. A stored pick never changes or goes away, so the pointers find returns
// stay valid for the life of the process (and the hot path copies nothing).
class GemmPicks {
 public:
  // The pick for `key`; nullptr when none was made yet.
  static const GemmPick* find(const GemmShapeKey& key);
  // Stores `pick` for `key` unless one is there already; returns the one kept.
  static const GemmPick& store(const GemmShapeKey& key, const GemmPick& pick);
  // Held while a shape's candidates are timed: one measurement at a time in the process, and
  // a second backend asking for the same shape meanwhile waits for the first's pick.
  static std::mutex& measuring();
};

// How fastest() runs a timed batch of one candidate: the way a forward runs it, captured once into
// a CUDA graph and replayed, so that what is timed is the candidate's cost in a forward, graph
// nodes and edges included. Some cuBLASLt algorithms clear part of their workspace before their
// kernel: back to back on a stream the memset costs little, but in a graph it is a node with an
// edge on each side (on an H100, BERT-base at 128 x 128 tokens: 36 such memsets per forward, a
// memset -> GEMM edge alone 2.7 us; the same algorithms run without them took 0.12 ms off a
// 6.3 ms forward). Timed on a stream, a memset-free twin ties with its original and either may be
// picked. `record` returns null where the backend cannot capture; the batch is then launched as
// it is.
struct BatchRecorder {
  std::function<std::unique_ptr<RecordedOps>(const std::function<void()>&)> record;
  std::function<void(const RecordedOps&)> replay;
};

// The index of the fastest of `candidates` on `stream`, each of which enqueues one run of the
// same GEMM and returns false, enqueuing nothing, when it cannot take the shape; -1 when none
// can. Each is run once to warm up, then timed in rounds of batches between CUDA events (the
// median round counts), each batch recorded by `recorder` where one is given. Waits for the
// stream.
int fastest(cudaStream_t stream, const std::vector<std::function<bool()>>& candidates,
            const BatchRecorder* recorder = nullptr);

}  // namespace ftbert::cuda
