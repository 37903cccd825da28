// The pybind11 module ftbert._ops: each backend op on numpy arrays, for the op tests and the kernel
// benchmarks. Kept out of ftbert._C so that the production module only converts.
#include "bindings/bindings.h"

#include "cpu/isa.h"
#include "ftbert/backend.h"

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
  ftbert::bindings::register_op_runner(m);
  ftbert::bindings::register_pick_store(m);
}
