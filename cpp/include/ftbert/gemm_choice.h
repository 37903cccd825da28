// How a backend with several kernels for a weight GEMM shape picks one (CUDA, float16 and bfloat16:
// cuBLAS, cuBLASLt's heuristic candidates, the Hopper CUTLASS kernels), as the op tests and
// benchmarks reach it (Backend::gemm_choice_control; the CUDA side is cpp/cuda/gemm/weight_gemm.cu).
// "auto" measures a shape's candidates off the request path and runs the fastest (gemm_tuner.h);
// "fixed" runs a rule measured once, offline (the same kernels from run to run and process to
// process). The engine itself never calls these: the mode comes from FTBERT_GEMM_CHOICE.
#pragma once

#include <string>
#include <vector>

#include "ftbert/config.h"
#include "ftbert/dtype.h"

namespace ftbert {

class GemmChoiceControl {
 public:
  virtual ~GemmChoiceControl() = default;

  // "auto" or "fixed"; anything else is an InputError.
  virtual void set_mode(const std::string& mode) = 0;
  virtual std::string mode() const = 0;
  // The candidates' names for a weight_gemm shape and epilogue (act: kIdentity for none, else
  // act(a·W + bias)), empty where there is one way.
  virtual std::vector<std::string> candidates(DType dt, int m, int n, int k, Activation act) = 0;
  // The candidate "auto" picked for the shape's bucket (under the backend's batch-invariance
  // setting: those picks are kept apart); "" where none was measured.
  virtual std::string pick(DType dt, int m, int n, int k, Activation act) const = 0;
  // One run of a named candidate with weight_gemm's arguments (lda = k, ldc = n, a bias exactly
  // when act is not kIdentity); false, enqueuing nothing, where it cannot take them.
  virtual bool run_candidate(const std::string& name, DType dt, int m, int n, int k,
                             const void* a, const void* w, void* c, const void* bias,
                             Activation act) = 0;
};

// The mode names set_mode accepts; throws InputError for any other.
void check_gemm_choice_mode(const std::string& mode);

}  // namespace ftbert
