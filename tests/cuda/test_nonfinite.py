"""No silent NaN on the GPU: float16 overflow is reported, bfloat16 is the remedy (GPU only)."""

import warnings

import numpy as np
import pytest
import torch

import ftbert
from tests._models import make_bert
from tests.core.test_nonfinite import scale_to_overflow

pytestmark = pytest.mark.skipif(not ftbert.cuda_available(), reason="needs an NVIDIA GPU and a CUDA build")


@pytest.fixture(scope="module")
def fp16_overflow(tmp_path_factory):
    # Each FFN output sums ~I/4 positive GELU outputs times 1e3: well past float16's 65504, far
    # inside float32's and bfloat16's range.
    path = tmp_path_factory.mktemp("fp16-overflow")
    scale_to_overflow(make_bert(path, hidden=64, heads=2, layers=2, seed=5), path, 1e3)
    return path


def ids_for(rng, batch, seq):
    return rng.integers(0, 211, (batch, seq))


@pytest.mark.parametrize("graphs", [True, False])
def test_float16_overflow_warns_naming_bfloat16_on_host_outputs(fp16_overflow, rng, graphs):
    enc = ftbert.Encoder.from_pretrained(fp16_overflow, device="cuda", dtype="float16", cuda_graphs=graphs)
    ids = ids_for(rng, 3, 17)
    for _ in range(3):  # op by op, recorded, replayed
        with pytest.warns(RuntimeWarning, match="bfloat16"):
            enc(ids)


def test_bfloat16_is_finite_where_float16_overflows(fp16_overflow, rng):
    ids = ids_for(rng, 2, 33)
    ref = ftbert.Encoder.from_pretrained(fp16_overflow, device="cuda", dtype="float32")(ids).last_hidden_state
    bf16 = ftbert.Encoder.from_pretrained(fp16_overflow, device="cuda", dtype="bfloat16", nonfinite="raise")
    out = bf16(ids).last_hidden_state
    assert np.isfinite(out).all()
    assert np.abs(out - ref).max() < 0.1  # bfloat16's rounding, nothing more


def test_device_outputs_raise_when_asked(fp16_overflow, rng):
    enc = ftbert.Encoder.from_pretrained(fp16_overflow, device="cuda", dtype="float16", nonfinite="raise")
    ids = torch.from_numpy(ids_for(rng, 2, 9)).cuda()
    for _ in range(3):
        with pytest.raises(ftbert.NonFiniteError, match="this forward"):
            enc(ids)


def test_device_outputs_warn_at_a_later_forward_without_waiting(fp16_overflow, rng):
    enc = ftbert.Encoder.from_pretrained(fp16_overflow, device="cuda", dtype="float16")
    ids = torch.from_numpy(ids_for(rng, 2, 9)).cuda()
    with warnings.catch_warnings(record=True) as first:
        warnings.simplefilter("always")
        enc(ids)
    torch.cuda.synchronize()  # the first forward is done: the next call sees its flag
    with pytest.warns(RuntimeWarning, match="recent forward"):
        enc(ids)
    assert all("NaN" in str(w.message) for w in first)


def test_finite_model_never_reports(tmp_path, rng):
    make_bert(tmp_path, hidden=64, heads=2, layers=2, seed=6)
    for dtype in ("float32", "float16", "bfloat16"):
        enc = ftbert.Encoder.from_pretrained(tmp_path, device="cuda", dtype=dtype, nonfinite="raise")
        for _ in range(3):
            enc(ids_for(rng, 4, 40))
            enc(torch.from_numpy(ids_for(rng, 4, 40)).cuda())
