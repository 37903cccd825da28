"""DeBERTa-v2/v3 on the GPU against transformers' DebertaV2 classes (eager attention, its only one):
v3's settings with 32 log buckets over 128 relative positions, so that sequences of 97 to 300 tokens
reach the log buckets and the clamped ends; head dims 32, 64 and 128 (at 64 the flash kernel computes
the terms itself, or with FTBERT_DEBERTA_TERM_TABLES=1 reads them from term tables), a batch big
enough for the table kernel's "wide" tiles and, at head dim 64, its 128-key tiles; v3's real 256
buckets (term tables a few hundred columns wide), each term type alone too, with the terms computed
in the kernel and from tables; right and left padding and holes inside a sequence, padded and packed
(padding_free and forward_packed), CUDA graphs on (a batch op by op, then recorded and replayed);
float32 (the unfused path) within 1e-4 of transformers in float32 on the CPU, float16 and bfloat16
(flash and unfused) within twice transformers' own error in that dtype + 1e-3; both heads; and the
unfused path's op, disentangled_scores, against the float64 reference and the CPU op (GPU only;
skipped without one)."""

import copy
import math

import numpy as np
import pytest
import torch

import ftbert
from tests._models import make_deberta, widen_head
from tests.core.test_deberta import sharpen
from tests.cpu.test_cpu_disentangled import columns, random_case, reference
from tests.cuda._hf import cuda_inputs as inputs
from tests.cuda._hf import masked_error as hidden_error
from tests.cuda._hf import run_hf

pytestmark = [
    pytest.mark.skipif(not ftbert.cuda_available(), reason="needs an NVIDIA GPU and a CUDA build"),
    pytest.mark.usefixtures("no_tf32"),
]

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
HALF = ["float16", "bfloat16"]
MAX_POS = 512
# v3's settings (no token types, no absolute positions, normed relative embeddings) with buckets a
# few hundred tokens get past: exact up to 16, log buckets up to 128, clamped beyond.
DEBERTA = dict(type_vocab=0, buckets=32, max_relative=128, max_pos=MAX_POS, vocab=157, layers=2)
# Head dim -> the model's sizes: the flash kernel's three head dims.
HEAD_DIMS = {32: dict(hidden=64, heads=2), 64: dict(hidden=128, heads=2, intermediate=301),
             128: dict(hidden=256, heads=2, intermediate=251)}


class Model:
    def __init__(self, path, hf):
        self.path, self.hf, self.peers = path, hf, {}

    def peer(self, dtype):
        """transformers' model in `dtype` on the GPU: the error the rule allows twice of."""
        if dtype not in self.peers:
            self.peers[dtype] = copy.deepcopy(self.hf).to("cuda", DTYPES[dtype]).eval()
        return self.peers[dtype]


def made(tmp_path_factory, name, kind="model", seed=0, **sizes):
    path = tmp_path_factory.mktemp(name)
    hf = make_deberta(path, kind=kind, num_labels=3, seed=seed, **{**DEBERTA, **sizes})
    sharpen(hf)  # scores of order 1: a term at the wrong distance shows
    if kind != "model":
        widen_head(hf)
    hf.save_pretrained(path)
    return Model(path, hf)


@pytest.fixture(scope="module", params=list(HEAD_DIMS), ids=lambda d: f"d{d}")
def model(request, tmp_path_factory):
    return made(tmp_path_factory, f"deberta-d{request.param}", seed=60 + request.param,
                **HEAD_DIMS[request.param])


# Which of two fresh batches each forward gets: the first op by op, then the second three times, so
# that it is seen, recorded and replayed (a packed batch's recording is per bucket of its token
# count, which two fresh batches need not share).
ORDER = (0, 1, 1, 1)


def batches(rng, m, batch, seq, style, order=ORDER):
    """(ids, mask, transformers' float32 hidden states) for each forward of `order`."""
    drawn = {}
    for i in order:
        if i not in drawn:
            ids, mask = inputs(rng, m.hf, batch, seq, style)
            drawn[i] = ids, mask, run_hf(m.hf, ids, mask)[0]
        yield drawn[i]


def check_half(m, enc, rng, dtype, batch, seq, style, order=ORDER):
    """ftbert's error against transformers float32 at most twice transformers' own in `dtype` +
    1e-3, over the forwards of `order`; graphs recorded and replayed."""
    ours = theirs = 0.0
    for ids, mask, ref in batches(rng, m, batch, seq, style, order):
        out = enc(ids, mask).last_hidden_state
        assert out.dtype == DTYPES[dtype] and torch.isfinite(out).all()
        ours = max(ours, hidden_error(out, ref, mask))
        theirs = max(theirs, hidden_error(run_hf(m.peer(dtype), ids, mask)[0], ref, mask))
    assert ours <= 2 * theirs + 1e-3, f"ftbert {ours:.3e} vs transformers {theirs:.3e}"
    assert enc.recorded_shapes >= 1


SHAPES = [(3, 300, "right"), (2, 200, "left"), (3, 97, "holes")]


@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("batch,seq,style", SHAPES)
def test_float32_matches_transformers(model, rng, padding_free, batch, seq, style):
    # float32 runs the unfused path (flash needs a half dtype on the GPU): QKᵀ, disentangled_scores,
    # the masked softmax.
    enc = ftbert.Encoder.from_pretrained(model.path, device="cuda", dtype="float32", attention="unfused",
                                         padding_free=padding_free)
    assert enc.cuda_graphs
    for ids, mask, ref in batches(rng, model, batch, seq, style):
        out = enc(ids, mask).last_hidden_state
        assert torch.isfinite(out).all()
        err = hidden_error(out, ref, mask)
        assert err <= 1e-4, f"hidden {err:.2e}"
    assert enc.recorded_shapes >= 1


# How the forwards run: padded; packed; or as loaded by default, where batch_invariant="auto" turns
# invariance on wherever the flash kernel computes the terms (head dim 64): packed, on its
# invariant kernels.
LAYOUTS = {"padded": dict(padding_free=False), "packed": dict(padding_free=True, batch_invariant=False),
           "default": {}}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("attention", ["unfused", "flash"])
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("batch,seq,style", SHAPES)
def test_half_precision_within_twice_transformers(model, rng, dtype, attention, layout, batch, seq, style):
    enc = ftbert.Encoder.from_pretrained(model.path, device="cuda", dtype=dtype, attention=attention,
                                         **LAYOUTS[layout])
    assert enc.attention_for(batch, seq) == attention
    assert enc.batch_invariant == (layout == "default" and enc._native.terms_in_attention and attention == "flash")
    check_half(model, enc, rng, dtype, batch, seq, style)


def wide_batch(heads, seq):
    """The least batch whose grid the flash kernel runs on its wide tiles: at least two blocks of
    128 query rows per multiprocessor (flash.cu's launch_flash_for_head_dim)."""
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return math.ceil(2 * sms / (math.ceil(seq / 128) * heads))


def term_tables(monkeypatch, on):
    """Whether encoders loaded from now on add DeBERTa's terms from tables at head dim 64, or have
    the flash kernel compute them there (the default; other head dims always read tables)."""
    monkeypatch.setenv("FTBERT_DEBERTA_TERM_TABLES", "1" if on else "0")


@pytest.mark.parametrize("tables", [False, True], ids=["inline", "tables"])
@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("dtype", HALF)
def test_the_wide_and_128_key_flash_tiles_add_the_terms(model, rng, monkeypatch, dtype, padding_free,
                                                        tables):
    # A grid of two blocks per multiprocessor: the table kernel's wide tiles (Br = 128) at head
    # dims 32 and 64, and at 64 over more than 256 keys its 128-key tiles (head dim 128 has narrow
    # tiles only); the inline kernel at head dim 64 on a grid that deep.
    heads = model.hf.config.num_attention_heads
    batch = wide_batch(heads, 300)
    term_tables(monkeypatch, tables)
    enc = ftbert.Encoder.from_pretrained(model.path, device="cuda", dtype=dtype, attention="flash",
                                         padding_free=padding_free, batch_invariant=False)
    assert enc.attention_for(batch, 300) == "flash"
    check_half(model, enc, rng, dtype, batch, 300, "right", order=(0, 0, 0))


@pytest.fixture(scope="module", params=["p2c|c2p", "c2p", "p2c"], ids=lambda t: t.replace("|", "+"))
def real_buckets(request, tmp_path_factory):
    """v3's 256 buckets over 512 positions: at 300 tokens the term tables are a few hundred columns
    wide (exact up to 128, log buckets beyond), each term type alone and both."""
    return made(tmp_path_factory, "deberta-b256-" + request.param.replace("|", "-"), seed=7,
                buckets=256, max_relative=512, pos_att_type=request.param, **HEAD_DIMS[64])


@pytest.mark.parametrize("tables", [False, True], ids=["inline", "tables"])
@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("batch,seq,style", SHAPES)
def test_flash_adds_the_real_buckets_terms(real_buckets, rng, monkeypatch, dtype, padding_free, batch,
                                           seq, style, tables):
    term_tables(monkeypatch, tables)
    enc = ftbert.Encoder.from_pretrained(real_buckets.path, device="cuda", dtype=dtype,
                                         attention="flash", padding_free=padding_free, batch_invariant=False)
    assert enc.attention_for(batch, seq) == "flash"
    check_half(real_buckets, enc, rng, dtype, batch, seq, style)


@pytest.mark.parametrize("dtype", HALF)
def test_terms_computed_in_the_kernel_need_no_term_tables(real_buckets, rng, monkeypatch, dtype):
    # The same batch through both ways: the same outputs within the rounding of the terms (the
    # tables round each term to the dtype, the kernel its products the same way, summed in another
    # order), and a workspace without the two [heads, rows, width] tables (width >= 256 here: 128
    # exact distances either side).
    ids, mask = inputs(rng, real_buckets.hf, 3, 300, "right")
    outs, workspace = {}, {}
    for tables in (False, True):
        term_tables(monkeypatch, tables)
        enc = ftbert.Encoder.from_pretrained(real_buckets.path, device="cuda", dtype=dtype,
                                             attention="flash")
        outs[tables] = enc(ids, mask).last_hidden_state.float()
        workspace[tables] = enc.workspace_bytes
    heads = real_buckets.hf.config.num_attention_heads
    tokens = int(mask.sum())
    assert workspace[True] - workspace[False] >= 2 * heads * tokens * 256 * 2
    ref = run_hf(real_buckets.hf, ids, mask)[0]
    theirs = hidden_error(run_hf(real_buckets.peer(dtype), ids, mask)[0], ref, mask)
    between = hidden_error(outs[False], outs[True].cpu(), mask)
    assert between <= 2 * theirs + 1e-3, f"inline vs tables {between:.3e} (transformers {theirs:.3e})"


@pytest.mark.parametrize("attention", ["unfused", "flash"])
@pytest.mark.parametrize("dtype", ["float32", *HALF])
def test_forward_packed_matches_transformers(model, rng, dtype, attention):
    # Sequences one after another from CUDA tensors: each one's distances start at its first token.
    if dtype == "float32" and attention == "flash":
        pytest.skip("float32 runs the unfused path")
    enc = ftbert.Encoder.from_pretrained(model.path, device="cuda", dtype=dtype, attention=attention)
    ids, mask = inputs(rng, model.hf, 4, 300, "right")
    ref, _ = run_hf(model.hf, ids, mask)
    m = mask.bool()
    cu = np.concatenate([[0], np.cumsum(m.sum(1).cpu().numpy())])
    for _ in range(3):
        packed = enc.forward_packed(ids[m], cu).last_hidden_state
        assert packed.shape == (cu[-1], model.hf.config.hidden_size) and torch.isfinite(packed).all()
        ours = (packed.float().cpu() - ref[m.cpu()]).abs().max().item()
        if dtype == "float32":
            assert ours <= 1e-4, f"hidden {ours:.2e}"
        else:
            theirs = hidden_error(run_hf(model.peer(dtype), ids, mask)[0], ref, mask)
            assert ours <= 2 * theirs + 1e-3, f"ftbert {ours:.3e} vs transformers {theirs:.3e}"


@pytest.fixture(scope="module", params=["cls", "token"])
def headed(request, tmp_path_factory):
    return made(tmp_path_factory, f"deberta-{request.param}", kind=request.param, seed=70, **HEAD_DIMS[64])


@pytest.mark.parametrize("attention", ["unfused", "flash"])
@pytest.mark.parametrize("dtype", ["float32", *HALF])
def test_heads_match_transformers(headed, rng, dtype, attention):
    if dtype == "float32" and attention == "flash":
        pytest.skip("float32 runs the unfused path")
    enc = ftbert.Encoder.from_pretrained(headed.path, device="cuda", dtype=dtype, attention=attention)
    ids, mask = inputs(rng, headed.hf, 24, 150, "right")  # token 0 attended in every row
    ref_h, ref_l = run_hf(headed.hf, ids, mask)
    out = enc(ids, mask)
    valid = mask.bool().cpu()
    d = (out.logits.float().cpu() - ref_l).abs()
    e_l = (d if d.dim() == 2 else d[valid]).max().item()
    if dtype == "float32":
        assert hidden_error(out.last_hidden_state, ref_h, mask) <= 1e-4
        assert e_l <= 1e-4, f"logits {e_l:.2e}"
        return
    _, peer_l = run_hf(headed.peer(dtype), ids, mask)
    d = (peer_l - ref_l).abs()
    theirs = (d if d.dim() == 2 else d[valid]).max().item()
    assert e_l <= 2 * theirs + 1e-3, f"logits: ftbert {e_l:.3e} vs transformers {theirs:.3e}"


# ---- the op ----------------------------------------------------------------------------------------


def rounded(x, dtype):
    """x as the op sees it after the upload in `dtype`, float32."""
    return torch.from_numpy(x).to(DTYPES[dtype]).float().numpy()


# (batch, heads, seq, buckets, max_relative, P): tiny, odd, past the buckets and the clamp, more
# positions in the table than the batch reaches, more rows than a block.
OP_SHAPES = [(1, 1, 1, 8, 16, 1), (2, 3, 37, 8, 16, 64), (3, 2, 300, 32, 128, 512), (1, 4, 61, -1, 12, 64),
             (2, 1, 1030, 256, 512, 1100)]


@pytest.mark.parametrize("terms", ["c2p", "p2c", "c2p|p2c"])
@pytest.mark.parametrize("dtype", ["float32", *HALF])
@pytest.mark.parametrize("batch,heads,seq,buckets,max_relative,positions", OP_SHAPES)
def test_disentangled_scores_match_the_reference_and_the_cpu(gpu, cpu, rng, dtype, terms, batch, heads, seq,
                                                             buckets, max_relative, positions):
    column = columns(buckets, max_relative, positions)
    scores, c2p, p2c = random_case(rng, batch, heads, seq, column, terms,
                                   round_to=lambda x: rounded(x, dtype))
    got = gpu.disentangled_scores(dtype, scores, column, c2p=c2p, p2c=p2c)
    want = reference(scores, column, c2p, p2c)
    # Added in float32 and rounded once: within half an ulp of the dtype (2^-24, 2^-11 and 2^-9
    # relative; doubled for margin) of the float64 sum, plus float32's rounding of the sum.
    ulp = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-8}[dtype]
    magnitude = reference(np.abs(scores), column, None if c2p is None else np.abs(c2p),
                          None if p2c is None else np.abs(p2c))
    bound = ulp * np.abs(want) + 1e-6 * magnitude
    excess = np.abs(got - want) - bound
    assert np.isfinite(got).all() and excess.max() <= 0, f"excess {excess.max():.2e}"
    if dtype != "float16":  # the CPU backend has no float16
        # Each within the bound of the reference: within twice it of each other (the two may sum
        # c2p and p2c in another order and round a tie apart).
        mine = cpu.disentangled_scores(dtype, scores, column, c2p=c2p, p2c=p2c)
        assert (np.abs(got - mine) - 2 * bound).max() <= 0
