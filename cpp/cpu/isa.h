// Which vector instruction set the CPU ops run with, chosen once per process at run time: the
// widest the CPU has (AVX-512, else AVX2 + FMA, else the baseline), capped by FTBERT_CPU_ISA
// ("avx512", "avx2" or "baseline") so that a narrower path can be run and tested on any machine.
#pragma once

namespace ftbert::cpu {

enum class Isa : int { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };

// Throws naming FTBERT_CPU_ISA's value if it is not one of the names above.
Isa isa();
const char* isa_name(Isa isa);

// Whether the CPU has AMX-BF16 or AVX512-BF16, the instructions a bfloat16 CPU path needs (the
// CPU backend computes in float32; errors for bfloat16 name what is missing).
bool has_bf16_instructions();

}  // namespace ftbert::cpu
