"""ModernBERT on the GPU against transformers' ModernBertModel in float32: sliding-window and global
layers at lengths far past the window and up to 8,192 tokens, right and left padding and holes
inside a sequence, padded and packed, both attention kernels, CUDA graphs on; float32 within 1e-4
(against transformers on the CPU, eager), float16 and bfloat16 within twice transformers' own error
in that dtype (sdpa on the GPU) + 1e-3 (GPU only; skipped without one)."""

import numpy as np
import pytest
import torch

import ftbert
from tests._models import make_modernbert
from tests.cuda._hf import cuda_inputs as inputs
from tests.cuda._hf import masked_error as error
from tests.cuda._hf import run_hf as hf_outputs

pytestmark = [
    pytest.mark.skipif(not ftbert.cuda_available(), reason="needs an NVIDIA GPU and a CUDA build"),
    pytest.mark.usefixtures("no_tf32"),
]

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    # head dim 64 (flash runs), windows of ±32, global every 3rd of 4 layers
    path = tmp_path_factory.mktemp("modernbert")
    hf = make_modernbert(path, hidden=128, heads=2, layers=4, window=64, every=3, seed=11,
                         max_pos=8192)
    return path, hf, {}


def peer(model, dtype):
    path, hf, peers = model
    if dtype not in peers:
        peers[dtype] = type(hf).from_pretrained(path, dtype=DTYPES[dtype],
                                                attn_implementation="sdpa").cuda().eval()
    return peers[dtype]


def run_hf(model, ids, mask):
    return hf_outputs(model, ids, mask)[0]


@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("batch,seq,style", [(3, 300, "right"), (2, 200, "left"), (3, 97, "holes")])
def test_float32_matches_transformers(model, rng, padding_free, batch, seq, style):
    path, hf, _ = model
    enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype="float32", padding_free=padding_free)
    for _ in range(3):  # op by op, recorded, replayed
        ids, mask = inputs(rng, hf, batch, seq, style)
        err = error(enc(ids, mask).last_hidden_state, run_hf(hf, ids, mask), mask)
        assert err <= 1e-4, f"hidden {err:.2e}"


@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("attention", ["unfused", "flash"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("batch,seq,style", [(4, 300, "right"), (3, 200, "left"), (3, 97, "holes")])
def test_half_precision_within_twice_transformers(model, rng, dtype, attention, padding_free, batch,
                                                   seq, style):
    path, hf, _ = model
    enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype=dtype, attention=attention,
                                         padding_free=padding_free)
    assert enc.attention_for(batch, seq) == attention
    ours = theirs = 0.0
    for _ in range(3):
        ids, mask = inputs(rng, hf, batch, seq, style)
        ref = run_hf(hf, ids, mask)
        out = enc(ids, mask).last_hidden_state
        assert out.dtype == DTYPES[dtype] and torch.isfinite(out).all()
        ours = max(ours, error(out, ref, mask))
        theirs = max(theirs, error(run_hf(peer(model, dtype), ids, mask), ref, mask))
    assert ours <= 2 * theirs + 1e-3, f"ftbert {ours:.3e} vs transformers {theirs:.3e}"


@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_8192_tokens(model, rng, dtype, padding_free):
    path, hf, _ = model
    enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype=dtype, padding_free=padding_free)
    ids, mask = inputs(rng, hf, 2, 8192, "right")
    mask[1, 5000:] = 0
    with torch.no_grad():
        ref = hf.cuda()(ids, attention_mask=mask.long()).last_hidden_state.float().cpu()
        hf.cpu()
    out = enc(ids, mask).last_hidden_state
    theirs = error(run_hf(peer(model, dtype), ids, mask), ref, mask)
    ours = error(out, ref, mask)
    assert ours <= 2 * theirs + 1e-3, f"ftbert {ours:.3e} vs transformers {theirs:.3e}"
