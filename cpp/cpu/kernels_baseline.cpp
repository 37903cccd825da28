// The CPU kernels built for the baseline instruction set (flags set in CMakeLists.txt).
#define FTBERT_ISA_NS baseline
#define FTBERT_VBYTES 16
#include "cpu/kernels_impl.h"
