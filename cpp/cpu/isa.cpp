// Run-time choice of the CPU ops' instruction set (isa.h).
#include "cpu/isa.h"

#include <cstdlib>
#include <cstring>

#include "ftbert/check.h"

namespace ftbert::cpu {

namespace {

Isa detect() {
#if defined(FTBERT_CPU_MULTI_ISA)
  __builtin_cpu_init();
  // The AVX-512 kernels use F (and the compiler may emit BW/DQ/VL forms of the same loops).
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    return has_bf16_instructions() ? Isa::kAvx512Bf16 : Isa::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
#endif
  return Isa::kBaseline;
}

Isa choose() {
  const Isa best = detect();
  const char* env = std::getenv("FTBERT_CPU_ISA");
  if (env == nullptr || *env == '\0') return best;
  Isa cap;
  if (std::strcmp(env, "avx512_bf16") == 0) {
    cap = Isa::kAvx512Bf16;
  } else if (std::strcmp(env, "avx512") == 0) {
    cap = Isa::kAvx512;
  } else if (std::strcmp(env, "avx2") == 0) {
    cap = Isa::kAvx2;
  } else if (std::strcmp(env, "baseline") == 0) {
    cap = Isa::kBaseline;
  } else {
    FTBERT_FAIL("FTBERT_CPU_ISA='" << env
                                    << "' is not one of avx512_bf16, avx512, avx2, baseline");
  }
  // A cap above what the CPU has runs what it has: asking for AVX-512 must not crash a CPU
  // without it.
  return static_cast<int>(cap) < static_cast<int>(best) ? cap : best;
}

}  // namespace

Isa isa() {
  static const Isa chosen = choose();
  return chosen;
}

bool has_bf16_instructions() {
#if defined(FTBERT_CPU_MULTI_ISA)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

std::string bf16_unsupported_reason() {
  if (isa() == Isa::kAvx512Bf16) return "";
  if (!has_bf16_instructions()) {
    return "this CPU lacks AVX512-BF16, the instructions the CPU backend's bfloat16 GEMMs run on";
  }
  const char* cap = std::getenv("FTBERT_CPU_ISA");
  if (cap == nullptr) {  // AVX512-BF16 without the AVX-512 subsets the other kernels use
    return "this CPU has AVX512-BF16 but not all of AVX-512 F, BW, DQ and VL";
  }
  return std::string("FTBERT_CPU_ISA=") + cap +
         " leaves out AVX512-BF16, the instructions the CPU backend's bfloat16 GEMMs run on";
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx512Bf16: return "avx512_bf16";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    case Isa::kBaseline: return "baseline";
  }
  return "?";
}

}  // namespace ftbert::cpu

// ---- kernel table --------------------------------------------------------------------------
#include "cpu/kernels.h"

namespace ftbert::cpu {

const char* int8_kernel() { return kernels().s8_kernel; }

bool has_int8_dot_product() {
  return std::strcmp(int8_kernel(), "amx") == 0 || std::strcmp(int8_kernel(), "vnni") == 0;
}

const Kernels& kernels() {
  static const Kernels* chosen = [] {
    switch (isa()) {
      case Isa::kAvx512Bf16: return &avx512_bf16::table();
      case Isa::kAvx512: return &avx512::table();
      case Isa::kAvx2: return &avx2::table();
      case Isa::kBaseline: break;
    }
    return &baseline::table();
  }();
  return *chosen;
}

}  // namespace ftbert::cpu
