"""Batch invariance on the GPU (`batch_invariant=True`): a reference sequence's outputs (hidden
states at its tokens, pooled output, head logits) are the same bits whatever else is in the batch,
its size (up to 64) and padded length, the reference's place, host or CUDA-tensor inputs, CUDA
graphs on or off, in float16 and bfloat16, across threads on their own streams, between processes,
and through `encode`; Hypothesis draws the compositions. A padded call (padded=True), which stays
padded on the invariant kernels, keeps a sequence's bits in any batch of its padded length. The
models cover the Hopper attention kernel (head dim 64), the portable one (head dim 32, MPNet's
relative bias, ModernBERT's windows and rotary, DeBERTa's disentangled terms from the ordered
batched GEMM), a sequence head on the pooler and a token head. float32 and the unfused attention
(the ordered GEMM kernel and softmax variant) hold it too."""

import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

import ftbert
from tests._invariance import VOCAB, check_invariance, head_kind, make_batch, make_invariance_model
from tests._models import make_model, minilm_path

pytestmark = pytest.mark.skipif(not ftbert.cuda_available(), reason="needs an NVIDIA GPU and a CUDA build")

# (family, kind, hidden, heads) -> whether left padding leaves the positions alone (as in
# tests/core/test_batch_invariance.py). "mean": ModernBERT's head on the mean of the tokens.
MODELS = {("bert", "cls", 128, 2): False, ("bert", "cls", 96, 3): False, ("roberta", "cls", 128, 2): True,
          ("mpnet", "cls", 128, 2): True, ("modernbert", "cls", 128, 2): False,
          ("modernbert", "mean", 128, 2): False, ("electra", "token", 128, 2): False,
          ("deberta-v2", "cls", 128, 2): True, ("deberta-v2", "cls", 96, 3): True}


@pytest.fixture(scope="module", params=list(MODELS), ids=lambda m: f"{m[0]}-{m[1]}-d{m[2] // m[3]}")
def model(request, tmp_path_factory):
    family, kind, hidden, heads = request.param
    path = tmp_path_factory.mktemp(family)
    hf = make_invariance_model(path, family, kind, hidden=hidden, heads=heads, seed=23)
    return request.param, path, hf.config.pad_token_id or 0


def _numpy(t):
    return None if t is None else t.float().cpu().numpy()


def cuda_run(enc):
    """(ids, mask) -> the outputs as numpy, the inputs given as CUDA tensors."""
    def run(ids, mask):
        out = enc(torch.from_numpy(ids).cuda(), torch.from_numpy(mask).cuda())
        return _numpy(out.last_hidden_state), _numpy(out.pooler_output), _numpy(out.logits)
    return run


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("inputs", ["host", "cuda"])
@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "no-graphs"])
def test_a_sequence_gives_the_same_bits_in_any_batch(model, dtype, inputs, graphs):
    (family, kind, _, _), path, pad = model
    enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype=dtype, cuda_graphs=graphs,
                                         batch_invariant=True)
    check_invariance(enc, head_kind(kind), pad, left_ok=MODELS[model[0]], first_token_always=True,
                     run=cuda_run(enc) if inputs == "cuda" else None)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("inputs", ["host", "cuda"])
def test_a_padded_call_gives_the_same_bits_in_any_batch_of_its_length(model, dtype, inputs):
    # padded=True runs padded on the invariant kernels (encode_multivector's ColBERT queries): a
    # sequence's rows, its masked positions' too, are the same bits whatever else is in a batch of
    # its padded length and its place there.
    _, path, _ = model
    enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype=dtype, batch_invariant=True)
    rng = np.random.default_rng(11)
    S, length = 37, 23
    ref_ids, ref_mask = rng.integers(3, VOCAB, S), (np.arange(S) < length).astype(np.int32)

    def run(ids, mask):
        if inputs == "cuda":
            ids, mask = torch.from_numpy(ids).cuda(), torch.from_numpy(mask).cuda()
        out = enc(ids, mask, padded=True)
        return [None if t is None else _numpy(t) if inputs == "cuda" else np.asarray(t, np.float32)
                for t in (out.last_hidden_state, out.pooler_output, out.logits)]

    alone = run(ref_ids[None], ref_mask[None])
    assert np.abs(alone[0][0, length:]).max() > 0  # the masked positions' rows are computed
    for batch, place in ((2, 1), (9, 4), (33, 0), (64, 63)):
        ids = rng.integers(3, VOCAB, (batch, S))
        mask = (np.arange(S)[None] < rng.integers(1, S + 1, (batch, 1))).astype(np.int32)
        ids[place], mask[place] = ref_ids, ref_mask
        for name, got, want in zip(("last_hidden_state", "pooler_output", "logits"), run(ids, mask), alone):
            if want is not None:
                np.testing.assert_array_equal(got[place], want[0], err_msg=f"{name}, batch {batch}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_long_sequences_and_large_batches(tmp_path, dtype):
    # Several key tiles per sequence and up to 64 x 300 rows: every GEMM row count on one kernel.
    make_model(tmp_path, "bert", "cls", hidden=128, heads=2, layers=2, vocab=VOCAB, num_labels=3, seed=3,
               max_position_embeddings=512)
    enc = ftbert.Encoder.from_pretrained(tmp_path, device="cuda", dtype=dtype, batch_invariant=True)
    check_invariance(enc, "cls", 0, left_ok=False, first_token_always=True, max_len=260, max_seq=300,
                     examples=8)


def test_threads_on_their_own_streams(tmp_path):
    make_model(tmp_path, "bert", "cls", hidden=128, heads=2, layers=2, vocab=VOCAB, num_labels=3, seed=4)
    enc = ftbert.Encoder.from_pretrained(tmp_path, device="cuda", dtype="float16", concurrency=4,
                                         batch_invariant=True)
    rng = np.random.default_rng(0)
    ref = rng.integers(3, VOCAB, 37)
    alone = enc(ref[None], np.ones((1, 37), np.int32)).last_hidden_state[0]
    cases = []
    for seed in range(24):
        batch = int(rng.integers(1, 65))
        cases.append((batch, [int(n) for n in rng.integers(1, 49, batch)], seed))

    def work(case):
        batch, lengths, seed = case
        place = seed % batch
        ids, mask, span = make_batch(37, batch, 48, place, False, lengths, seed, ref, 0)
        with torch.cuda.stream(torch.cuda.Stream()):
            out = enc(torch.from_numpy(ids).cuda(), torch.from_numpy(mask).cuda())
            return out.last_hidden_state[place, span].float().cpu().numpy()

    with ThreadPoolExecutor(4) as pool:
        for got in pool.map(work, cases):
            np.testing.assert_array_equal(got, alone.astype(np.float32))


def test_between_processes(tmp_path):
    make_model(tmp_path / "m", "bert", "cls", hidden=128, heads=2, layers=2, vocab=VOCAB, num_labels=3, seed=6)
    rng = np.random.default_rng(1)
    ref = rng.integers(3, VOCAB, 29)
    np.save(tmp_path / "ref.npy", ref)
    # The other process runs the reference inside a batch of 40 ragged sequences, at row 17.
    script = textwrap.dedent(f"""
        import numpy as np, ftbert
        from tests._invariance import make_batch
        ref = np.load({str(tmp_path / 'ref.npy')!r})
        enc = ftbert.Encoder.from_pretrained({str(tmp_path / 'm')!r}, device="cuda", dtype="bfloat16",
                                             batch_invariant=True)
        lengths = list(np.random.default_rng(2).integers(1, 61, 40))
        ids, mask, span = make_batch(29, 40, 60, 17, False, lengths, 9, ref, 0)
        out = enc(ids, mask)
        np.save({str(tmp_path / 'other.npy')!r}, out.last_hidden_state[17, span].astype(np.float32))
        np.save({str(tmp_path / 'other-pooled.npy')!r}, out.pooler_output[17].astype(np.float32))
    """)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    enc = ftbert.Encoder.from_pretrained(tmp_path / "m", device="cuda", dtype="bfloat16", batch_invariant=True)
    alone = enc(ref[None], np.ones((1, 29), np.int32))
    np.testing.assert_array_equal(np.load(tmp_path / "other.npy"), alone.last_hidden_state[0].astype(np.float32))
    np.testing.assert_array_equal(np.load(tmp_path / "other-pooled.npy"), alone.pooler_output[0].astype(np.float32))


def test_encode_honours_it():
    enc = ftbert.Encoder.from_pretrained(minilm_path(), device="cuda", dtype="float16", batch_invariant=True)
    rng = np.random.default_rng(3)
    words = ["alpha", "beta", "gamma", "delta", "river", "stone", "light", "engine", "quiet", "north"]
    others = [" ".join(rng.choice(words, int(rng.integers(1, 120)))) for _ in range(300)]
    text = "the same sentence, embedded alone and among three hundred others"
    alone = enc.encode([text])
    among = enc.encode(others[:150] + [text] + others[150:])
    np.testing.assert_array_equal(among[150], alone[0])


@pytest.mark.parametrize("dtype,attention", [("float32", "auto"), ("float16", "unfused"), ("bfloat16", "unfused")])
def test_float32_and_the_unfused_attention_hold_it_too(model, dtype, attention):
    # Their products run on the ordered kernel and the softmax on its ordered variant (float32's
    # "auto" is the unfused path).
    (family, kind, _, _), path, pad = model
    enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype=dtype, attention=attention,
                                         batch_invariant=True)
    assert enc.attention_for(64, 48) == "unfused"
    check_invariance(enc, head_kind(kind), pad, left_ok=MODELS[model[0]], first_token_always=True,
                     examples=12)


@pytest.mark.parametrize("kind,labels", [("cls", 1), ("token", 1), ("token", 9), ("cls", 5)])
def test_heads_of_any_width(tmp_path, kind, labels):
    # A reranker's single score or a tagger's 9 labels: rows narrower than 16 bytes, which the
    # invariant GEMM kernels refuse, run on the ordered kernel.
    make_model(tmp_path, "bert", kind, hidden=128, heads=2, layers=2, vocab=VOCAB, num_labels=labels, seed=8)
    enc = ftbert.Encoder.from_pretrained(tmp_path, device="cuda", dtype="float16", batch_invariant=True)
    check_invariance(enc, kind, 0, left_ok=False, first_token_always=True, examples=6)
    plain = ftbert.Encoder.from_pretrained(tmp_path, device="cuda", dtype="float32", batch_invariant=False)
    ids, mask, _ = make_batch(23, 5, 31, 2, False, [23, 4, 31, 17, 1], 3, np.arange(3, 26), 0)
    got, want = enc(ids, mask).logits, plain(ids, mask).logits
    rows = mask.astype(bool) if kind == "token" else slice(None)
    np.testing.assert_allclose(got[rows].astype(np.float32), want[rows], rtol=2e-2, atol=2e-2)


def test_switching_it_on_and_off(tmp_path):
    make_model(tmp_path, "bert", "cls", hidden=128, heads=2, layers=1, vocab=VOCAB, num_labels=3, seed=5)
    enc = ftbert.Encoder.from_pretrained(tmp_path, device="cuda", dtype="float16", batch_invariant=True)
    assert enc.attention == "auto" and enc.batch_invariant
    with pytest.raises(TypeError, match="batch_invariant"):
        enc.batch_invariant = 1
    enc.batch_invariant = False  # and back: the per-shape kernels again
    enc.attention = "unfused"
    enc.batch_invariant = True
    assert enc.batch_invariant and enc.attention == "unfused"
    check_invariance(enc, "cls", 0, left_ok=False, first_token_always=True, examples=6)


def test_auto_turns_it_on_where_the_fast_kernels_keep_it(tmp_path, monkeypatch):
    # "auto": on for float16/bfloat16 with the fused attention and padding_free not False (for
    # DeBERTa: with its terms computed in the kernel, head dim 64); off for float32, the unfused
    # attention, padding_free=False and DeBERTa's term tables (ordered kernels, or padded forwards
    # asked for). It follows later changes; True and False stay. It is the default.
    bert, deberta = tmp_path / "bert", tmp_path / "deberta"
    make_model(bert, "bert", "cls", hidden=128, heads=2, layers=1, vocab=VOCAB, num_labels=3, seed=5)
    make_invariance_model(deberta, "deberta-v2", "cls", hidden=64, heads=2, seed=7)
    inline = tmp_path / "deberta-d64"
    make_invariance_model(inline, "deberta-v2", "cls", hidden=128, heads=2, seed=7)
    for dtype in ("float16", "bfloat16"):
        enc = ftbert.Encoder.from_pretrained(inline, device="cuda", dtype=dtype)
        assert enc._native.terms_in_attention and enc.batch_invariant is True, dtype
        check_invariance(enc, "cls", 0, left_ok=True, first_token_always=True, examples=4)
    with monkeypatch.context() as m:
        m.setenv("FTBERT_DEBERTA_TERM_TABLES", "1")
        enc = ftbert.Encoder.from_pretrained(inline, device="cuda", dtype="float16")
        assert not enc._native.terms_in_attention and enc.batch_invariant is False
    for dtype in ("float16", "bfloat16"):
        assert ftbert.Encoder.from_pretrained(bert, device="cuda", dtype=dtype).batch_invariant is True
        assert ftbert.Encoder.from_pretrained(bert, device="cuda", dtype=dtype,
                                              batch_invariant=False).batch_invariant is False
    off = [dict(dtype="float32"), dict(dtype="float16", attention="unfused"),
           dict(dtype="float16", padding_free=False)]
    for kwargs in off:
        enc = ftbert.Encoder.from_pretrained(bert, device="cuda", batch_invariant="auto", **kwargs)
        assert enc.batch_invariant is False, kwargs
    assert ftbert.Encoder.from_pretrained(deberta, device="cuda", dtype="float16",
                                          batch_invariant="auto").batch_invariant is False
    enc = ftbert.Encoder.from_pretrained(bert, device="cuda", dtype="float16", batch_invariant="auto")
    enc.attention = "unfused"
    assert enc.batch_invariant is False
    enc.attention = "flash"
    assert enc.batch_invariant is True
    check_invariance(enc, "cls", 0, left_ok=False, first_token_always=True, examples=6)
    enc.padding_free = False
    assert enc.batch_invariant is False
    enc.batch_invariant = True  # stays on whatever the other settings
    enc.attention = "unfused"
    assert enc.batch_invariant is True and enc.padding_free is False
    enc.batch_invariant = "auto"
    assert enc.batch_invariant is False
    forced = ftbert.Encoder.from_pretrained(bert, device="cuda", dtype="float16", batch_invariant=False)
    forced.attention = "flash"
    assert forced.batch_invariant is False
