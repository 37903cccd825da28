"""The CPU thread pool (cpp/cpu/parallel.cpp): parallel_for's chunks cover [0, n) exactly once, for
any n, inline or spread over the pool, one job after another without a lost wake-up, after the
workers have gone to sleep, and while other threads call it at once (the pool runs one job; the
others run inline)."""

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from ftbert import _ops

BIG = 1 << 20  # work well above the pool's threshold, so the job is spread over the threads


@pytest.mark.parametrize("n", [1, 2, 3, 7, 31, 64, 1000, 65537])
@pytest.mark.parametrize("work", [1, BIG])
def test_every_index_once(n, work):
    np.testing.assert_array_equal(_ops.cpu_parallel_cover(n, work), np.ones(n, np.int32))


def test_nothing_to_do():
    assert _ops.cpu_parallel_cover(0, BIG).shape == (0,)


def test_many_jobs_in_a_row():
    # Each job a new generation of the claim word; a worker that woke late must claim nothing of a
    # job that has ended, and every job must end (a lost wake-up would hang here).
    rng = np.random.default_rng(0)
    for n in rng.integers(1, 300, 3000):
        got = _ops.cpu_parallel_cover(int(n), BIG)
        assert got.min() == 1 and got.max() == 1, n


def test_after_the_workers_sleep():
    # Past the workers' polling time they wait on the condition variable; the next job wakes them.
    for pause in (0.0, 0.001, 0.02):
        time.sleep(pause)
        np.testing.assert_array_equal(_ops.cpu_parallel_cover(4099, BIG), np.ones(4099, np.int32))


def test_from_many_threads_at_once():
    rng = np.random.default_rng(1)
    sizes = [int(n) for n in rng.integers(1, 5000, 400)]

    def run(n):
        return n, _ops.cpu_parallel_cover(n, BIG)

    with ThreadPoolExecutor(8) as pool:
        for n, got in pool.map(run, sizes):
            np.testing.assert_array_equal(got, np.ones(n, np.int32))


def test_the_pool_has_threads():
    assert _ops.cpu_num_threads() >= 1
