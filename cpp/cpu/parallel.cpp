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
    const int64_t chunks = std::min<int64_t>(n, 4 * size());  // a few per thread, for balance
    {
      // Published under the mutex (for sleeping workers) and by the generation's release (for
      // polling ones): a worker that sees the new generation sees the job.
      std::lock_guard<std::mutex> lock(mutex_);
      fn_ = &fn;
      n_ = n;
      chunks_ = chunks;
      next_.store(0);
      pending_.store(static_cast<int>(workers_.size()));
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    run_chunks();
    if (!poll_for([this] { return pending_.load(std::memory_order_acquire) == 0; })) {
      std::unique_lock<std::mutex> lock(mutex_);
      done_.wait(lock, [this] { return pending_.load(std::memory_order_acquire) == 0; });
    }
    fn_ = nullptr;
    return true;
  }

 private:
  void run_chunks() {
    for (int64_t c; (c = next_.fetch_add(1)) < chunks_;) {
      const int64_t begin = n_ * c / chunks_, end = n_ * (c + 1) / chunks_;
      (*fn_)(begin, end);
    }
  }

  void work_loop() {
    uint64_t seen = 0;
    for (;;) {
      const auto fresh = [&] {
        return stop_.load(std::memory_order_acquire) ||
               generation_.load(std::memory_order_acquire) != seen;
      };
      if (!poll_for(fresh)) {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, fresh);
      }
      if (stop_.load(std::memory_order_acquire)) return;
      seen = generation_.load(std::memory_order_acquire);
      run_chunks();
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        // Under the mutex: the caller is then either before its check or asleep in wait().
        std::lock_guard<std::mutex> lock(mutex_);
        done_.notify_one();
      }
    }
  }

  std::vector<std::thread> workers_;
  std::mutex run_mutex_;  // one job at a time
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, chunks_ = 0;
  std::atomic<int64_t> next_{0};
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
