"""Batch invariance on the CPU: a reference sequence's outputs (hidden states at its tokens, pooler,
head logits) are the same bits whatever else is in the batch, the batch's size (up to 64) and
padded length, the reference's place in it, padded or packed, fused or unfused attention, and (for
families whose positions do not move with it) padding on the left. Hypothesis draws the
compositions.

What makes it hold on the CPU backend: every GEMM runs on the panel kernel, which sums each element
over k in order whatever the number of rows (cpp/cpu/gemm.cpp); the softmax sums a row's keys from
its first attended one; the other ops work row by row. Padding adds exact zeros. The GPU is not
covered: its GEMM kernels depend on the row count."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ftbert
from ftbert import _C
from tests._models import make_model

VOCAB = 151
# (family, kind) -> whether a left-padded row's positions are a right-padded one's (RoBERTa's
# counted positions and MPNet's; BERT's absolute ones and ModernBERT's rotary angles move with the
# padding). ELECTRA's embeddings are narrower than its layers (the projection GEMM) and it runs
# the token head.
MODELS = {("bert", "cls"): False, ("roberta", "cls"): True, ("mpnet", "cls"): True,
          ("distilbert", "cls"): False, ("electra", "token"): False, ("modernbert", "cls"): False}
DTYPES = ["float32"] + ([] if _C.cpu_dtype_unsupported_reason("bfloat16") else ["bfloat16"])

settings.register_profile(
    "ftbert-invariance", deadline=None, database=None, print_blob=True, max_examples=12,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module", params=list(MODELS), ids=lambda m: "-".join(m))
def model(request, tmp_path_factory):
    family, kind = request.param
    path = tmp_path_factory.mktemp(family)
    hf = make_model(path, family, kind, hidden=48, heads=3, layers=2, vocab=VOCAB, num_labels=3, seed=21)
    return request.param, path, hf.config.pad_token_id or 0


@st.composite
def compositions(draw, left_ok: bool):
    length = draw(st.integers(1, 40))
    batch = draw(st.integers(1, 64))
    seq = draw(st.integers(length, 48))
    place = draw(st.integers(0, batch - 1))
    left = left_ok and draw(st.booleans())
    lengths = draw(st.lists(st.integers(1, seq), min_size=batch, max_size=batch))
    seed = draw(st.integers(0, 2**31 - 1))
    return length, batch, seq, place, left, lengths, seed


def _batch(length, batch, seq, place, left, lengths, seed, ref, pad):
    """[batch, seq] ids and mask with random other sequences, the reference's ids at `place`."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, VOCAB, (batch, seq))
    mask = np.zeros((batch, seq), np.int32)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
    mask[place] = 0
    span = slice(seq - length, seq) if left else slice(0, length)
    mask[place, span] = 1
    ids[place, span] = ref
    ids[mask == 0] = pad
    return ids, mask, span


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("attention", ["unfused", "flash"])
@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "packed"])
def test_a_sequence_gives_the_same_bits_in_any_batch(model, dtype, attention, padding_free):
    (family, kind), path, pad = model
    enc = ftbert.Encoder.from_pretrained(path, dtype=dtype, attention=attention, padding_free=padding_free)
    rng = np.random.default_rng(5)
    refs = {}

    @settings(settings.get_profile("ftbert-invariance"))
    @given(compositions(MODELS[(family, kind)]))
    def check(comp):
        length, place = comp[0], comp[3]
        if length not in refs:  # the sequence alone, unpadded
            ids = rng.integers(3, VOCAB, length)
            refs[length] = ids, enc(ids[None], np.ones((1, length), np.int32))
        ids_ref, alone = refs[length]
        ids, mask, span = _batch(*comp, ref=ids_ref, pad=pad)
        out = enc(ids, mask)
        np.testing.assert_array_equal(out.last_hidden_state[place, span], alone.last_hidden_state[0])
        if kind == "token":
            np.testing.assert_array_equal(out.logits[place, span], alone.logits[0], err_msg="logits")
            return
        # A padded row's first token is the reference's first only with right padding; packed
        # batches read each sequence's first real token.
        if span.start == 0 or padding_free:
            for name in ("pooler_output", "logits"):
                got, want = getattr(out, name), getattr(alone, name)
                if want is not None:
                    np.testing.assert_array_equal(got[place], want[0], err_msg=name)

    check()
