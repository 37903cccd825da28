// A small blocking thread pool for the CPU ops' row loops.
//
// Why not OpenMP: its worker threads spin after each parallel region, and in a process that also
// runs OpenBLAS (and torch's own OpenMP runtime, which shares the libgomp soname) those spinning
// threads take the cores the next GEMM needs, which on a small machine with a busy core made a
// forward many times slower (docs/performance.md, "Kernel choices"). These workers sleep on a
// condition variable between jobs
// instead.
#pragma once

#include <cstdint>
#include <functional>

namespace ftbert::cpu {

// Calls fn(begin, end) on disjoint chunks covering [0, n), spread over the pool's threads (the caller
// takes a share). Runs inline when `work` (elements touched) is too small to pay for waking threads,
// or when another parallel_for is running. Threads: FTBERT_NUM_THREADS, else the machine's cores.
void parallel_for(int64_t n, int64_t work, const std::function<void(int64_t, int64_t)>& fn);

int num_threads();

}  // namespace ftbert::cpu
