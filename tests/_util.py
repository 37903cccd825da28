"""Shared helpers for the tests."""

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def ragged_mask(rng, batch, seq, left=False, min_len=1):
    """[B, S] int32 1/0 mask with random lengths; left=True pads on the left."""
    lens = rng.integers(min_len, seq + 1, size=batch)
    lens[0] = seq  # one full row keeps the longest length in play
    mask = np.zeros((batch, seq), dtype=np.int32)
    for b, n in enumerate(lens):
        if left:
            mask[b, seq - n :] = 1
        else:
            mask[b, :n] = 1
    return mask


def run_in_threads(n, work, timeout):
    """Runs work(t) for t in 0..n-1, one thread each, released together; returns the results in order
    and re-raises the first exception a thread raised (none waits longer than `timeout` seconds)."""
    start = threading.Barrier(n)

    def run(t):
        start.wait(timeout=timeout)
        return work(t)

    with ThreadPoolExecutor(n) as ex:
        futures = [ex.submit(run, t) for t in range(n)]
        return [f.result(timeout=timeout) for f in futures]


# LayerNorm in float64: the reference of the CPU ops tests.
def layernorm64(x, gamma, beta, eps):
    x = x.astype(np.float64)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * gamma + beta
