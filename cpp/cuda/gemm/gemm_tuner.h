// The measured choice of a weight GEMM's kernel. Which kernel is fastest depends on the shape,
// the dtype and the GPU, and cuBLAS's own pick is measurably off at BERT's shapes
// (docs/performance.md, "Kernel choices"). So the CUDA backend times the candidates of a shape
// and keeps the fastest, for the whole process and every backend on the device (all sessions run
// the same kernels, so their outputs agree bit for bit), and in a cache file for later processes. The timing runs off the request path, on a thread and stream of its
// own: a forward that meets a shape not measured yet runs the fixed rule at once and a later
// forward runs the pick.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <mutex>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/gemm/gemm_sm90.h"
#include "ftbert/backend.h"
#include "ftbert/config.h"
#include "ftbert/dtype.h"

namespace ftbert::cuda {

// Shapes of fewer rows keep the fixed choice: their GEMMs take a few microseconds, about what
// the candidates differ by, and there are many more of them (every packed token count); measuring
// them gained nothing (docs/performance.md, "Kernel choices").
constexpr int kTunedMinRows = 512;

// The picks are shared by every row count of a bucket: packed batches have any token count, and
// one measurement per count would never end. Four buckets an octave (m rounded up to a multiple
// of an eighth of the power of two at or above it: ..., 5120, 6144, 7168, 8192, 10240, ...),
// since a pick measured a third of an octave away can be off by several percent; with one bucket
// an octave, whichever size a process ran first set the others' picks (docs/performance.md,
// "Kernel choices").
int rows_bucket(int m);

// What a pick is made for.
struct GemmShapeKey {
  int device;
  DType dt;
  int rows_bucket;
  int n, k;
  Activation act;  // the epilogue: kIdentity (no bias) or act(a·W + bias)
  // A batch-invariant forward's pick: only kernels whose bits equal the invariant reference's
  // (CudaBackend::invariant_gemm_pick) at every row count are candidates; every bucket is tuned.
  bool invariant = false;
  // Quantization "fp8": e4m3 operands with per-row and per-channel scales (fp8_gemm.cu), whose
  // candidates are cuBLASLt's FP8 algorithms.
  bool fp8 = false;
  bool operator<(const GemmShapeKey& o) const;
};

// Which library's kernel a candidate runs: kCutlass the fused bias + erf-GELU GEMM, kCutlassPlain
// the plain one (gemm_sm90.h), kCublasLtFp8 a cuBLASLt algorithm on e4m3 operands (fp8 keys only).
enum class GemmKernel { kCublas, kCublasLt, kCutlass, kCutlassPlain, kCublasLtFp8 };

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

// The process-wide picks, in three stages: requested (a forward met the shape untuned and ran the
// fixed rule), staged (measured, waiting), published (what find() returns). Staged picks are
// published only while no forward of their device is being enqueued (forward_begins ..
// forward_ends), so forwards that overlap in time always run the same kernels. A published pick
// never changes or goes away, so the pointers find returns stay valid for the life of the process
// (and the hot path copies nothing).
class GemmPicks {
 public:
  // The pick for `key`; nullptr when none is published yet.
  static const GemmPick* find(const GemmShapeKey& key);

  // A forward of `device` starts enqueuing ops; returns the picks' generation, which changes
  // whenever a pick is published for a shape that forwards ran by the rule before (recordings of
  // an older generation hold the rule's kernels there).
  static uint64_t forward_begins(int device);
  // ... and is done enqueuing: the last one out publishes what was staged meanwhile.
  static void forward_ends(int device);

  // Asks the tuner to measure `key` (once; later calls do nothing) off the caller's path; the
  // caller runs the fixed rule meanwhile.
  static void request(const GemmShapeKey& key);
  // Measures `key` (if it was not) and waits until its pick is published; for the inline tuning
  // mode (gemm_tuning_inline()), where a forward waits for its picks instead of running the rule.
  // nullptr where the shape could not be measured (the caller runs the rule) or the tuner stopped.
  static const GemmPick* measure_and_wait(const GemmShapeKey& key);
  // Waits until every shape of `device` requested so far is measured and published.
  static void wait_idle(int device);

  // Picks read from the cache file, staged as measured ones are (and not written back).
  static void stage_loaded(const GemmShapeKey& key, const GemmPick& pick);
  // Claims the one load of `device`'s cache file in this process: true for the first caller.
  static bool claim_load(int device);

  // For tests and reports.
  struct Counters {
    int64_t measured = 0;   // shapes the tuner timed
    int64_t on_caller = 0;  // timings run on a thread other than the tuner's (0 by design)
    int64_t loaded = 0;     // picks taken from the cache file
    int64_t cache_writes = 0;
  };
  static Counters counters();
};

// Whether forwards wait for the measurement of a shape they meet untuned (FTBERT_GEMM_TUNING=
// inline: deterministic from the first forward, at its cost) instead of running the fixed rule
// while the tuner measures it in the background (the default).
bool gemm_tuning_inline();

// The cache file of measured picks for the GPU a backend runs on (pick_store.h): where it lives
// and what its entries are valid for (GPU, driver, CUDA, cuBLASLt and CUTLASS versions).
struct GemmCacheFile {
  std::string path;      // "" when no cache folder can be named: nothing is persisted
  std::string identity;
};
// A pick and its key as the cache file's text; parse_* return false on anything malformed.
std::string gemm_key_text(const GemmShapeKey& key);
std::string gemm_pick_text(const GemmPick& pick);
bool parse_gemm_key(const std::string& text, int device, GemmShapeKey* key);
bool parse_gemm_pick(const std::string& text, GemmPick* pick);

// Measures `key` on the tuner's thread (weight_gemm.cu: on a backend of the tuner's own, with
// buffers of its own) and says which cache file the pick goes to.
GemmPick measure_gemm_shape(const GemmShapeKey& key, GemmCacheFile* cache);

// The time per run (ms) of each of `candidates` on `stream`, each of which enqueues one run of the
// same GEMM and returns false, enqueuing nothing, when it cannot take the shape (its time is then
// infinity). Each is run once to warm up, then timed in rounds of batches between CUDA events
// (the median round counts). Waits for the stream. Counted in GemmPicks::counters().on_caller
// unless it runs on the tuner's thread.
std::vector<float> time_candidates(cudaStream_t stream,
                                   const std::vector<std::function<bool()>>& candidates);

// A measured candidate replaces the fixed rule's kernel only when it is at least this much faster
// in the same measurement: candidates within noise of each other keep the rule, so that "auto"
// never runs a kernel that was not clearly faster when measured.
constexpr float kRuleMargin = 0.03f;

// What a GEMM launched programmatically (CUTLASS's, launch.cuh) saves in a recorded forward over
// one behind a full edge (cuBLAS's): it is scheduled while the kernel before it finishes. Timed
// back to back the two classes look alike, so the tuner credits the first with this (ms); it
// decides between GEMMs of a few microseconds and is noise beyond (docs/performance.md).
constexpr float kProgrammaticEdgeMs = 0.002f;

}  // namespace ftbert::cuda
