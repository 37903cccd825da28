"""No silent NaN: a checkpoint whose activations overflow is reported (warn, raise or ignore).

The last LayerNorm flags a non-finite output as it writes it; on the CPU (here) every output is on
the host, so the report is exact for each forward. The GPU's float16 overflow and its lazy report
for device outputs are tested in tests/cuda/test_nonfinite.py.
"""

import warnings

import numpy as np
import pytest
import torch

import ftbert
from tests._models import make_bert


def scale_to_overflow(model, path, value):
    """Pins the last FFN's inner activations to GELU(10) = 10 and sets its output weights to
    `value`, and saves: each output is then ~10·I·value whatever the input, past the dtype's range."""
    with torch.no_grad():
        last = model.encoder.layer[-1]
        last.intermediate.dense.weight.zero_()
        last.intermediate.dense.bias.fill_(10.0)
        last.output.dense.weight.fill_(value)
    model.save_pretrained(path)


@pytest.fixture(scope="module")
def overflowing(tmp_path_factory):
    path = tmp_path_factory.mktemp("overflow")
    # Finite float32 weights whose products overflow float32 in the FFN output GEMM.
    scale_to_overflow(make_bert(path, hidden=64, heads=2, layers=2, seed=3), path, 1e38)
    return path


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    path = tmp_path_factory.mktemp("healthy")
    make_bert(path, hidden=48, heads=3, layers=1, seed=4)
    return path


def ids_for(rng, batch, seq):
    return rng.integers(0, 211, (batch, seq))


def test_overflowing_checkpoint_warns_naming_the_cause_by_default(overflowing, rng):
    enc = ftbert.Encoder.from_pretrained(overflowing)
    assert enc.nonfinite == "warn"
    with pytest.warns(RuntimeWarning, match=r"this forward's last_hidden_state holds NaN or Inf"):
        out = enc(ids_for(rng, 3, 11))
    assert not np.isfinite(out.last_hidden_state).all()  # the outputs are still returned


def test_overflowing_checkpoint_raises_when_asked(overflowing, rng):
    enc = ftbert.Encoder.from_pretrained(overflowing, nonfinite="raise")
    with pytest.raises(ftbert.NonFiniteError, match="NaN or Inf"):
        enc(ids_for(rng, 2, 7))
    # torch CPU tensors go the same host path
    with pytest.raises(FloatingPointError):
        enc(torch.from_numpy(ids_for(rng, 1, 5)))


def test_ignore_reports_nothing(overflowing, rng):
    enc = ftbert.Encoder.from_pretrained(overflowing, nonfinite="ignore")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        enc(ids_for(rng, 2, 9))


def test_report_is_per_forward_not_sticky(overflowing, healthy, rng):
    # A finite forward after a non-finite one must not be reported: the flag is cleared once read.
    enc = ftbert.Encoder.from_pretrained(overflowing)
    with pytest.warns(RuntimeWarning):
        enc(ids_for(rng, 2, 5))
    enc.nonfinite = "raise"
    with pytest.raises(ftbert.NonFiniteError):
        enc(ids_for(rng, 2, 5))
    good = ftbert.Encoder.from_pretrained(healthy, nonfinite="raise")
    for _ in range(3):
        assert np.isfinite(good(ids_for(rng, 4, 13)).last_hidden_state).all()


def test_each_session_reports_its_own_forwards(overflowing, rng):
    enc = ftbert.Encoder.from_pretrained(overflowing, nonfinite="raise", concurrency=3)
    from concurrent.futures import ThreadPoolExecutor

    def run(i):
        try:
            enc(ids_for(np.random.default_rng(i), 2, 6))
        except ftbert.NonFiniteError:
            return True
        return False

    with ThreadPoolExecutor(4) as ex:
        assert all(ex.map(run, range(12)))


@pytest.mark.parametrize("bad", ["loud", None, 1, True])
def test_unknown_nonfinite_mode_is_refused_by_name(healthy, bad):
    with pytest.raises(ValueError, match="nonfinite"):
        ftbert.Encoder.from_pretrained(healthy, nonfinite=bad)
    enc = ftbert.Encoder.from_pretrained(healthy)
    with pytest.raises(ValueError, match="nonfinite"):
        enc.nonfinite = bad
