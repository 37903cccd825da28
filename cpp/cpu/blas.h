// The CBLAS entry points the CPU backend uses. The scipy-openblas32 wheel prefixes its symbols with
// `scipy_` so that it can live beside another OpenBLAS in one process; map the plain names here.
#pragma once

#include <cblas.h>

#define FTBERT_SGEMM scipy_cblas_sgemm
#define FTBERT_OPENBLAS_SET_NUM_THREADS scipy_openblas_set_num_threads
