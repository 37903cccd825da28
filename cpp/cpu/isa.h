// Which vector instruction set the CPU ops run with, chosen once per process at run time: the
// widest the CPU has (AVX-512 with the bfloat16 dot product, else AVX-512, else AVX2 + FMA, else
// the baseline), capped by FTBERT_CPU_ISA ("avx512_bf16", "avx512", "avx2" or "baseline") so
// that a narrower path can be run and tested on any machine. bfloat16 runs only on avx512_bf16.
#pragma once

#include <string>

namespace ftbert::cpu {

enum class Isa : int { kBaseline = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3 };

// Throws naming FTBERT_CPU_ISA's value if it is not one of the names above.
Isa isa();
const char* isa_name(Isa isa);

// Whether the CPU has AVX512-BF16, the instructions the bfloat16 path's GEMMs run on (every CPU
// with AMX-BF16 has them too).
bool has_bf16_instructions();
// Whether the int8 weight GEMM runs on an 8-bit dot product of the CPU (AMX-INT8 or AVX512-VNNI,
// in the avx512_bf16 kernels), faster than float32. Elsewhere it runs AVX2's 16-bit products (the
// avx2 and avx512 kernels) or a portable kernel (baseline): exact, but slower than float32.
bool has_int8_dot_product();
// The kernel quantization "int8" runs here: "amx", "vnni", "avx2" or "portable" (kernels.h
// s8_kernel).
const char* int8_kernel();

// Why bfloat16 cannot run here ("" when it can): the CPU lacks AVX512-BF16, or FTBERT_CPU_ISA
// leaves it out.
std::string bf16_unsupported_reason();

}  // namespace ftbert::cpu
