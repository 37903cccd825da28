// The CPU kernels built for the avx512 instruction set (flags set in CMakeLists.txt).
#define FTBERT_ISA_NS avx512
#define FTBERT_VBYTES 64
#include "cpu/kernels_impl.h"
