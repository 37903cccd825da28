#include "cuda/gemm/gemm_tuner.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <tuple>

#include "cuda/cuda_check.h"

namespace ftbert::cuda {

int rows_bucket(int m) {
  int64_t octave_top = 1;  // the power of two at or above m
  while (octave_top < m) octave_top <<= 1;
  const int64_t step = octave_top >= 8 ? octave_top / 8 : 1;  // (top/2, top] in 4 steps of top/8
  const int64_t bucket = (m + step - 1) / step * step;
  return static_cast<int>(std::min<int64_t>(bucket, std::numeric_limits<int>::max()));
}

bool GemmShapeKey::operator<(const GemmShapeKey& o) const {
  return std::tie(device, dt, rows_bucket, n, k, act) <
         std::tie(o.device, o.dt, o.rows_bucket, o.n, o.k, o.act);
}

namespace {
std::mutex picks_mutex;
std::map<GemmShapeKey, GemmPick>& picks() {
  static auto* map = new std::map<GemmShapeKey, GemmPick>();  // outlives every backend
  return *map;
}
}  // namespace

const GemmPick* GemmPicks::find(const GemmShapeKey& key) {
  std::lock_guard<std::mutex> lock(picks_mutex);
  const auto it = picks().find(key);
  return it == picks().end() ? nullptr : &it->second;  // map nodes do not move
}

const GemmPick& GemmPicks::store(const GemmShapeKey& key, const GemmPick& pick) {
  std::lock_guard<std::mutex> lock(picks_mutex);
  return picks().emplace(key, pick).first->second;  // the first stored stays: others may read it
}

std::mutex& GemmPicks::measuring() {
  static std::mutex m;
  return m;
}

namespace {
// Events destroyed on every way out.
struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    FTBERT_CUDA_CHECK(cudaEventCreate(&start));
    FTBERT_CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~EventPair() {
    (void)cudaEventDestroy(start);
    (void)cudaEventDestroy(stop);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
};
}  // namespace

int fastest(cudaStream_t stream, const std::vector<std::function<bool()>>& candidates,
            const BatchRecorder* recorder) {
  // Each timed batch runs long enough (~kBatchMs) that event and launch overheads do not decide
  // between GEMMs of a few microseconds; rounds of batches, every candidate once a round, so a
  // clock or load change during the measurement touches them all alike; the median round counts.
  constexpr int kRounds = 5;
  constexpr float kBatchMs = 0.2f;
  constexpr int kMaxRunsPerBatch = 64;
  const int n = static_cast<int>(candidates.size());
  std::vector<bool> usable(n);
  for (int i = 0; i < n; ++i) usable[i] = candidates[i]();  // warm-up (loads kernels), who can run
  std::vector<int> runs(n, 1);
  {  // one run each, timed, sizes the batches
    std::vector<EventPair> once(n);
    for (int i = 0; i < n; ++i) {
      if (!usable[i]) continue;
      FTBERT_CUDA_CHECK(cudaEventRecord(once[i].start, stream));
      candidates[i]();
      FTBERT_CUDA_CHECK(cudaEventRecord(once[i].stop, stream));
    }
    FTBERT_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (int i = 0; i < n; ++i) {
      if (!usable[i]) continue;
      float ms = 0.0f;
      FTBERT_CUDA_CHECK(cudaEventElapsedTime(&ms, once[i].start, once[i].stop));
      runs[i] = std::clamp(static_cast<int>(kBatchMs / std::max(ms, 1e-4f)) + 1, 1,
                           kMaxRunsPerBatch);
    }
  }
  // Each candidate's batch, recorded once where the recorder can (the runs' results are not
  // looked at: a candidate that could run once runs the same way every time).
  std::vector<std::unique_ptr<RecordedOps>> batches(n);
  for (int i = 0; i < n; ++i) {
    if (!usable[i] || recorder == nullptr) continue;
    batches[i] = recorder->record([&] {
      for (int j = 0; j < runs[i]; ++j) candidates[i]();
    });
  }
  std::vector<EventPair> events(static_cast<size_t>(n) * kRounds);
  for (int r = 0; r < kRounds; ++r) {
    for (int i = 0; i < n; ++i) {
      if (!usable[i]) continue;
      const EventPair& e = events[static_cast<size_t>(r) * n + i];
      FTBERT_CUDA_CHECK(cudaEventRecord(e.start, stream));
      if (batches[i]) {
        recorder->replay(*batches[i]);
      } else {
        for (int j = 0; j < runs[i]; ++j) candidates[i]();
      }
      FTBERT_CUDA_CHECK(cudaEventRecord(e.stop, stream));
    }
  }
  FTBERT_CUDA_CHECK(cudaStreamSynchronize(stream));
  int best = -1;
  float best_ms = std::numeric_limits<float>::infinity();
  for (int i = 0; i < n; ++i) {
    if (!usable[i]) continue;
    std::vector<float> per_run(kRounds);
    for (int r = 0; r < kRounds; ++r) {
      const EventPair& e = events[static_cast<size_t>(r) * n + i];
      FTBERT_CUDA_CHECK(cudaEventElapsedTime(&per_run[r], e.start, e.stop));
      per_run[r] /= static_cast<float>(runs[i]);
    }
    std::nth_element(per_run.begin(), per_run.begin() + kRounds / 2, per_run.end());
    if (per_run[kRounds / 2] < best_ms) {
      best_ms = per_run[kRounds / 2];
      best = i;
    }
  }
  return best;
}

}  // namespace ftbert::cuda
