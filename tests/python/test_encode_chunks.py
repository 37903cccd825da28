"""encode(long_texts="chunk"): a text longer than max_seq_length embedded in overlapping windows,
each wrapped in the tokenizer's special tokens and pooled, combined by a token-weighted mean; the
same as the windows embedded one by one through the engine; texts that fit give what truncation
gives; the default still truncates; bad settings are refused by name."""

import numpy as np
import pytest
import torch

import ftbert
from tests._models import make_bert
from tests._tokenizers import write_wordpiece_tokenizer
from tests._vocab import random_texts

MAX_POS = 48


@pytest.fixture(scope="module")
def enc(tmp_path_factory):
    path = tmp_path_factory.mktemp("chunks")
    make_bert(path, hidden=32, heads=2, layers=1, vocab=200, max_pos=MAX_POS, seed=4)
    write_wordpiece_tokenizer(path, 200, model_max_length=MAX_POS)
    return ftbert.Encoder.from_pretrained(path)


def long_text(rng, enc, tokens):
    text = ""
    while len(enc.tokenizer(text, add_special_tokens=False)["input_ids"]) < tokens:
        text += " " + random_texts(rng, 1)[0]
    return text.strip()


def window_reference(enc, text, overlap, pooling="mean"):
    """The chunked embedding computed by hand: windows, one forward each, weighted mean, norm."""
    ids = enc.tokenizer(text, add_special_tokens=False)["input_ids"]
    cls_id, sep_id = enc.tokenizer.cls_token_id, enc.tokenizer.sep_token_id
    width = enc.max_seq_length - 2
    vecs, weights = [], []
    start = 0
    while True:
        piece = ids[start:start + width]
        window = np.array([[cls_id, *piece, sep_id]])
        hidden = enc(window).last_hidden_state[0].astype(np.float64)
        vecs.append(hidden.mean(0) if pooling == "mean" else hidden[0])
        weights.append(len(piece))
        if start + width >= len(ids):
            break
        start += width - overlap
    v = np.average(np.stack(vecs), axis=0, weights=weights)
    return v / np.linalg.norm(v), len(vecs)


@pytest.mark.parametrize("tokens, overlap", [(MAX_POS * 3, 8), (MAX_POS + 5, 0), (200, 20)])
@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_a_long_text_is_the_weighted_mean_of_its_windows(enc, rng, tokens, overlap, pooling):
    text = long_text(rng, enc, tokens)
    want, windows = window_reference(enc, text, overlap, pooling)
    assert windows > 1
    got = enc.encode([text], pooling=pooling, long_texts="chunk", chunk_overlap=overlap)
    np.testing.assert_allclose(got[0], want, rtol=0, atol=2e-6)
    # ... which truncation does not give (mean pooling: the later windows' tokens count).
    if pooling == "mean":
        assert np.abs(enc.encode([text], pooling=pooling)[0] - want).max() > 1e-3


def test_texts_that_fit_give_what_truncation_gives(enc, rng):
    texts = random_texts(rng, 9)
    texts = [t for t in texts if len(enc.tokenizer(t)["input_ids"]) <= MAX_POS] + [""]
    np.testing.assert_allclose(enc.encode(texts, long_texts="chunk"), enc.encode(texts), rtol=0, atol=1e-6)


def test_mixed_lengths_keep_their_order_and_normalize_false(enc, rng):
    short = next(t for t in random_texts(rng, 30) if len(enc.tokenizer(t)["input_ids"]) <= MAX_POS)
    longer = long_text(rng, enc, 150)
    got = enc.encode([longer, short, longer], long_texts="chunk", normalize=False)
    np.testing.assert_array_equal(got[0], got[2])
    np.testing.assert_allclose(got[1], enc.encode([short], normalize=False)[0], rtol=0, atol=1e-6)
    want, _ = window_reference(enc, longer, 32 if 32 < MAX_POS - 2 else 0)
    np.testing.assert_allclose(got[0] / np.linalg.norm(got[0]), want, rtol=0, atol=2e-6)


@pytest.mark.parametrize("kwargs, message", [
    ({"long_texts": "split"}, "unknown long_texts 'split'"),
    ({"long_texts": "chunk", "chunk_overlap": MAX_POS}, "chunk_overlap 48 must be less than a window's 46 tokens"),
    ({"long_texts": "chunk", "chunk_overlap": -1}, "chunk_overlap must be a non-negative integer"),
])
def test_bad_settings_are_refused(enc, kwargs, message):
    with pytest.raises(ValueError, match=message):
        enc.encode(["a b c"], **kwargs)
