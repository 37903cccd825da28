"""No silent NaN on the GPU: float16 overflow is reported, bfloat16 is the remedy (GPU only)."""

import warnings

import numpy as np
import pytest
import torch

import ftbert
from tests._models import make_bert

pytestmark = pytest.mark.skipif(not ftbert.cuda_available(), reason="needs an NVIDIA GPU and a CUDA build")


@pytest.fixture(scope="module")
def fp16_overflow(tmp_path_factory):
    # The last FFN's inner activations are all GELU(10) = 10 and its output weights ~N(0, 600²),
    # so its outputs are ~N(0, 9.5e4²) whatever the input: past float16's 65504 in most columns,
    # far inside float32's and bfloat16's range.
    path = tmp_path_factory.mktemp("fp16-overflow")
    model = make_bert(path, hidden=64, heads=2, layers=2, seed=5)
    torch.manual_seed(5)
    with torch.no_grad():
        last = model.encoder.layer[-1]
        last.intermediate.dense.weight.zero_()
        last.intermediate.dense.bias.fill_(10.0)
        last.output.dense.weight.normal_(0.0, 600.0)
    model.save_pretrained(path)
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
    assert np.abs(out - ref).max() < 0.1  # bfloat16's rounding of ~1e5 before the LayerNorm


def test_device_outputs_raise_when_asked(fp16_overflow, rng):
    enc = ftbert.Encoder.from_pretrained(fp16_overflow, device="cuda", dtype="float16", nonfinite="raise")
    ids = torch.from_numpy(ids_for(rng, 2, 9)).cuda()
    for _ in range(3):
        with pytest.raises(ftbert.NonFiniteError, match="this forward"):
            enc(ids)


def test_device_outputs_warn_by_the_next_forward_without_waiting(fp16_overflow, rng):
    # The flag is read without waiting: a small forward may already be done when its call
    # returns (then the call reports it), else the next call does. So once the GPU has finished
    # the first forward, the second call has warned at the latest.
    enc = ftbert.Encoder.from_pretrained(fp16_overflow, device="cuda", dtype="float16")
    ids = torch.from_numpy(ids_for(rng, 2, 9)).cuda()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        enc(ids)
        torch.cuda.synchronize()
        enc(ids)
    assert 1 <= len(seen) <= 2
    assert all("recent forward" in str(w.message) and "bfloat16" in str(w.message) for w in seen)


def test_finite_model_never_reports(tmp_path, rng):
    make_bert(tmp_path, hidden=64, heads=2, layers=2, seed=6)
    for dtype in ("float32", "float16", "bfloat16"):
        enc = ftbert.Encoder.from_pretrained(tmp_path, device="cuda", dtype=dtype, nonfinite="raise")
        for _ in range(3):
            enc(ids_for(rng, 4, 40))
            enc(torch.from_numpy(ids_for(rng, 4, 40)).cuda())
