// The CPU kernels built for the avx2 instruction set (flags set in CMakeLists.txt).
#define FTBERT_ISA_NS avx2
#define FTBERT_VBYTES 32
#include "cpu/kernels_impl.h"
