"""The whole encoder on the CPU in bfloat16 (where the CPU has AVX512-BF16) against transformers:
its error against transformers float32 at most twice transformers' own bfloat16 error (as on the
GPU), on both attention paths, padded and packed."""

import numpy as np
import pytest
import torch

import ftbert
from ftbert import _C
from tests._models import make_bert
from tests._util import assert_threads_match_sequential, ragged_mask

pytestmark = pytest.mark.skipif(bool(_C.cpu_dtype_unsupported_reason("bfloat16")),
                                reason=_C.cpu_dtype_unsupported_reason("bfloat16") or "runs")

CONFIGS = [(64, 2, 2, "gelu"), (96, 3, 2, "gelu_new"), (100, 4, 1, "gelu")]  # head dims 32, 32, 25


@pytest.fixture(scope="module", params=CONFIGS, ids=lambda c: f"h{c[0]}-heads{c[1]}-L{c[2]}-{c[3]}")
def models(request, tmp_path_factory):
    hidden, heads, layers, act = request.param
    path = tmp_path_factory.mktemp("bert")
    hf = make_bert(path, hidden=hidden, heads=heads, layers=layers, act=act, seed=hidden + layers)
    hf_bf16 = make_bert(path, hidden=hidden, heads=heads, layers=layers, act=act,
                        seed=hidden + layers).to(torch.bfloat16)
    return path, hf, hf_bf16


def hf_forward(model, ids, mask, types):
    with torch.no_grad():
        out = model(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long(),
                    token_type_ids=torch.from_numpy(types))
    return out.last_hidden_state.float().numpy(), out.pooler_output.float().numpy()


@pytest.mark.parametrize("attention", ["unfused", "flash"])
@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("batch,seq", [(1, 1), (3, 37), (2, 130)])
def test_error_within_twice_transformers_bfloat16(models, rng, attention, padding_free, batch, seq):
    path, hf, hf_bf16 = models
    enc = ftbert.Encoder.from_pretrained(path, device="cpu", dtype="bfloat16", attention=attention,
                                         padding_free=padding_free)
    ids = rng.integers(0, hf.config.vocab_size, (batch, seq))
    mask = ragged_mask(rng, batch, seq, left=not padding_free)
    types = rng.integers(0, 2, (batch, seq))
    ref_h, ref_p = hf_forward(hf, ids, mask, types)
    theirs_h, theirs_p = hf_forward(hf_bf16, ids, mask, types)
    out = enc(ids, mask, types)
    valid = mask.astype(bool)
    assert np.isfinite(out.last_hidden_state).all()  # padded rows too
    e_ours = np.abs(out.last_hidden_state - ref_h)[valid].max()
    e_theirs = np.abs(theirs_h - ref_h)[valid].max()
    # Over a single token both errors are a few roundings of its largest values, and their ratio
    # is luck (past 2x in about 1 of 300 draws): there, three bfloat16 ulps (2^-7 relative) of the
    # largest output value also pass.
    floor = 3 * 2.0**-7 * np.abs(ref_h[valid]).max() if valid.sum() == 1 else 0.0
    assert e_ours <= max(2 * e_theirs + 1e-3, floor), f"ftbert {e_ours:.3e} vs transformers {e_theirs:.3e}"
    p_ours, p_theirs = np.abs(out.pooler_output - ref_p).max(), np.abs(theirs_p - ref_p).max()
    assert p_ours <= 2 * p_theirs + 1e-3, f"pooler: ftbert {p_ours:.3e} vs transformers {p_theirs:.3e}"


def test_outputs_are_bfloat16_values_in_the_caller_s_kind(models, rng):
    # numpy has no bfloat16: numpy callers get float32 holding bfloat16 values; torch callers get
    # torch.bfloat16.
    path, hf, _ = models
    enc = ftbert.Encoder.from_pretrained(path, device="cpu", dtype="bfloat16")
    ids = rng.integers(0, hf.config.vocab_size, (2, 9))
    out = enc(ids).last_hidden_state
    assert out.dtype == np.float32
    assert np.array_equal(out.view(np.uint32) & 0xFFFF, np.zeros_like(out.view(np.uint32)))
    t = enc(torch.from_numpy(ids)).last_hidden_state
    assert t.dtype == torch.bfloat16 and np.array_equal(t.float().numpy(), out)


def test_torch_outputs_take_no_conversion_pass(models, rng):
    # The torch path hands back the engine's bfloat16 bits as a view: no torch op copies or
    # converts the outputs (one would wake torch's intra-op threads, which then spin beside the
    # engine's through the next forward).
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.__name__)
            return func(*args, **(kwargs or {}))

    path, hf, _ = models
    enc = ftbert.Encoder.from_pretrained(path, device="cpu", dtype="bfloat16")
    ids = torch.from_numpy(rng.integers(0, hf.config.vocab_size, (3, 11)))
    mask = torch.from_numpy(ragged_mask(rng, 3, 11))
    with Ops() as ops:
        out = enc(ids, mask)
    copies = [n for n in ops.names if any(w in n for w in ("copy", "_to_", "clone", "convert"))]
    assert not copies, ops.names
    assert out.last_hidden_state.dtype == torch.bfloat16 and out.pooler_output.dtype == torch.bfloat16
    want = enc(ids.numpy(), mask.numpy())
    assert np.array_equal(out.last_hidden_state.float().numpy(), want.last_hidden_state)


def test_concurrent_forwards_from_threads_match_sequential(models, rng):
    path, hf, _ = models
    enc = ftbert.Encoder.from_pretrained(path, device="cpu", dtype="bfloat16", concurrency=4)
    assert_threads_match_sequential(enc, rng, hf.config.vocab_size, max_len=150)

