// The CPU kernels built for the avx512_bf16 instruction set (AVX-512 with the bfloat16 dot
// product; flags set in CMakeLists.txt): the avx512 kernels plus the bfloat16 panel GEMM.
#define FTBERT_ISA_NS avx512_bf16
#define FTBERT_VBYTES 64
#include "cpu/kernels_impl.h"
