#include "cuda/gemm/gemm_tuner.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "cuda/cuda_check.h"
#include "ftbert/check.h"
#include "ftbert/pick_store.h"

namespace ftbert::cuda {

int rows_bucket(int m) {
  int64_t octave_top = 1;  // the power of two at or above m
  while (octave_top < m) octave_top <<= 1;
  const int64_t step = octave_top >= 8 ? octave_top / 8 : 1;  // (top/2, top] in 4 steps of top/8
  const int64_t bucket = (m + step - 1) / step * step;
  return static_cast<int>(std::min<int64_t>(bucket, std::numeric_limits<int>::max()));
}

bool GemmShapeKey::operator<(const GemmShapeKey& o) const {
  return std::tie(device, dt, rows_bucket, n, k, act, invariant, fp8) <
         std::tie(o.device, o.dt, o.rows_bucket, o.n, o.k, o.act, o.invariant, o.fp8);
}

namespace {

// Everything the picks and the tuner share, under one mutex. Leaked on purpose: the tuner's thread
// may still run while static destructors do (it is stopped and joined by an atexit handler).
// When the tuner times shapes. Timing on a GPU that runs forwards slows them (a first pass over a
// corpus paid ~20% for it) and blurs the timings: the tuner waits for the device to be quiet (no
// forward enqueued for kQuiet); on a device that never is, it starts kBusyGrace into a busy stretch
// and then takes at most kBusyShare of the time. A forward waiting for a pick (inline tuning) or a
// caller of wait_idle does not wait for either.
using Clock = std::chrono::steady_clock;
constexpr auto kQuiet = std::chrono::milliseconds(20);
constexpr auto kBusyGrace = std::chrono::seconds(2);
constexpr double kBusyShare = 0.1;

struct DeviceState {
  int in_flight = 0;      // forwards between forward_begins and forward_ends
  Clock::time_point last_forward{};  // the latest forward_begins or forward_ends
  Clock::time_point busy_since{};    // the first forward after a quiet moment
  Clock::time_point busy_timing_from{};  // the busy share's next allowed start
  int idle_waiters = 0;   // threads in wait_idle
  uint64_t generation = 0;
  int measuring = 0;      // shapes of this device the tuner is timing now
  bool cache_loaded = false;
  std::vector<std::pair<GemmShapeKey, GemmPick>> staged;
};

struct TunerState {
  std::mutex mutex;
  std::condition_variable changed;  // a pick staged or published, a request queued, a stop
  std::map<GemmShapeKey, GemmPick> published;
  std::set<GemmShapeKey> requested;    // queued, measuring or done: measured once
  std::set<GemmShapeKey> ran_by_rule;  // forwards ran the fixed rule while it was untuned
  std::set<GemmShapeKey> waited_for;   // measure_and_wait: published as soon as measured
  std::set<GemmShapeKey> failed;       // could not be measured: the rule stays
  std::set<std::string> unwritable;    // cache files a store failed on (warned once): not retried
  std::deque<GemmShapeKey> queue;
  std::map<int, DeviceState> devices;
  GemmPicks::Counters counters;
  std::thread thread;
  bool started = false, stop = false;
};

TunerState& state() {
  static auto* s = new TunerState();
  return *s;
}

thread_local bool on_tuner_thread = false;

// Under the state's mutex: the device's staged picks become the published ones.
void publish(TunerState& s, DeviceState& d) {
  bool changes_a_forward = false;
  for (auto& [key, pick] : d.staged) {
    const bool added = s.published.emplace(key, pick).second;
    changes_a_forward = changes_a_forward || (added && s.ran_by_rule.count(key) > 0);
  }
  d.staged.clear();
  if (changes_a_forward) ++d.generation;
  s.changed.notify_all();
}

// Under the state's mutex: `pick` waits for a moment with no forward of its device in flight
// (now, if there is none), or is published at once for a forward that waits for it.
void stage(TunerState& s, const GemmShapeKey& key, const GemmPick& pick) {
  DeviceState& d = s.devices[key.device];
  d.staged.emplace_back(key, pick);
  if (d.in_flight == 0 || s.waited_for.count(key) > 0) publish(s, d);
  s.changed.notify_all();
}

// Under the state's mutex: whether the tuner may time `key` now (see kQuiet).
bool may_time_now(const TunerState& s, const DeviceState& d, const GemmShapeKey& key,
                  Clock::time_point now) {
  if (d.idle_waiters > 0 || s.waited_for.count(key) > 0) return true;
  // A forward waits for a shape queued behind this one.
  if (std::any_of(s.queue.begin(), s.queue.end(),
                  [&](const GemmShapeKey& k) { return s.waited_for.count(k) > 0; })) {
    return true;
  }
  if (d.in_flight == 0 && now - d.last_forward >= kQuiet) return true;
  return now - d.busy_since >= kBusyGrace && now >= d.busy_timing_from;
}

void warn(const std::string& what) {
  std::fprintf(stderr, "ftbert: warning: %s\n", what.c_str());
}

void tuner_loop() {
  on_tuner_thread = true;
  TunerState& s = state();
  for (;;) {
    GemmShapeKey key;
    {
      std::unique_lock<std::mutex> lock(s.mutex);
      s.changed.wait(lock, [&] { return s.stop || !s.queue.empty(); });
      if (s.stop) return;
      key = s.queue.front();
      s.queue.pop_front();
      DeviceState& d = s.devices[key.device];
      ++d.measuring;
      // Forwards do not wake the tuner (they only note the time), so it looks again every few ms.
      while (!s.stop && !may_time_now(s, d, key, Clock::now())) {
        s.changed.wait_for(lock, std::chrono::milliseconds(5));
      }
      if (s.stop) return;
    }
    GemmCacheFile cache;
    GemmPick pick;
    bool measured = false;
    const Clock::time_point started = Clock::now();
    try {
      pick = measure_gemm_shape(key, &cache);
      measured = true;
    } catch (const std::exception& e) {
      warn("measuring the GEMM kernels for " + gemm_key_text(key) + " failed (" + e.what() +
           "); that shape keeps the fixed rule");
    }
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      const Clock::time_point ended = Clock::now();
      s.devices[key.device].busy_timing_from =
          ended + std::chrono::duration_cast<Clock::duration>((ended - started) *
                                                              ((1.0 - kBusyShare) / kBusyShare));
      if (measured) {
        ++s.counters.measured;
        stage(s, key, pick);
      } else {
        s.failed.insert(key);  // nothing published: every forward goes on running the rule
      }
      --s.devices[key.device].measuring;
      s.changed.notify_all();
    }
    if (measured && !cache.path.empty()) {
      {
        std::lock_guard<std::mutex> lock(s.mutex);
        if (s.unwritable.count(cache.path) > 0) continue;
      }
      // Off the lock: the file's lock may wait for another process.
      const bool stored =
          PickStore(cache.path, cache.identity).store({{gemm_key_text(key), gemm_pick_text(pick)}});
      std::lock_guard<std::mutex> lock(s.mutex);
      if (stored) {
        ++s.counters.cache_writes;
      } else {
        s.unwritable.insert(cache.path);  // store() said why; the picks still serve this process
      }
    }
  }
}

void stop_tuner() {
  TunerState& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.stop = true;
    s.changed.notify_all();
  }
  // The shape being timed finishes first (a fraction of a second), before CUDA tears down.
  if (s.thread.joinable()) s.thread.join();
}

// Under the state's mutex: queues `key` for the tuner, starting it on first use.
void enqueue(TunerState& s, const GemmShapeKey& key) {
  if (!s.requested.insert(key).second) return;
  s.queue.push_back(key);
  if (!s.started) {
    s.started = true;
    s.thread = std::thread(tuner_loop);
    std::atexit(stop_tuner);
  }
  s.changed.notify_all();
}

}  // namespace

const GemmPick* GemmPicks::find(const GemmShapeKey& key) {
  TunerState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  const auto it = s.published.find(key);
  return it == s.published.end() ? nullptr : &it->second;  // map nodes do not move
}

uint64_t GemmPicks::forward_begins(int device) {
  TunerState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  DeviceState& d = s.devices[device];
  const Clock::time_point now = Clock::now();
  if (d.in_flight == 0 && now - d.last_forward >= kQuiet) d.busy_since = now;
  d.last_forward = now;
  ++d.in_flight;
  return d.generation;
}

void GemmPicks::forward_ends(int device) {
  TunerState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  DeviceState& d = s.devices[device];
  d.last_forward = Clock::now();
  if (--d.in_flight == 0 && !d.staged.empty()) publish(s, d);
}

void GemmPicks::request(const GemmShapeKey& key) {
  TunerState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.published.count(key) > 0) return;
  s.ran_by_rule.insert(key);
  enqueue(s, key);
}

const GemmPick* GemmPicks::measure_and_wait(const GemmShapeKey& key) {
  TunerState& s = state();
  std::unique_lock<std::mutex> lock(s.mutex);
  if (const auto it = s.published.find(key); it != s.published.end()) return &it->second;
  s.waited_for.insert(key);
  // Measured or loaded meanwhile and staged behind a forward in flight: no forward ran this shape
  // by the rule (it would not be waiting here), so publishing it now changes none.
  DeviceState& d = s.devices[key.device];
  for (const auto& staged : d.staged) {
    if (staged.first < key || key < staged.first) continue;
    s.published.emplace(staged.first, staged.second);
  }
  enqueue(s, key);
  s.changed.wait(lock, [&] {
    return s.published.count(key) > 0 || s.failed.count(key) > 0 || s.stop;
  });
  const auto it = s.published.find(key);
  return it == s.published.end() ? nullptr : &it->second;
}

void GemmPicks::wait_idle(int device) {
  TunerState& s = state();
  std::unique_lock<std::mutex> lock(s.mutex);
  DeviceState& d = s.devices[device];
  ++d.idle_waiters;  // the tuner no longer waits for a quiet device
  s.changed.notify_all();
  s.changed.wait(lock, [&] {
    if (s.stop) return true;
    if (d.measuring > 0 || !d.staged.empty()) return false;
    return std::none_of(s.queue.begin(), s.queue.end(),
                        [&](const GemmShapeKey& k) { return k.device == device; });
  });
  --d.idle_waiters;
}

void GemmPicks::stage_loaded(const GemmShapeKey& key, const GemmPick& pick) {
  TunerState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.published.count(key) > 0 || !s.requested.insert(key).second) return;
  ++s.counters.loaded;
  stage(s, key, pick);
}

bool GemmPicks::claim_load(int device) {
  TunerState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  DeviceState& d = s.devices[device];
  if (d.cache_loaded) return false;
  d.cache_loaded = true;
  return true;
}

GemmPicks::Counters GemmPicks::counters() {
  TunerState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.counters;
}

bool gemm_tuning_inline() {
  static const bool inline_mode = [] {
    const char* v = std::getenv("FTBERT_GEMM_TUNING");
    const std::string mode = v != nullptr ? v : "";
    FTBERT_CHECK_INPUT(mode.empty() || mode == "background" || mode == "inline",
                       "FTBERT_GEMM_TUNING must be 'background' or 'inline', got '" << mode
                                                                                     << "'");
    return mode == "inline";
  }();
  return inline_mode;
}

// ---- the cache file's text ------------------------------------------------------------------------

std::string gemm_key_text(const GemmShapeKey& key) {
  std::ostringstream os;
  os << static_cast<int>(key.dt) << ',' << key.rows_bucket << ',' << key.n << ',' << key.k << ','
     << static_cast<int>(key.act);
  if (key.invariant) os << ",invariant";
  if (key.fp8) os << ",fp8";
  return os.str();
}

std::string gemm_pick_text(const GemmPick& pick) {
  std::ostringstream os;
  os << pick.name << ',' << static_cast<int>(pick.kernel) << ',' << static_cast<int>(pick.tiles)
     << ',' << pick.workspace << ',';
  const auto* bytes = reinterpret_cast<const unsigned char*>(&pick.algo);
  static const char kHex[] = "0123456789abcdef";
  for (size_t i = 0; i < sizeof(pick.algo); ++i) os << kHex[bytes[i] >> 4] << kHex[bytes[i] & 15];
  return os.str();
}

namespace {
// The comma-separated fields of `text` (exactly `count` of them), else empty.
std::vector<std::string> fields(const std::string& text, size_t count) {
  std::vector<std::string> out;
  std::string field;
  std::istringstream is(text);
  while (std::getline(is, field, ',')) out.push_back(field);
  if (!text.empty() && text.back() == ',') out.push_back("");
  if (out.size() != count) out.clear();
  return out;
}

bool parse_int(const std::string& text, int64_t lo, int64_t hi, int64_t* out) {
  if (text.empty() || text.size() > 19 || text.find_first_not_of("0123456789") != std::string::npos)
    return false;
  const int64_t v = std::stoll(text);
  if (v < lo || v > hi) return false;
  *out = v;
  return true;
}
}  // namespace

bool parse_gemm_key(const std::string& text, int device, GemmShapeKey* key) {
  // dt,rows,n,k,act then ",invariant" and ",fp8" where they hold, in that order.
  std::vector<std::string> f;
  bool invariant = false, fp8 = false;
  for (size_t count = 7; count >= 5 && f.empty(); --count) {
    f = fields(text, count);
    if (f.empty()) continue;
    const std::vector<std::string> flags(f.begin() + 5, f.end());
    invariant = !flags.empty() && flags[0] == "invariant";
    fp8 = !flags.empty() && flags.back() == "fp8";
    if (flags.size() != static_cast<size_t>(invariant) + static_cast<size_t>(fp8) ||
        (flags.size() == 2 && !(invariant && fp8))) {
      return false;
    }
  }
  int64_t dt, rows, n, k, act;
  if (f.empty() || !parse_int(f[0], 1, 2, &dt) ||  // float16, bfloat16
      !parse_int(f[1], invariant ? 1 : kTunedMinRows, INT32_MAX, &rows) ||
      rows_bucket(static_cast<int>(rows)) != rows ||
      !parse_int(f[2], 1, INT32_MAX, &n) || !parse_int(f[3], 1, INT32_MAX, &k) ||
      !parse_int(f[4], 0, 4, &act) || act == static_cast<int>(Activation::kTanh)) {
    return false;
  }
  *key = {device, static_cast<DType>(dt), static_cast<int>(rows), static_cast<int>(n),
          static_cast<int>(k), static_cast<Activation>(act), invariant};
  key->fp8 = fp8;
  return true;
}

bool parse_gemm_pick(const std::string& text, GemmPick* pick) {
  const std::vector<std::string> f = fields(text, 5);
  int64_t kernel, tiles, workspace;
  if (f.empty() || f[0].empty() ||
      f[0].find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789:_-") != std::string::npos ||
      !parse_int(f[1], 0, static_cast<int>(GemmKernel::kCublasLtFp8), &kernel) ||
      !parse_int(f[2], 0, static_cast<int>(GemmTiles::k128x128Pingpong), &tiles) ||
      !parse_int(f[3], 0, int64_t{1} << 40, &workspace) || f[4].size() != 2 * sizeof(pick->algo) ||
      f[4].find_first_not_of("0123456789abcdef") != std::string::npos) {
    return false;
  }
  GemmPick p;
  p.name = f[0];
  p.kernel = static_cast<GemmKernel>(kernel);
  p.tiles = static_cast<GemmTiles>(tiles);
  p.workspace = static_cast<size_t>(workspace);
  auto* bytes = reinterpret_cast<unsigned char*>(&p.algo);
  for (size_t i = 0; i < sizeof(p.algo); ++i) {
    bytes[i] = static_cast<unsigned char>(std::stoi(f[4].substr(2 * i, 2), nullptr, 16));
  }
  *pick = p;
  return true;
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

std::vector<float> time_candidates(cudaStream_t stream,
                                   const std::vector<std::function<bool()>>& candidates) {
  if (!on_tuner_thread) {
    TunerState& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    ++s.counters.on_caller;
  }
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
  std::vector<EventPair> events(static_cast<size_t>(n) * kRounds);
  for (int r = 0; r < kRounds; ++r) {
    for (int i = 0; i < n; ++i) {
      if (!usable[i]) continue;
      const EventPair& e = events[static_cast<size_t>(r) * n + i];
      FTBERT_CUDA_CHECK(cudaEventRecord(e.start, stream));
      for (int j = 0; j < runs[i]; ++j) candidates[i]();
      FTBERT_CUDA_CHECK(cudaEventRecord(e.stop, stream));
    }
  }
  FTBERT_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> ms(n, std::numeric_limits<float>::infinity());
  for (int i = 0; i < n; ++i) {
    if (!usable[i]) continue;
    std::vector<float> per_run(kRounds);
    for (int r = 0; r < kRounds; ++r) {
      const EventPair& e = events[static_cast<size_t>(r) * n + i];
      FTBERT_CUDA_CHECK(cudaEventElapsedTime(&per_run[r], e.start, e.stop));
      per_run[r] /= static_cast<float>(runs[i]);
    }
    std::nth_element(per_run.begin(), per_run.begin() + kRounds / 2, per_run.end());
    ms[i] = per_run[kRounds / 2];
  }
  return ms;
}

}  // namespace ftbert::cuda
