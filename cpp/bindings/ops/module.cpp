// The pybind11 module ftbert._ops: each backend op on numpy arrays, for the op tests and the kernel
// benchmarks. Kept out of ftbert._C so that the production module only converts.
#include "bindings/bindings.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "cpu/isa.h"
#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "ftbert/backend.h"
#include "ftbert/check.h"

PYBIND11_MODULE(_ops, m) {
  m.doc() = "ftbert engine (C++): op-level entry points for tests and benchmarks";
  ftbert::bindings::register_error_translation();
  m.def("cuda_backend_built", &ftbert::cuda_backend_built,
        "Whether this build has the CUDA backend library (it may still lack a GPU to run on).");
  m.def("cuda_fused_gemm_built", [] { return bool{FTBERT_HAS_GEMM_SM90}; },
        "Whether the CUDA backend was built with the Hopper FFN-in GEMM (CUTLASS, bias + "
        "erf-GELU in the epilogue), which runs on compute capability 9.0 devices.");
  m.def("cpu_isa", [] { return ftbert::cpu::isa_name(ftbert::cpu::isa()); },
        "The instruction set the CPU kernels run with (FTBERT_CPU_ISA caps it).");
  m.def(
      "cpu_parallel_cover",
      [](int64_t n, int64_t work) {
        std::vector<std::atomic<int32_t>> seen(static_cast<size_t>(std::max<int64_t>(n, 0)));
        {
          pybind11::gil_scoped_release release;  // so that Python threads call it at once
          ftbert::cpu::parallel_for(n, work, [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) seen[i].fetch_add(1, std::memory_order_relaxed);
          });
        }
        pybind11::array_t<int32_t> out(static_cast<pybind11::ssize_t>(seen.size()));
        for (size_t i = 0; i < seen.size(); ++i) out.mutable_at(i) = seen[i].load();
        return out;
      },
      pybind11::arg("n"), pybind11::arg("work"),
      "How many times the CPU thread pool's parallel_for(n, work) called its function on each of "
      "[0, n): ones when the chunks cover the range once.");
  m.def("cpu_num_threads", &ftbert::cpu::num_threads, "The CPU thread pool's threads.");
  m.def(
      "cpu_bf16_dot_peak",
      [](int threads, int64_t steps) {
        const auto peak = ftbert::cpu::kernels().bf16_dot_peak;
        FTBERT_CHECK_INPUT(peak != nullptr, "cpu_bf16_dot_peak: the CPU kernels run "
                                                << ftbert::cpu::isa_name(ftbert::cpu::isa())
                                                << ", without AVX512-BF16");
        FTBERT_CHECK_INPUT(threads >= 1 && steps >= 1,
                           "cpu_bf16_dot_peak: threads and steps must be at least 1");
        pybind11::gil_scoped_release release;
        std::vector<std::thread> pool;
        std::vector<float> sink(static_cast<size_t>(threads));
        const auto start = std::chrono::steady_clock::now();
        for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { sink[t] = peak(steps); });
        for (std::thread& t : pool) t.join();
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        return 12.0 * 64.0 * static_cast<double>(steps) * threads / s / 1e9;
      },
      pybind11::arg("threads"), pybind11::arg("steps"),
      "GFLOP/s of `threads` threads each running `steps` rounds of 12 independent 512-bit "
      "vdpbf16ps on registers (benchmarks: the bfloat16 GEMM's ceiling on this CPU).");
  ftbert::bindings::register_op_runner(m);
  ftbert::bindings::register_pick_store(m);
}
