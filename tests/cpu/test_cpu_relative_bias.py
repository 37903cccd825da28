"""The CPU attention ops with a relative position bias (MPNet's; AttentionOptions) against a float64
numpy reference: the unfused path's masked softmax and the fused op, padded and packed, left and
right padding and a mask with holes inside a sequence (distances are padded positions)."""

import math

import numpy as np
import pytest

from ftbert import _ops
from tests._util import assert_close, ragged_mask


@pytest.fixture(scope="module")
def cpu():
    return _ops.OpRunner("cpu")


def bias_by_distance(rng, heads, span):
    """[heads, 2·span − 1]: distance j − i at column (j − i) + span − 1, O(1) values."""
    return rng.standard_normal((heads, 2 * span - 1)).astype(np.float32)


def distance_bias(table, seq):
    """[heads, S, S] float64: the bias of query i and key j."""
    span = (table.shape[1] + 1) // 2
    i = np.arange(seq)[:, None]
    j = np.arange(seq)[None, :]
    return table.astype(np.float64)[:, j - i + span - 1]


def softmax64(scores, mask):
    scores = np.where(mask[:, None, None, :] == 1, scores, -np.inf)
    mx = scores.max(-1, keepdims=True)
    e = np.exp(scores - np.where(np.isfinite(mx), mx, 0.0))
    den = e.sum(-1, keepdims=True)
    return np.divide(e, den, out=np.zeros_like(e), where=den > 0)


def attention64(qkv, bias, mask, heads, scale, table, window=0):
    """softmax(scale q kᵀ + relative bias over the attended keys, those within `window` positions
    of the query where window > 0) v in float64, [B, S, H]."""
    B, S, H3 = qkv.shape
    d = H3 // 3 // heads
    x = (qkv.astype(np.float64) + bias).reshape(B, S, 3, heads, d).transpose(2, 0, 3, 1, 4)
    q, k, v = x  # [B, heads, S, d]
    scores = np.einsum("bhqd,bhkd->bhqk", q, k) * scale + distance_bias(table, S)[None]
    if window > 0:
        far = np.abs(np.arange(S)[None, :] - np.arange(S)[:, None]) > window
        scores = np.where(far[None, None], -np.inf, scores)
    p = softmax64(scores, mask)
    return np.einsum("bhqk,bhkd->bhqd", p, v).transpose(0, 2, 1, 3).reshape(B, S, heads * d)


def masks(rng, batch, seq):
    """Right padding, left padding, and holes inside the sequences (every sequence keeps a token)."""
    holes = (rng.random((batch, seq)) > 0.3).astype(np.int32)
    holes[:, 0] = 1
    return {"right": ragged_mask(rng, batch, seq), "left": ragged_mask(rng, batch, seq, left=True),
            "holes": holes}


@pytest.mark.parametrize("batch,heads,seq,extra", [(2, 3, 7, 0), (3, 2, 41, 5), (2, 1, 150, 31)])
@pytest.mark.parametrize("style", ["right", "left", "holes"])
def test_masked_softmax_adds_the_bias_of_each_distance(cpu, rng, batch, heads, seq, extra, style):
    scores = rng.standard_normal((batch, heads, seq, seq)).astype(np.float32) * 3
    mask = masks(rng, batch, seq)[style]
    table = bias_by_distance(rng, heads, seq + extra)
    scale = 0.37
    ref = softmax64(scores.astype(np.float64) * scale + distance_bias(table, seq)[None], mask)
    assert_close(cpu.masked_softmax("float32", scores, mask, scale, relative_bias=table), ref, 2e-6)


# More queries than a tile (64 / 256) and keys than a key block (256); odd head dims.
@pytest.mark.parametrize("batch,seq,heads,d", [(1, 1, 1, 4), (2, 9, 3, 5), (3, 97, 2, 48),
                                               (2, 300, 2, 32)])
@pytest.mark.parametrize("style", ["right", "left", "holes"])
@pytest.mark.parametrize("packed", [False, True])
def test_flash_attention_adds_the_bias_of_each_distance(cpu, rng, batch, seq, heads, d, style, packed):
    qkv = rng.standard_normal((batch, seq, 3 * heads * d)).astype(np.float32)
    bias = rng.standard_normal(3 * heads * d).astype(np.float32)
    mask = masks(rng, batch, seq)[style]
    table = bias_by_distance(rng, heads, seq + 3)
    scale = 1.0 / math.sqrt(d)
    ref = attention64(qkv, bias, mask, heads, scale, table)
    got = cpu.flash_attention("float32", qkv, bias, mask, heads, scale, packed=packed,
                              relative_bias=table)
    assert_close(got, ref[mask == 1] if packed else ref, 2e-5)


# A window as well (no family has both, the op takes both): each query tile computes only the keys
# within some query's window, and every one of those still gets its distance's bias.
@pytest.mark.parametrize("window", [3, 40])
@pytest.mark.parametrize("style", ["right", "holes"])
@pytest.mark.parametrize("packed", [False, True])
def test_flash_attention_adds_the_bias_within_a_window(cpu, rng, window, style, packed):
    batch, seq, heads, d = 2, 300, 2, 16
    qkv = rng.standard_normal((batch, seq, 3 * heads * d)).astype(np.float32)
    bias = rng.standard_normal(3 * heads * d).astype(np.float32)
    mask = masks(rng, batch, seq)[style]
    table = bias_by_distance(rng, heads, seq)
    scale = 1.0 / math.sqrt(d)
    ref = attention64(qkv, bias, mask, heads, scale, table, window)
    got = cpu.flash_attention("float32", qkv, bias, mask, heads, scale, packed=packed,
                              relative_bias=table, window=window)
    assert_close(got, ref[mask == 1] if packed else ref, 2e-5)


def test_flash_and_unfused_agree_with_a_bias(cpu, rng):
    # The same attention through the unfused path's ops (split heads, QKᵀ, softmax with the bias,
    # PV, merge heads) and the fused op.
    batch, seq, heads, d = 2, 70, 3, 16
    qkv = rng.standard_normal((batch, seq, 3 * heads * d)).astype(np.float32)
    bias = rng.standard_normal(3 * heads * d).astype(np.float32)
    mask = ragged_mask(rng, batch, seq)
    table = bias_by_distance(rng, heads, seq)
    scale = 1.0 / math.sqrt(d)
    q, k, v = cpu.add_qkv_bias_transpose("float32", qkv, bias, heads)
    p = cpu.masked_softmax("float32", np.einsum("bhqd,bhkd->bhqk", q, k), mask, scale,
                           relative_bias=table)
    unfused = np.einsum("bhqk,bhkd->bhqd", p, v).transpose(0, 2, 1, 3).reshape(batch, seq, heads * d)
    fused = cpu.flash_attention("float32", qkv, bias, mask, heads, scale, relative_bias=table)
    assert_close(fused, unfused.astype(np.float64), 1e-5)


def test_a_zero_bias_changes_nothing(cpu, rng):
    batch, seq, heads, d = 2, 33, 2, 8
    qkv = rng.standard_normal((batch, seq, 3 * heads * d)).astype(np.float32)
    bias = rng.standard_normal(3 * heads * d).astype(np.float32)
    mask = ragged_mask(rng, batch, seq)
    zeros = np.zeros((heads, 2 * seq - 1), np.float32)
    plain = cpu.flash_attention("float32", qkv, bias, mask, heads, 0.25)
    np.testing.assert_array_equal(
        cpu.flash_attention("float32", qkv, bias, mask, heads, 0.25, relative_bias=zeros), plain)


@pytest.mark.parametrize("shape", [(2, 19), (3, 20), (3, 21, 1), (3,)])
def test_a_bias_table_of_the_wrong_shape_is_refused(cpu, rng, shape):
    # 3 heads and 11 positions need [3, 2·span − 1] with span >= 11: [3, 21] at least, odd.
    scores = rng.standard_normal((1, 3, 11, 11)).astype(np.float32)
    mask = np.ones((1, 11), np.int32)
    with pytest.raises(Exception, match="relative_bias must be"):
        cpu.masked_softmax("float32", scores, mask, 1.0, relative_bias=np.zeros(shape, np.float32))
