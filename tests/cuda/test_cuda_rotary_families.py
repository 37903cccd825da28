"""NomicBERT, GTE, Jina-embeddings-v3 (architecture rotary_bert) and EuroBERT on the GPU against
transformers' own classes: right and left padding and holes inside a sequence, padded and packed,
both attention kernels, CUDA graphs on; float32 within 1e-4 (against transformers on the CPU,
eager), float16 and bfloat16 within twice transformers' own error in that dtype (sdpa on the GPU)
+ 1e-3; float32 within 1e-4 of the CPU engine too, from a saved checkpoint where the installed
transformers lacks the family's class; dynamic rope scaling sequence by sequence (GPU only; skipped
without one)."""

import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import ftbert
from tests._models import make_model
from tests._util import padded_ids
from tests.weights_tools.test_rotary_families import DYNAMIC, _hf_alone, _sharpened
from tests.cuda._hf import cuda_inputs as inputs
from tests.cuda._hf import masked_error as error
from tests.cuda._hf import run_hf as hf_outputs

pytestmark = [
    pytest.mark.skipif(not ftbert.cuda_available(), reason="needs an NVIDIA GPU and a CUDA build"),
    pytest.mark.usefixtures("no_tf32"),
]

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Head dim 64 (flash runs), odd intermediate sizes; each family's own activation.
FAMILIES = {
    "nomic_bert": dict(hidden=128, heads=2, layers=3, intermediate=251, seed=21),
    "gte": dict(hidden=192, heads=3, layers=2, intermediate=301, seed=22),
    "jina_embeddings_v3": dict(hidden=128, heads=2, layers=2, intermediate=307, seed=23),
    "eurobert": dict(hidden=128, heads=2, layers=3, intermediate=251, seed=24),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def model(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    hf = make_model(path, request.param, vocab=157, max_pos=1024, **FAMILIES[request.param])
    return path, hf, {}


def checkpoint(family, path):
    """A small `family` checkpoint at `path` (FAMILIES' sizes): made here where transformers has the
    family's class, else copied from $FTBERT_TEST_CHECKPOINTS/<family> (written where it has it, by
    benchmarks/save_test_models.py), else the test skips."""
    import shutil
    import transformers

    from tests._models import FAMILY_STEMS

    if getattr(transformers, FAMILY_STEMS[family] + "Model", None) is not None:
        make_model(path, family, vocab=157, max_pos=1024, **FAMILIES[family])
        return path
    saved = os.environ.get("FTBERT_TEST_CHECKPOINTS")
    if not saved or not (Path(saved) / family).is_dir():
        pytest.skip(f"transformers {transformers.__version__} has no {FAMILY_STEMS[family]}Model and "
                    f"$FTBERT_TEST_CHECKPOINTS holds no {family}")
    shutil.copytree(Path(saved) / family, path, dirs_exist_ok=True)
    return path


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "packed"])
def test_float32_matches_the_cpu_engine(tmp_path, rng, family, padding_free):
    # The CPU engine is held to transformers in CI: this runs where the GPU machine's transformers
    # lacks the family's class too (GTE), from a saved checkpoint.
    path = checkpoint(family, tmp_path)
    cpu = ftbert.Encoder.from_pretrained(path, device="cpu", dtype="float32")
    gpu = ftbert.Encoder.from_pretrained(path, device="cuda", dtype="float32", padding_free=padding_free)
    pad = cpu.config["pad_token_id"]
    for style in ("right", "left", "holes"):  # op by op, recorded, replayed
        ids, mask = padded_ids(rng, SimpleNamespace(vocab_size=cpu.config["vocab_size"], pad_token_id=pad),
                               3, 97, style)
        want = cpu(ids, mask).last_hidden_state
        got = torch.as_tensor(gpu(torch.from_numpy(ids).cuda(), torch.from_numpy(mask).cuda()).last_hidden_state)
        err = np.abs(got.cpu().numpy() - want)[mask.astype(bool)].max()
        assert err <= 1e-4, f"{style}: hidden {err:.2e}"


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
@pytest.mark.parametrize("batch,seq,style", [(4, 300, "right"), (3, 97, "holes")])
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


def test_forward_packed_equals_the_padded_batch(model, rng):
    path, hf, _ = model
    enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype="float16")
    ids, mask = inputs(rng, hf, 3, 150, "right")
    padded = enc(ids, mask).last_hidden_state.float().cpu().numpy()
    m = mask.cpu().numpy().astype(bool)
    flat = ids.cpu().numpy()[m]
    cu = np.concatenate([[0], np.cumsum(m.sum(1))])
    packed = torch.as_tensor(enc.forward_packed(flat, cu).last_hidden_state).float().cpu().numpy()
    assert np.abs(packed - padded[m]).max() <= 2e-3


@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "packed"])
def test_eurobert_late_pooling_head_on_the_gpu(tmp_path, rng, padding_free):
    # The head's dense reads every token's final hidden state: they must stay in the model's own
    # buffer even when the caller's tensors are on the device (CUDA inputs, graphs on).
    hf = make_model(tmp_path, "eurobert", kind="cls", hidden=128, heads=2, layers=2, num_labels=3, seed=25,
                    pooling="late")
    enc = ftbert.Encoder.from_pretrained(tmp_path, device="cuda", dtype="float32", padding_free=padding_free)
    for _ in range(3):  # op by op, recorded, replayed
        ids, mask = inputs(rng, hf, 3, 97, "holes")
        with torch.no_grad():
            want = hf(ids.cpu(), attention_mask=mask.cpu().long()).logits
        got = enc(ids, mask).logits
        assert (torch.as_tensor(got).float().cpu() - want).abs().max().item() <= 1e-4


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_dynamic_rope_on_the_gpu_sequence_by_sequence(tmp_path, rng, dtype):
    # Sequences past the original 64 positions, each turned by its own length: float32 within 1e-4
    # of transformers run on each alone (CPU, eager), half precision within twice transformers' own
    # error there + 1e-3; op by op, recorded, replayed.
    hf = _sharpened(make_model(tmp_path, "nomic_bert", hidden=128, heads=2, layers=2, intermediate=251,
                               seed=26, max_pos=64, rope=DYNAMIC), tmp_path)
    enc = ftbert.Encoder.from_pretrained(tmp_path, device="cuda", dtype=dtype)
    lengths = [128, 40, 97, 64, 65, 3]
    ids = [rng.integers(3, 150, n) for n in lengths]
    want = _hf_alone(hf, ids)
    theirs = 0.0
    if dtype != "float32":
        half = type(hf).from_pretrained(tmp_path, dtype=DTYPES[dtype], attn_implementation="sdpa").cuda().eval()
        theirs = max(np.abs(np.asarray(g, np.float64) - w).max() for g, w in zip(_hf_alone(half, ids), want))
    batch = np.zeros((len(ids), max(lengths)), np.int64)
    mask = np.zeros_like(batch)
    for b, x in enumerate(ids):
        batch[b, :len(x)], mask[b, :len(x)] = x, 1
    for _ in range(3):
        got = torch.as_tensor(enc(torch.from_numpy(batch).cuda(), torch.from_numpy(mask).cuda()).last_hidden_state)
        got = got.float().cpu().numpy()
        ours = max(np.abs(got[b, :n] - want[b]).max() for b, n in enumerate(lengths))
        assert ours <= (1e-4 if dtype == "float32" else 2 * theirs + 1e-3), f"ftbert {ours:.3e} vs {theirs:.3e}"
