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


def assert_threads_match_sequential(enc, rng, vocab_size, max_len, threads=4):
    """Eight batches of random lengths through `enc` one at a time, then from `threads` threads at
    once: each threaded call's last_hidden_state must equal its sequential one exactly (forwards
    hold no Python lock; each must still get its own, correct result)."""
    batches = [rng.integers(0, vocab_size, (3, int(n))) for n in rng.integers(20, max_len, 8)]
    expected = [enc(ids).last_hidden_state for ids in batches]
    with ThreadPoolExecutor(threads) as pool:
        got = list(pool.map(lambda ids: enc(ids).last_hidden_state, batches))
    for e, g in zip(expected, got):
        np.testing.assert_array_equal(e, g)


# LayerNorm in float64: the reference of the CPU ops tests.
def layernorm64(x, gamma, beta, eps):
    x = x.astype(np.float64)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * gamma + beta
