"""Timing one forward: CUDA events on the GPU, perf_counter on the CPU; percentiles of the samples."""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
import torch


def time_forward(fn: Callable[[], object], device: str, warmup: int, iters: int) -> list[float]:
    """Milliseconds of each of `iters` calls of fn(), after `warmup` untimed calls.

    GPU: a pair of CUDA events around each call on the current stream, then a device synchronize, so
    each sample is one request's latency as a caller sees it (launch overhead and any host sync
    inside fn included) and no two forwards overlap.
    """
    if device.startswith("cuda"):
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        samples = []
        for _ in range(iters):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            # The whole device, not only this stream: nothing of one forward may still run (and
            # write into memory torch hands out again) when the next begins.
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end))
        return samples
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return samples


def summarize(samples_ms: list[float]) -> dict:
    """median / p90 / p99 / mean / min / max of the samples, in ms."""
    a = np.asarray(samples_ms, dtype=np.float64)
    return {
        "median_ms": float(np.median(a)),
        "p90_ms": float(np.percentile(a, 90)),
        "p99_ms": float(np.percentile(a, 99)),
        "mean_ms": float(a.mean()),
        "min_ms": float(a.min()),
        "max_ms": float(a.max()),
        "iters": int(a.size),
    }
