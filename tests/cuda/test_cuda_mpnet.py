"""MPNet on the GPU against transformers' MPNet (eager attention, its only one) in float32 on the
CPU: the bare encoder at lengths past the relative bias's last bucket (128), right and left padding
and holes inside a sequence, padded and packed, both attention kernels, CUDA graphs on; float32
within 1e-4, float16 and bfloat16 within twice transformers' own error in that dtype + 1e-3; and
both heads (GPU only; skipped without one)."""

import numpy as np
import pytest
import torch

import ftbert
from tests._models import make_mpnet, widen_head
from tests.cuda._hf import cuda_inputs as inputs
from tests.cuda._hf import masked_error as hidden_error
from tests.cuda._hf import run_hf

pytestmark = [
    pytest.mark.skipif(not ftbert.cuda_available(), reason="needs an NVIDIA GPU and a CUDA build"),
    pytest.mark.usefixtures("no_tf32"),
]

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    path = tmp_path_factory.mktemp("mpnet")
    hf = make_mpnet(path, hidden=128, heads=2, layers=2, vocab=151, seed=8)  # head dim 64
    return path, hf, {}


def peer(case, dtype):
    path, hf, peers = case
    if dtype not in peers:
        peers[dtype] = type(hf).from_pretrained(path, dtype=DTYPES[dtype]).cuda().eval()
    return peers[dtype]


@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("attention", ["unfused", "flash"])
@pytest.mark.parametrize("batch,seq,style", [(3, 300, "right"), (2, 140, "left"), (3, 61, "holes")])
def test_float32_matches_transformers(bare, rng, attention, padding_free, batch, seq, style):
    path, hf, _ = bare
    # float32 runs the unfused kernels whatever is asked (flash needs a half dtype on the GPU).
    enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype="float32",
                                         attention="unfused", padding_free=padding_free)
    for _ in range(3):  # op by op, recorded, replayed
        ids, mask = inputs(rng, hf, batch, seq, style)
        ref, _ = run_hf(hf, ids, mask)
        err = hidden_error(enc(ids, mask).last_hidden_state, ref, mask)
        assert err <= 1e-4, f"hidden {err:.2e}"


@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("attention", ["unfused", "flash"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("batch,seq,style", [(4, 300, "right"), (3, 200, "left"), (3, 97, "holes"),
                                             (1, 512, "right")])
def test_half_precision_within_twice_transformers(bare, rng, dtype, attention, padding_free, batch,
                                                   seq, style):
    path, hf, _ = bare
    enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype=dtype, attention=attention,
                                         padding_free=padding_free)
    assert enc.attention_for(batch, seq) == attention
    ours = theirs = 0.0
    for _ in range(3):
        ids, mask = inputs(rng, hf, batch, seq, style)
        ref, _ = run_hf(hf, ids, mask)
        out = enc(ids, mask).last_hidden_state
        assert out.dtype == DTYPES[dtype] and torch.isfinite(out).all()
        ours = max(ours, hidden_error(out, ref, mask))
        theirs = max(theirs, hidden_error(run_hf(peer(bare, dtype), ids, mask)[0], ref, mask))
    assert ours <= 2 * theirs + 1e-3, f"ftbert {ours:.3e} vs transformers {theirs:.3e}"


@pytest.fixture(scope="module", params=["cls", "token"])
def headed(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"mpnet-{request.param}")
    hf = make_mpnet(path, kind=request.param, hidden=64, heads=2, layers=2, num_labels=3, seed=9)
    widen_head(hf)
    hf.save_pretrained(path)
    return path, hf, {}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_heads_match_transformers(headed, rng, dtype):
    path, hf, _ = headed
    enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype=dtype)
    ids, mask = inputs(rng, hf, 48, 150, "right")
    ref_h, ref_l = run_hf(hf, ids, mask)
    out = enc(ids, mask)
    valid = mask.bool().cpu()
    d = (out.logits.float().cpu() - ref_l).abs()
    e_l = (d if d.dim() == 2 else d[valid]).max().item()
    if dtype == "float32":
        assert hidden_error(out.last_hidden_state, ref_h, mask) <= 1e-4
        assert e_l <= 1e-4, f"logits {e_l:.2e}"
        return
    peer_h, peer_l = run_hf(peer(headed, dtype), ids, mask)
    d = (peer_l - ref_l).abs()
    theirs = (d if d.dim() == 2 else d[valid]).max().item()
    floor = max(1e-3, 2 * torch.finfo(DTYPES[dtype]).eps * ref_l.abs().max().item())
    assert e_l <= 2 * theirs + floor, f"logits: ftbert {e_l:.3e} vs transformers {theirs:.3e}"
