"""encode's batching (python/ftbert/text.py): tokenized chunks reordered longest first and cut
into batches, checked against a plain per-sequence model of the same rules."""

import gc
import threading

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ftbert.text import _Batch, _cut, _longest_first, _tokenize, _tokenize_flat, warm_up_token_counts
from ftbert.tokenization import TextTokenizer


def _chunk(rng, index, lengths, with_types):
    ids = rng.integers(0, 30000, int(sum(lengths)), dtype=np.int32)
    types = rng.integers(0, 2, len(ids), dtype=np.int32) if with_types else None
    return ids, types, np.asarray(lengths, dtype=np.int64)


def _sequences(index, ids, types, lengths):
    """{index: (ids, types)} of a flat layout."""
    out, at = {}, 0
    for i, n in zip(index, lengths):
        out[int(i)] = (ids[at : at + n].tolist(), None if types is None else types[at : at + n].tolist())
        at += n
    return out


def _reference_batches(lengths_in_order, max_tokens, max_sequences):
    """The greedy rule on a plain list: batch sizes in order."""
    sizes, count, longest = [], 0, 0
    for n in lengths_in_order:
        if count and ((count + 1) * max(longest, n) > max_tokens or count == max_sequences):
            sizes.append(count)
            count, longest = 0, 0
        count += 1
        longest = max(longest, n)
    return sizes + ([count] if count else [])


@settings(max_examples=60, deadline=None)
@given(chunks=st.lists(st.lists(st.integers(1, 40), min_size=1, max_size=23), min_size=1, max_size=5),
       max_tokens=st.integers(1, 200), max_sequences=st.integers(1, 9), with_types=st.booleans(),
       seed=st.integers(0, 2**31))
def test_cut_keeps_every_sequence_in_order_within_the_limits(chunks, max_tokens, max_sequences,
                                                              with_types, seed):
    rng = np.random.default_rng(seed)
    flats, expected, order, start = [], {}, [], 0
    for lengths in chunks:
        index = np.arange(start, start + len(lengths), dtype=np.int64)
        start += len(lengths)
        ids, types, lens = _chunk(rng, index, lengths, with_types)
        expected.update(_sequences(index, ids, types, lens))
        chunk = _longest_first(index, ids, types, lens)
        # Longest first inside the chunk, ties in the given order.
        order += sorted(index.tolist(), key=lambda i: (-lens[i - index[0]], i))
        assert chunk.index.tolist() == order[-len(lengths):]
        flats.append(chunk)

    batches = list(_cut(flats, max_tokens, max_sequences))
    seen = [int(i) for b in batches for i in b.index]
    assert seen == order
    got = {}
    for b in batches:
        assert isinstance(b, _Batch) and b.cu_seqlens[0] == 0 and b.cu_seqlens[-1] == len(b.input_ids)
        got.update(_sequences(b.index, b.input_ids, b.token_type_ids, np.diff(b.cu_seqlens)))
        lens = np.diff(b.cu_seqlens)
        assert len(lens) <= max_sequences
        assert len(lens) == 1 or len(lens) * lens.max() <= max_tokens
    assert got == expected
    all_lengths = [len(expected[i][0]) for i in order]
    assert [len(b.index) for b in batches] == _reference_batches(all_lengths, max_tokens, max_sequences)


def test_cut_mixes_chunks_with_and_without_type_ids():
    rng = np.random.default_rng(3)
    a = _longest_first(np.array([0, 1]), *_chunk(rng, None, [3, 2], False))
    b = _longest_first(np.array([2]), *_chunk(rng, None, [4], True))
    (batch,) = _cut([a, b], 100, 10)
    assert batch.token_type_ids[:5].tolist() == [0] * 5
    assert batch.token_type_ids[5:].tolist() == b.token_type_ids.tolist()


class _ListTokenizer:
    """transformers' calling convention: lists of ids per text."""

    def __call__(self, texts, truncation, max_length, return_attention_mask):
        ids = [[101] + [1000 + len(w) for w in t.split()][: max_length - 2] + [102] for t in texts]
        return {"input_ids": ids, "token_type_ids": [[0] * len(s) for s in ids]}


def test_tokenize_flat_gives_the_lists_of_a_list_tokenizer():
    texts = ["a bb ccc", "dddd", "e " * 50]
    ids, types, lengths = _tokenize_flat(_ListTokenizer(), texts, 16)
    expected = _ListTokenizer()(texts, True, 16, False)["input_ids"]
    assert lengths.tolist() == [len(s) for s in expected]
    assert ids.tolist() == [t for s in expected for t in s]
    assert ids.dtype == np.int32 and types.tolist() == [0] * len(ids)


def test_tokenize_names_the_text_that_gives_no_tokens():
    class Empty(_ListTokenizer):
        def __call__(self, texts, **kw):
            return {"input_ids": [[] if t == "" else [5] for t in texts]}

    with pytest.raises(ValueError, match=r"texts\[1\] gives no tokens"):
        list(_tokenize(Empty(), threading.Lock(), ["x", "", "y"], [0, 1, 2], 8))


def test_direct_tokenizer_batches_leave_no_lists_behind():
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers

    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate("abcdefgh")}}
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.enable_truncation(max_length=6)
    direct = TextTokenizer(tok, 6)
    texts = ["a b c", "d e f g h a b", "h"] * 300
    gc.collect()
    before = len(gc.get_objects())
    ids, types, lengths = direct.flat(texts)
    assert len(gc.get_objects()) - before < 50  # not one container per text
    assert lengths.tolist() == [3, 6, 1] * 300
    assert ids[:3].tolist() == [1, 2, 3] and types is None
    assert ids.tolist() == [t for s in direct(texts, max_length=6)["input_ids"] for t in s]


def test_pack_sequences_lays_out_the_server_batchers_sequences():
    from ftbert.text import pack_sequences

    ids = [np.array([5, 6, 7], np.int32), np.array([8], np.int32), np.array([9, 10], np.int32)]
    b = pack_sequences(ids, [None, np.array([1], np.int32), None])
    assert b.index.tolist() == [0, 1, 2] and b.cu_seqlens.tolist() == [0, 3, 4, 6]
    assert b.input_ids.tolist() == [5, 6, 7, 8, 9, 10] and b.input_ids.dtype == np.int32
    assert b.token_type_ids.tolist() == [0, 0, 0, 1, 0, 0]
    assert pack_sequences(ids, [None] * 3).token_type_ids is None


def _rows_bucket(m: int) -> int:
    """The GPU's GEMM row bucket (gemm_tuner.h): m up to a multiple of an eighth of the power of
    two at or above it."""
    top = 1 << max(0, (m - 1).bit_length())
    step = top // 8 if top >= 8 else 1
    return -(-m // step) * step


@pytest.mark.parametrize("max_tokens", [1, 37, 300, 511, 4096, 5000, 16384])
def test_warm_up_meets_every_row_bucket_up_to_its_limit(max_tokens):
    counts = warm_up_token_counts(max_tokens)
    assert counts == sorted(set(counts)) and counts[-1] == max_tokens and counts[0] >= 1
    met = {_rows_bucket(c) for c in counts}
    missing = sorted({_rows_bucket(m) for m in range(256, max_tokens + 1)} - met)
    assert not missing, missing
