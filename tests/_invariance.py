"""Batch-composition checks shared by the CPU and GPU batch-invariance tests: Hypothesis draws a
batch around a reference sequence, and the reference's outputs in it are compared bit for bit with
its outputs alone."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

VOCAB = 151

settings.register_profile(
    "ftbert-invariance", deadline=None, database=None, print_blob=True, max_examples=12,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@st.composite
def compositions(draw, left_ok: bool, max_len: int = 40, max_seq: int = 48):
    length = draw(st.integers(1, max_len))
    batch = draw(st.integers(1, 64))
    seq = draw(st.integers(length, max_seq))
    place = draw(st.integers(0, batch - 1))
    left = left_ok and draw(st.booleans())
    lengths = draw(st.lists(st.integers(1, seq), min_size=batch, max_size=batch))
    seed = draw(st.integers(0, 2**31 - 1))
    return length, batch, seq, place, left, lengths, seed


def make_batch(length, batch, seq, place, left, lengths, seed, ref, pad):
    """[batch, seq] ids and mask with random other sequences, the reference's ids at `place`, and
    the reference's span in its row."""
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


def check_invariance(enc, kind: str, pad: int, left_ok: bool, first_token_always: bool,
                     run=None, max_len: int = 40, max_seq: int = 48, examples: int | None = None):
    """Draws compositions and asserts the reference's outputs equal its outputs alone, bit for bit.
    run(ids, mask) -> (hidden, pooled, logits) as numpy (default: enc's host forward);
    first_token_always: pooled output and sequence logits are the first real token's even under
    left padding (packed batches)."""
    def host(ids, mask):
        out = enc(ids, mask)
        return out.last_hidden_state, out.pooler_output, out.logits

    run = run or host
    rng = np.random.default_rng(5)
    refs = {}
    profile = settings.get_profile("ftbert-invariance")
    if examples is not None:
        profile = settings(profile, max_examples=examples)

    @settings(profile)
    @given(compositions(left_ok, max_len, max_seq))
    def check(comp):
        length, place = comp[0], comp[3]
        if length not in refs:  # the sequence alone, unpadded
            ids = rng.integers(3, VOCAB, length)
            refs[length] = ids, run(ids[None], np.ones((1, length), np.int32))
        ids_ref, (hidden, pooled, logits) = refs[length]
        ids, mask, span = make_batch(*comp, ref=ids_ref, pad=pad)
        got_hidden, got_pooled, got_logits = run(ids, mask)
        np.testing.assert_array_equal(got_hidden[place, span], hidden[0])
        if kind == "token":
            np.testing.assert_array_equal(got_logits[place, span], logits[0], err_msg="logits")
            return
        # A padded row's first token is the reference's first only with right padding; packed
        # batches read each sequence's first real token.
        if span.start == 0 or first_token_always:
            for name, got, want in (("pooler_output", got_pooled, pooled), ("logits", got_logits, logits)):
                if want is not None:
                    np.testing.assert_array_equal(got[place], want[0], err_msg=name)

    check()


def make_invariance_model(path, family: str, kind: str, hidden: int, heads: int, seed: int, **extra):
    """A two-layer model of `family` with VOCAB ids and 3 labels; kind "mean" is a sequence classifier
    whose head reads the mean of the tokens (ModernBERT's or EuroBERT's classifier_pooling "mean"),
    "late" EuroBERT's that averages its dense's activations over the tokens."""
    from tests._models import make_model

    if kind == "late":
        extra = {**extra, "pooling": "late"}
    hf = make_model(path, family, head_kind(kind), hidden=hidden, heads=heads, layers=2,
                    vocab=VOCAB, num_labels=3, seed=seed, **extra)
    if kind == "mean":
        hf.config.classifier_pooling = "mean"
        hf.save_pretrained(path)
    return hf


def head_kind(kind: str) -> str:
    """The head check_invariance compares: a "mean" or "late" head is a sequence head."""
    return "cls" if kind in ("mean", "late") else kind
