"""The padding-free ("packed") sequence layout on the CPU backend, op by op.

Packing (cu_seqlens, token_index) against a numpy reference; the scatter back to the padded layout
and the clearing of a bucket's rows past the tokens; and every layout-taking op run packed (the
OpRunner packs over its `mask=` argument, or `packed=True`) against the same op run padded: a packed
op must give the padded op's values at every attended position (bit for bit where both compute a
row the same way) and zeros, never stale values, where the padded layout has padding. Masks are
random, padded on the right, on the left, with holes inside, with empty rows, and full.
"""

import math

import numpy as np
import pytest

from ftbert import _ops
from tests._packing import SEQUENCE_MASK_STYLES, compacted, first_positions, pack_reference, sequence_mask
from tests._util import layernorm64

MASK_STYLES = SEQUENCE_MASK_STYLES


@pytest.fixture(scope="module")
def cpu():
    return _ops.OpRunner("cpu")


# ---- packing ----------------------------------------------------------------------------------


@pytest.mark.parametrize("style", MASK_STYLES)
@pytest.mark.parametrize("batch,seq", [(1, 1), (1, 9), (4, 1), (5, 13), (3, 64), (37, 33), (2, 520)])
def test_pack_sequences_matches_numpy(cpu, rng, style, batch, seq):
    mask = sequence_mask(rng, batch, seq, style)
    cu, index = cpu.pack_sequences(mask)
    want_cu, want_index = pack_reference(mask)
    assert cu.dtype == np.int32 and index.dtype == np.int32
    assert cu.shape == (batch + 1,) and index.shape == (batch * seq,)
    np.testing.assert_array_equal(cu, want_cu)
    np.testing.assert_array_equal(index, want_index)
    # Sequence b is rows cu[b]..cu[b+1]-1, all of them in row b of the padded batch, in order.
    for b in range(batch):
        rows = index[cu[b]:cu[b + 1]]
        assert ((rows // seq) == b).all() and (np.diff(rows) > 0).all()


@pytest.mark.parametrize("style", MASK_STYLES)
@pytest.mark.parametrize("batch,seq", [(1, 1), (4, 1), (5, 13), (37, 33)])
def test_pack_sequences_says_whether_a_first_position_is_padding(cpu, rng, style, batch, seq):
    # padding_free="auto" reads it back with the token count: packing would move such a sequence's
    # first-token output (pooler, sequence head) from its padding to its first token.
    mask = sequence_mask(rng, batch, seq, style)
    assert cpu.pack_sequences_first_unattended(mask) == int((mask[:, 0] == 0).any())
    one_left = np.ones((batch, seq), np.int32)
    one_left[int(rng.integers(batch)), 0] = 0
    assert cpu.pack_sequences_first_unattended(one_left) == 1
    assert cpu.pack_sequences_first_unattended(np.ones((batch, seq), np.int32)) == 0


def test_pack_sequences_of_an_all_padding_batch_and_a_full_batch(cpu):
    cu, index = cpu.pack_sequences(np.zeros((3, 4), np.int32))
    np.testing.assert_array_equal(cu, [0, 0, 0, 0])
    np.testing.assert_array_equal(index, np.full(12, -1))
    cu, index = cpu.pack_sequences(np.ones((3, 4), np.int32))
    np.testing.assert_array_equal(cu, [0, 4, 8, 12])
    np.testing.assert_array_equal(index, np.arange(12))


def test_pack_sequences_of_a_hand_written_mask(cpu):
    mask = np.array([[1, 1, 0, 0], [0, 0, 0, 0], [0, 1, 1, 1], [1, 0, 1, 0]], np.int32)
    cu, index = cpu.pack_sequences(mask)
    np.testing.assert_array_equal(cu, [0, 2, 2, 5, 7])
    np.testing.assert_array_equal(index, [0, 1, 9, 10, 11, 12, 14] + [-1] * 9)


# ---- scatter back, clearing past the tokens ---------------------------------------------------


@pytest.mark.parametrize("style", MASK_STYLES)
@pytest.mark.parametrize("batch,seq,width", [(1, 1, 1), (4, 7, 5), (6, 13, 48), (3, 129, 3)])
def test_unpack_rows_scatters_and_zeroes_padding(cpu, rng, style, batch, seq, width):
    mask = sequence_mask(rng, batch, seq, style)
    tokens = int(mask.sum())
    packed = rng.standard_normal((tokens, width)).astype(np.float32) + 3.0  # no zeros among them
    out = cpu.unpack_rows("float32", packed, mask)
    assert out.shape == (batch, seq, width)
    valid = mask.astype(bool)
    np.testing.assert_array_equal(out[valid], packed)
    assert (out[~valid] == 0).all()


def test_unpack_rows_undoes_packing(cpu, rng):
    mask = sequence_mask(rng, 7, 19, "mixed")
    x = rng.standard_normal((7, 19, 6)).astype(np.float32)
    back = cpu.unpack_rows("float32", x[mask.astype(bool)], mask)
    np.testing.assert_array_equal(back, x * mask[..., None])


def test_unpack_rows_refuses_a_wrong_row_count(cpu, rng):
    mask = sequence_mask(rng, 3, 5, "right")
    with pytest.raises(ValueError, match="one row per attended token"):
        cpu.unpack_rows("float32", np.zeros((int(mask.sum()) + 1, 4), np.float32), mask)


@pytest.mark.parametrize("style", ["right", "left", "inner", "empty_rows", "mixed"])
@pytest.mark.parametrize("extra", ["none", "one", "all"])
def test_clear_rows_past_tokens_zeroes_only_rows_past_t(cpu, rng, style, extra):
    batch, seq, width = 5, 11, 7
    mask = sequence_mask(rng, batch, seq, style)
    tokens = int(mask.sum())
    rows = {"none": tokens, "one": min(tokens + 1, batch * seq), "all": batch * seq}[extra]
    x = rng.standard_normal((rows, width)).astype(np.float32) + 5.0
    out = cpu.clear_rows_past_tokens("float32", x, mask)
    np.testing.assert_array_equal(out[:tokens], x[:tokens])
    assert (out[tokens:] == 0).all()


def test_clear_rows_past_tokens_refuses_fewer_rows_than_tokens(cpu):
    mask = np.ones((2, 3), np.int32)
    with pytest.raises(ValueError, match="between T and B\\*S rows"):
        cpu.clear_rows_past_tokens("float32", np.ones((5, 2), np.float32), mask)


# ---- embeddings --------------------------------------------------------------------------------


def embedding_tables(rng, vocab, positions, types, hidden):
    word = rng.standard_normal((vocab, hidden)).astype(np.float32)
    pos = rng.standard_normal((positions, hidden)).astype(np.float32)
    typ = rng.standard_normal((types, hidden)).astype(np.float32)
    gamma = (1 + 0.3 * rng.standard_normal(hidden)).astype(np.float32)
    beta = (0.2 * rng.standard_normal(hidden)).astype(np.float32)
    return word, pos, typ, gamma, beta


def absolute_positions(batch, seq):
    return np.broadcast_to(np.arange(seq), (batch, seq))


def padding_offset_positions(ids, pad):
    """transformers' create_position_ids_from_input_ids over the whole padded row."""
    real = (ids != pad).astype(np.int64)
    return np.cumsum(real, axis=1) * real + pad


@pytest.mark.parametrize("style", MASK_STYLES)
@pytest.mark.parametrize("batch,seq,hidden", [(1, 1, 32), (3, 13, 48), (4, 40, 40), (2, 129, 96)])
def test_embed_layernorm_packed_rows_are_the_padded_rows(cpu, rng, style, batch, seq, hidden):
    vocab, types = 61, 3
    mask = sequence_mask(rng, batch, seq, style)
    ids = rng.integers(0, vocab, (batch, seq)).astype(np.int32)
    tt = rng.integers(0, types, (batch, seq)).astype(np.int32)
    tables = embedding_tables(rng, vocab, seq + 2, types, hidden)
    padded = cpu.embed_layernorm("float32", ids, tt, *tables, 1e-12)
    packed = cpu.embed_layernorm("float32", ids, tt, *tables, 1e-12, mask=mask)
    valid = mask.astype(bool)
    assert packed.shape == (int(mask.sum()), hidden)
    np.testing.assert_array_equal(packed, padded[valid])  # the same row computation
    word, pos, typ, gamma, beta = tables
    ref = layernorm64(word[ids] + pos[absolute_positions(batch, seq)] + typ[tt], gamma, beta, 1e-12)
    assert np.abs(packed - ref[valid]).max(initial=0.0) <= 1e-4


@pytest.mark.parametrize("style", MASK_STYLES)
@pytest.mark.parametrize("pad", [0, 1, 3])
@pytest.mark.parametrize("batch,seq,hidden", [(1, 1, 32), (4, 17, 48), (3, 70, 40)])
def test_embed_layernorm_packed_keeps_padding_offset_positions(cpu, rng, style, pad, batch, seq, hidden):
    # The RoBERTa family's positions count the non-pad ids of the whole padded row: the pad id at
    # padding, stray pad ids under mask 1 (position `pad`, no advance) and non-pad ids under mask 0
    # (they advance the count) all count exactly as they do padded.
    vocab = 53
    mask = sequence_mask(rng, batch, seq, style)
    ids = rng.integers(0, vocab, (batch, seq)).astype(np.int32)
    ids[(mask == 0) & (rng.random((batch, seq)) < 0.7)] = pad
    ids[(mask == 1) & (rng.random((batch, seq)) < 0.1)] = pad
    tt = np.zeros((batch, seq), np.int32)
    tables = embedding_tables(rng, vocab, seq + pad + 1, 1, hidden)
    padded = cpu.embed_layernorm("float32", ids, tt, *tables, 1e-5, position_pad_id=pad)
    packed = cpu.embed_layernorm("float32", ids, tt, *tables, 1e-5, position_pad_id=pad, mask=mask)
    valid = mask.astype(bool)
    np.testing.assert_array_equal(packed, padded[valid])
    word, pos, typ, gamma, beta = tables
    ref = layernorm64(word[ids] + pos[padding_offset_positions(ids, pad)] + typ[tt], gamma, beta, 1e-5)
    assert np.abs(packed - ref[valid]).max(initial=0.0) <= 1e-4


def test_embed_layernorm_packed_counts_non_pad_ids_under_mask_0(cpu, rng):
    # Row [7, 9, 11, 13] with mask [0, 1, 1, 1]: id 7 is not the pad id, so it advances the count
    # (transformers counts from the ids, not the mask) and the first token sits at pad + 2, not at
    # pad + 1 as it would if the packed tokens were counted alone.
    pad, hidden = 1, 16
    ids = np.array([[7, 9, 11, 13]], np.int32)
    mask = np.array([[0, 1, 1, 1]], np.int32)
    tt = np.zeros_like(ids)
    word, pos, typ, gamma, beta = embedding_tables(rng, 20, 4 + pad + 1, 1, hidden)
    packed = cpu.embed_layernorm("float32", ids, tt, word, pos, typ, gamma, beta, 1e-5, position_pad_id=pad,
                                 mask=mask)
    right = layernorm64(word[ids[0, 1:]] + pos[[pad + 2, pad + 3, pad + 4]] + typ[0], gamma, beta, 1e-5)
    wrong = layernorm64(word[ids[0, 1:]] + pos[[pad + 1, pad + 2, pad + 3]] + typ[0], gamma, beta, 1e-5)
    assert np.abs(packed - right).max(initial=0.0) <= 1e-4
    assert np.abs(packed - wrong).max() > 1e-2


# ---- unfused attention pieces -------------------------------------------------------------------


@pytest.mark.parametrize("style", MASK_STYLES)
@pytest.mark.parametrize("batch,seq,heads,d", [(1, 1, 1, 32), (3, 13, 3, 16), (2, 40, 2, 24), (4, 9, 4, 8)])
def test_add_qkv_bias_transpose_packed_places_tokens_and_zeroes_padding(cpu, rng, style, batch, seq, heads, d):
    H = heads * d
    mask = sequence_mask(rng, batch, seq, style)
    qkv = rng.standard_normal((batch, seq, 3 * H)).astype(np.float32)
    bias = rng.standard_normal(3 * H).astype(np.float32) + 2.0  # padding would not be zero by chance
    padded = cpu.add_qkv_bias_transpose("float32", qkv, bias, heads)
    packed = cpu.add_qkv_bias_transpose("float32", qkv, bias, heads, mask=mask)
    valid = np.broadcast_to(mask.astype(bool)[:, None, :, None], (batch, heads, seq, d))
    for name, p, q in zip("qkv", packed, padded):
        assert p.shape == (batch, heads, seq, d), name
        np.testing.assert_array_equal(p[valid], q[valid], err_msg=name)
        assert (p[~valid] == 0).all(), f"{name}: padding must be zeros"


@pytest.mark.parametrize("style", MASK_STYLES)
def test_masked_softmax_packed_is_the_padded_softmax(cpu, rng, style):
    batch, heads, seq = 5, 3, 21
    mask = sequence_mask(rng, batch, seq, style)
    scores = (rng.standard_normal((batch, heads, seq, seq)) * 3).astype(np.float32)
    padded = cpu.masked_softmax("float32", scores, mask, 0.3)
    packed = cpu.masked_softmax("float32", scores, mask, 0.3, packed=True)
    np.testing.assert_array_equal(packed, padded)
    assert np.isfinite(packed).all()


@pytest.mark.parametrize("style", MASK_STYLES)
@pytest.mark.parametrize("batch,heads,seq,d", [(1, 1, 1, 32), (3, 3, 13, 16), (2, 2, 70, 24)])
def test_transpose_heads_packed_gathers_the_attended_rows(cpu, rng, style, batch, heads, seq, d):
    mask = sequence_mask(rng, batch, seq, style)
    x = rng.standard_normal((batch, heads, seq, d)).astype(np.float32)
    packed = cpu.transpose_heads("float32", x, mask=mask)
    merged = x.transpose(0, 2, 1, 3).reshape(batch, seq, heads * d)
    assert packed.shape == (int(mask.sum()), heads * d)
    np.testing.assert_array_equal(packed, merged[mask.astype(bool)])


def unfused_attention(runner, qkv, bias, mask, heads, packed):
    """The unfused path as the encoder composes it; packed: qkv's attended rows in, [T, H] out."""
    batch, seq, H3 = qkv.shape
    H = H3 // 3
    d = H // heads
    q, k, v = (x.reshape(batch * heads, seq, d) for x in runner.add_qkv_bias_transpose(
        "float32", qkv, bias, heads, mask=mask if packed else None))
    s = runner.batched_gemm("float32", q, k, False, True, 1.0)
    p = runner.masked_softmax("float32", s.reshape(batch, heads, seq, seq), mask, 1.0 / math.sqrt(d),
                              packed=packed)
    ctx = runner.batched_gemm("float32", p.reshape(batch * heads, seq, seq), v, False, False, 1.0)
    return runner.transpose_heads("float32", ctx.reshape(batch, heads, seq, d), mask=mask if packed else None)


@pytest.mark.parametrize("style", ["right", "left", "inner", "mixed"])
@pytest.mark.parametrize("batch,seq,heads,d", [(3, 13, 3, 16), (4, 33, 2, 32)])
def test_unfused_attention_packed_matches_padded_at_attended_positions(cpu, rng, style, batch, seq, heads, d):
    H = heads * d
    mask = sequence_mask(rng, batch, seq, style)
    qkv = rng.standard_normal((batch, seq, 3 * H)).astype(np.float32)
    bias = rng.standard_normal(3 * H).astype(np.float32)
    padded = unfused_attention(cpu, qkv, bias, mask, heads, packed=False)
    packed = unfused_attention(cpu, qkv, bias, mask, heads, packed=True)
    valid = mask.astype(bool)
    assert packed.shape == (int(mask.sum()), H)
    assert np.isfinite(packed).all()
    assert np.abs(packed - padded[valid]).max(initial=0.0) <= 1e-6
    # float64 reference: a query attends to the attended keys of its own row only.
    x = (qkv.astype(np.float64) + bias).reshape(batch, seq, 3, heads, d)
    want = []
    for b in range(batch):
        keep = np.flatnonzero(mask[b])
        for s in keep:
            out = []
            for h in range(heads):
                scores = x[b, keep, 1, h] @ x[b, s, 0, h] / math.sqrt(d)
                w = np.exp(scores - scores.max())
                out.append((w / w.sum()) @ x[b, keep, 2, h])
            want.append(np.concatenate(out))
    want = np.array(want).reshape(-1, H)
    assert np.abs(packed - want).max(initial=0.0) <= 1e-5


# ---- first-token dense (the pooler, a sequence head's dense) ------------------------------------

ACTS = {
    "gelu": lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2))),
    "relu": lambda x: np.maximum(x, 0),
    "tanh": np.tanh,
    "identity": lambda x: x,
}


@pytest.mark.parametrize("act", sorted(ACTS))
@pytest.mark.parametrize("out", [48, 1, 5])
@pytest.mark.parametrize("style", ["right", "left", "inner", "empty_rows", "mixed"])
def test_first_token_dense_packed_reads_each_sequences_first_token(cpu, rng, act, out, style):
    # Packed, a sequence's first token is its first attended one; an empty sequence has none and
    # gives act(0 · W + b) = act(b).
    batch, seq, hidden = 6, 9, 48
    mask = sequence_mask(rng, batch, seq, style)
    x = rng.standard_normal((batch, seq, hidden)).astype(np.float32)
    w = (rng.standard_normal((hidden, out)) * 0.2).astype(np.float32)
    b = rng.standard_normal(out).astype(np.float32)
    got = cpu.first_token_dense("float32", x, w, b, act, mask=mask)
    assert got.shape == (batch, out)
    first = first_positions(mask)
    rows = np.where(first[:, None] >= 0, x[np.arange(batch), np.maximum(first, 0)], 0.0).astype(np.float64)
    want = ACTS[act](rows @ w + b)
    assert np.abs(got - want).max(initial=0.0) <= 1e-5
    # The padded op on the same sequences padded on the right (an empty one: a zero token 0).
    right = cpu.first_token_dense("float32", compacted(x, mask), w, b, act)
    assert np.abs(got - right).max(initial=0.0) <= 1e-6
    if (first < 0).any():
        np.testing.assert_allclose(got[first < 0], np.broadcast_to(ACTS[act](b.astype(np.float64)),
                                                                   ((first < 0).sum(), out)), atol=1e-6)


def test_first_token_dense_packed_differs_from_padded_token_0_under_left_padding(cpu, rng):
    # Guards the test above against a mask that happens to start every row with a token.
    batch, seq, hidden = 3, 6, 8
    mask = np.zeros((batch, seq), np.int32)
    mask[:, 2:] = 1
    x = rng.standard_normal((batch, seq, hidden)).astype(np.float32)
    w = rng.standard_normal((hidden, 4)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    packed = cpu.first_token_dense("float32", x, w, b, "identity", mask=mask)
    padded = cpu.first_token_dense("float32", x, w, b, "identity")
    assert np.abs(packed - (x[:, 2].astype(np.float64) @ w + b)).max(initial=0.0) <= 1e-5
    assert np.abs(padded - (x[:, 0].astype(np.float64) @ w + b)).max(initial=0.0) <= 1e-5
    assert np.abs(packed - padded).max() > 1e-2


def test_layout_mask_of_the_wrong_shape_is_refused(cpu):
    x = np.zeros((2, 3, 8), np.float32)
    with pytest.raises(ValueError, match=r"mask must be \[2, 3\]"):
        cpu.first_token_dense("float32", x, np.zeros((8, 2), np.float32), np.zeros(2, np.float32), "tanh",
                              mask=np.ones((3, 2), np.int32))



def test_packed_flash_attention_equals_padded_on_attended_rows(cpu, rng):
    # Left padding too: the packed rows are each sequence's attended ones, wherever they sit.
    qkv = rng.standard_normal((3, 11, 3 * 2 * 16)).astype(np.float32)
    bias = rng.standard_normal(96).astype(np.float32)
    mask = np.zeros((3, 11), np.int32)
    mask[0, :] = 1
    mask[1, 4:] = 1
    mask[2, :3] = 1
    padded = cpu.flash_attention("float32", qkv, bias, mask, 2, 0.25)
    packed = cpu.flash_attention("float32", qkv, bias, mask, 2, 0.25, packed=True)
    np.testing.assert_array_equal(packed, padded[mask == 1])
