// The CPU ops' thread pool (see parallel.h for why it is not OpenMP).
#include "cpu/parallel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace ftbert::cpu {

namespace {

// Waking the pool costs tens of microseconds; below this many elements one thread is faster.
constexpr int64_t kMinWork = 1 << 15;
// How long a thread that has finished its share polls for the next job (or the caller for the
// workers to finish) before it sleeps. A forward's ops follow each other within microseconds, so
// most hand-overs are caught while polling, without a futex wake-up (measured: ~10% of a MiniLM
// 1 x 32 forward went to waking the workers); 50 us is far too short to take a core from anyone
// between forwards, unlike OpenMP's spinning (see parallel.h).
constexpr auto kPoll = std::chrono::microseconds(50);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Polls `ready` for up to kPoll; true as soon as it holds.
template <typename Ready>
bool poll_for(Ready ready) {
  const auto until = std::chrono::steady_clock::now() + kPoll;
  for (int i = 0;; ++i) {
    if (ready()) return true;
    cpu_relax();
    if (i % 64 == 63 && std::chrono::steady_clock::now() >= until) return false;
  }
}

// A job's chunks are claimed through one word: its generation (high 32 bits), its chunk count
// (next 16) and its next unclaimed chunk (low 16). Claiming is a compare-exchange on the whole
// word, so a thread that wakes after its job has ended claims nothing and never touches the job;
// the caller waits for the claimed chunks to be done, never for threads that took none. Waking a
// core that has idled for a while can take milliseconds (a VM's halted vCPU), which a forward
// would otherwise pay at every op until the worker is up.
class Pool {
 public:
  explicit Pool(int threads) {
    for (int i = 0; i + 1 < threads; ++i) workers_.emplace_back([this] { work_loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Returns false (and does nothing) when the pool is busy with another caller's job.
  bool run(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    std::unique_lock<std::mutex> busy(run_mutex_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    // Many chunks a thread, so that one slow to wake holds little of the job.
    const int64_t chunks = std::min<int64_t>({n, 16 * size(), kMaxChunks});
    {
      // Published under the mutex (for sleeping workers) and by the word's release (for polling
      // ones): a claim of this generation's chunk sees the job.
      std::lock_guard<std::mutex> lock(mutex_);
      fn_ = &fn;
      n_ = n;
      done_.store(0, std::memory_order_relaxed);
      const uint64_t generation = (next_.load(std::memory_order_relaxed) >> 32) + 1;
      next_.store(generation << 32 | static_cast<uint64_t>(chunks) << 16, std::memory_order_release);
    }
    wake_.notify_all();
    run_chunks();
    const auto finished = [&] { return done_.load(std::memory_order_acquire) == chunks; };
    if (!poll_for(finished)) {
      std::unique_lock<std::mutex> lock(mutex_);
      finished_.wait(lock, finished);
    }
    fn_ = nullptr;
    return true;
  }

 private:
  static constexpr int64_t kMaxChunks = 0xffff;

  // Claims and runs the current job's chunks until none is left.
  void run_chunks() {
    uint64_t word = next_.load(std::memory_order_acquire);
    for (;;) {
      const int64_t chunk = static_cast<int64_t>(word & 0xffff);
      const int64_t chunks = static_cast<int64_t>(word >> 16 & 0xffff);
      if (chunk >= chunks) return;
      if (!next_.compare_exchange_weak(word, word + 1, std::memory_order_acq_rel,
                                       std::memory_order_acquire)) {
        continue;  // word now holds the current value
      }
      // The job cannot end before this chunk is done, so its fields are this job's.
      (*fn_)(n_ * chunk / chunks, n_ * (chunk + 1) / chunks);
      if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == chunks) {
        // Under the mutex: the caller is then either before its check or asleep in wait().
        std::lock_guard<std::mutex> lock(mutex_);
        finished_.notify_one();
      }
      word = next_.load(std::memory_order_acquire);
    }
  }

  void work_loop() {
    uint64_t seen = 0;  // the generation last looked at
    for (;;) {
      const auto fresh = [&] {
        return stop_.load(std::memory_order_acquire) ||
               next_.load(std::memory_order_acquire) >> 32 != seen;
      };
      if (!poll_for(fresh)) {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, fresh);
      }
      if (stop_.load(std::memory_order_acquire)) return;
      seen = next_.load(std::memory_order_acquire) >> 32;
      run_chunks();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex run_mutex_;  // one job at a time
  std::mutex mutex_;
  std::condition_variable wake_, finished_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> next_{0};   // generation | chunk count | next chunk, as above
  std::atomic<int64_t> done_{0};    // the current job's chunks done
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
};

int configured_threads() {
  if (const char* env = std::getenv("FTBERT_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

Pool& pool() {
  static Pool p(configured_threads());
  return p;
}

}  // namespace

int num_threads() { return pool().size(); }

void parallel_for(int64_t n, int64_t work, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (n == 1 || work < kMinWork || num_threads() == 1 || !pool().run(n, fn)) fn(0, n);
}

}  // namespace ftbert::cpu
