import os
import zlib

import numpy as np
import pytest

# Fresh random inputs on every run; FTBERT_TEST_SEED=N replays a run (the header prints N).
RUN_SEED = int(os.environ.get("FTBERT_TEST_SEED", np.random.SeedSequence().entropy % (2**31)))


def pytest_report_header(config):
    return f"ftbert test seed: FTBERT_TEST_SEED={RUN_SEED}"


@pytest.fixture
def rng(request):
    return np.random.default_rng([RUN_SEED, zlib.crc32(request.node.nodeid.encode())])
