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


# A pause before each engine's turn on the CPU: longer than the thread pools of torch (OpenMP) and
# ONNX Runtime spin after their last call.
CPU_HANDOVER_S = 0.05


def time_interleaved(fns: dict[str, Callable[[], object]], device: str, warmup: int, iters: int,
                     rounds: int = 5, on_error: Callable[[str, Exception], None] | None = None
                     ) -> dict[str, list[float]]:
    """`iters` samples of each of `fns` (time_forward's), taken in `rounds` rounds that visit every
    function in turn, the order rotated each round, after `warmup` untimed calls of each.

    Drift over the run (clocks, temperature, other tenants) then falls on every function alike
    instead of on whichever ran last. On the CPU each turn starts with a pause of CPU_HANDOVER_S and
    one untimed call: the engine before it may leave its thread pool spinning (OpenMP's, ONNX
    Runtime's, for milliseconds) on the cores the next one needs, and its data in the caches, so a
    turn's first calls would measure the hand-over.
    A function that raises is reported to `on_error` (re-raised without one) and left out of the
    later rounds; its samples so far are dropped.
    """
    live = dict(fns)
    samples: dict[str, list[float]] = {name: [] for name in fns}

    def call(name: str, n_warmup: int, n: int) -> None:
        try:
            samples[name] += time_forward(live[name], device, n_warmup, n)
        except KeyboardInterrupt:
            raise
        except Exception as e:
            if on_error is None:
                raise
            del live[name]
            samples.pop(name)
            on_error(name, e)

    for name in list(live):
        if warmup:
            call(name, warmup, 0)
    rounds = max(1, min(rounds, iters))
    sizes = [iters // rounds + (i < iters % rounds) for i in range(rounds)]
    for r, n in enumerate(sizes):
        names = list(live)
        if not names:
            break
        first = r % len(names)
        for name in names[first:] + names[:first]:
            if not device.startswith("cuda"):
                time.sleep(CPU_HANDOVER_S)
            call(name, 0 if device.startswith("cuda") else 1, n)
    return samples


def repeated_op_ms(run: Callable[[int], object], runs: int, reps: int) -> float:
    """Milliseconds of one run of an op that `run(n)` runs n times in one call (an OpRunner op with
    `repeat=n`, which uploads its operands and downloads its result once per call): the median over
    `reps` of (time of run(2·runs) − time of run(runs)) / runs, after one untimed run(runs), so that
    the upload and download drop out."""

    def timed(n: int) -> float:
        t = time.perf_counter()
        run(n)
        return time.perf_counter() - t

    timed(runs)
    diffs = []
    for _ in range(reps):
        once, twice = timed(runs), timed(2 * runs)
        diffs.append((twice - once) / runs)
    return float(np.median(diffs)) * 1e3


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
