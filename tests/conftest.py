import atexit
import os
import shutil
import tempfile
import zlib

import numpy as np
import pytest

# Set before any backend exists (they read both once). Measured GEMM picks go to a cache of the
# run's own, never the user's. Forwards wait for the picks of shapes they meet untuned
# ("inline"), so that results compared across forwards never straddle a pick landing; the default
# background tuning has tests of its own (tests/cuda/test_gemm_tuning.py), in processes of their own.
# GPU encoders load unwarmed unless a test asks (a warm-up meets every GEMM row bucket, which inline
# tuning would measure for each of the suite's many model sizes); the default has tests of its own.
_CACHE = tempfile.mkdtemp(prefix="ftbert-test-cache-")
atexit.register(shutil.rmtree, _CACHE, True)
os.environ.setdefault("FTBERT_CACHE_DIR", _CACHE)
os.environ.setdefault("FTBERT_GEMM_TUNING", "inline")
os.environ.setdefault("FTBERT_WARMUP", "0")

# Under pytest-xdist, each worker takes its share of the cores for ftbert's and torch's thread
# pools (at least 2, so the pool's own tests still run threads side by side): 14 workers with 16
# threads each for both on a 16-core GPU machine kept the CPU at 100% and the GPU idle.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _SHARE = str(max(2, (os.cpu_count() or 1) // _WORKERS))
    os.environ.setdefault("FTBERT_NUM_THREADS", _SHARE)
    os.environ.setdefault("OMP_NUM_THREADS", _SHARE)

# Fresh random inputs on every run; FTBERT_TEST_SEED=N replays a run (the header prints N).
RUN_SEED = int(os.environ.get("FTBERT_TEST_SEED", np.random.SeedSequence().entropy % (2**31)))


def pytest_report_header(config):
    return f"ftbert test seed: FTBERT_TEST_SEED={RUN_SEED}"


@pytest.fixture
def rng(request):
    return np.random.default_rng([RUN_SEED, zlib.crc32(request.node.nodeid.encode())])
