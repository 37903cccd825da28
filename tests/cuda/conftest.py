"""Fixtures the GPU test files share."""

import pytest
import torch


@pytest.fixture(scope="module")
def gpu():
    """The CUDA backend's ops, one by one."""
    from ftbert import _ops

    return _ops.OpRunner("cuda")


@pytest.fixture(scope="module")
def cpu():
    """The CPU backend's ops: the reference the CUDA ones are held to."""
    from ftbert import _ops

    return _ops.OpRunner("cpu")


@pytest.fixture
def no_tf32():
    """torch's matmuls in true float32 for the test's references (TF32 would put ~1e-3 of error
    into them); restored afterwards."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old
