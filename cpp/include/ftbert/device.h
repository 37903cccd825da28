// The device half of a backend: what it is, its memory, streams and host flags, and recording a
// forward's ops for replay. The ops themselves (backend.h) are declared on top of it; the encoder's
// session and the bindings reach both through a Backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ftbert/dtype.h"

namespace ftbert {

// Ops recorded once by Device::record and replayed as one launch by Device::replay (a CUDA
// graph). A recording reads and writes the very buffers it was recorded with: it is valid only
// while they live, and only for the sizes it was recorded at.
class RecordedOps {
 public:
  virtual ~RecordedOps() = default;
};

// An address a recording's ops were recorded with (one of record()'s `redirectable`) and the one a
// replay gives them instead.
struct Redirect {
  const void* recorded = nullptr;
  void* replayed = nullptr;
};

class Device {
 public:
  virtual ~Device() = default;

  virtual std::string name() const = 0;          // "cpu", "cuda"
  virtual std::string device_name() const = 0;   // e.g. "NVIDIA H100 80GB HBM3"
  virtual bool supports_dtype(DType dt) const = 0;
  // Why dt cannot run here ("" when it can), for the error that refuses it.
  virtual std::string dtype_unsupported_reason(DType dt) const {
    if (supports_dtype(dt)) return "";
    return "the " + name() + " backend does not compute in " + dtype_name(dt);
  }

  // ---- memory -------------------------------------------------------------------------------
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr) noexcept = 0;
  virtual void copy_to_device(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void copy_on_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void synchronize() = 0;
  // `words` zeroed int32s that ops may set on the device and the host reads in place, with no
  // copy and no sync (CUDA: mapped pinned host memory): allocate_host_flag returns the host
  // address, host_flag_device_address the one ops take.
  virtual int32_t* allocate_host_flag(size_t words = 1);
  virtual void free_host_flag(int32_t* flag) noexcept;
  virtual int32_t* host_flag_device_address(int32_t* flag) { return flag; }
  // Run subsequent work on this stream (a cudaStream_t as an integer, 0 = the legacy default
  // stream, as torch's default stream is). Until it is called, the backend uses its own stream.
  // A switch keeps the backend's order: work enqueued after it runs after all work enqueued
  // before it, on whichever stream, so buffers reused across callers' streams are never raced.
  virtual void set_stream(uintptr_t /*stream*/) {}
  virtual uintptr_t stream() const { return 0; }
  // The backend's own stream, for work no caller's stream orders (set_stream(own_stream())).
  virtual uintptr_t own_stream() const { return 0; }

  // ---- recording ------------------------------------------------------------------------------
  // Records the ops `enqueue` issues, without running them, for replay() to run later as one
  // launch: per-op launch costs are paid once instead of every time. Returns null where the
  // backend does not record (the CPU; CUDA with FTBERT_CUDA_SYNC_DEBUG, which synchronizes after
  // every launch); the caller then runs the ops itself.
  // `redirectable`: addresses each replay places anew (a forward's output, which is the caller's
  // tensor each time); every replay of the recording must then redirect each of them. Such an
  // address may reach the ops only as the plain pointer parameter of one of this backend's own
  // kernels (CUDA: launch.cuh), never as a GEMM's operand.
  virtual std::unique_ptr<RecordedOps> record(const std::function<void()>& enqueue,
                                              const std::vector<const void*>& redirectable) {
    (void)enqueue;
    (void)redirectable;
    return nullptr;
  }
  std::unique_ptr<RecordedOps> record(const std::function<void()>& enqueue) {
    return record(enqueue, {});
  }
  // Whether record() records (the CPU: never), so that callers may shape work for replays.
  virtual bool records() const { return false; }
  // Runs a recording of this backend's, in order with the ops around it, with its redirectable
  // addresses replaced as `redirects` say.
  virtual void replay(const RecordedOps& ops, const std::vector<Redirect>& redirects);
  void replay(const RecordedOps& ops) { replay(ops, {}); }
};

}  // namespace ftbert
