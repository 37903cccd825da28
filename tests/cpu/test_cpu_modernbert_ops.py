"""The CPU ops of ModernBERT's layer against float64 numpy references, on random inputs and odd
sizes: rotary positions (padded and packed, positions of the padded row), the gated activation,
the pre-LayerNorm residual step, the sliding window in both attention paths, and embeddings
without a position table. bfloat16 where the CPU has it."""

import math

import numpy as np
import pytest

from ftbert import _C, _ops
from tests._util import assert_close, layernorm64, ragged_mask

BF16 = not _C.cpu_dtype_unsupported_reason("bfloat16")
DTYPES = ["float32", pytest.param("bfloat16", marks=pytest.mark.skipif(
    not BF16, reason=_C.cpu_dtype_unsupported_reason("bfloat16") or "runs"))]


@pytest.fixture(scope="module")
def cpu():
    return _ops.OpRunner("cpu")


def rotary_table(positions, d, theta):
    inv = 1.0 / theta ** (np.arange(0, d, 2) / d)
    angles = np.arange(positions)[:, None] * inv[None, :]
    return np.concatenate([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)


def rotate64(qkv, table, heads):
    """Q and K of qkv [B, S, 3H] turned by the angles of positions 0..S-1, float64."""
    B, S, H3 = qkv.shape
    d = H3 // 3 // heads
    x = qkv.astype(np.float64).reshape(B, S, 3, heads, d).copy()
    cos, sin = table[:S, : d // 2].astype(np.float64), table[:S, d // 2:].astype(np.float64)
    for part in (0, 1):
        x1, x2 = x[:, :, part, :, : d // 2].copy(), x[:, :, part, :, d // 2:].copy()
        x[:, :, part, :, : d // 2] = x1 * cos[None, :, None] - x2 * sin[None, :, None]
        x[:, :, part, :, d // 2:] = x2 * cos[None, :, None] + x1 * sin[None, :, None]
    return x.reshape(B, S, H3)


@pytest.mark.parametrize("batch,seq,heads,d", [(1, 1, 1, 2), (2, 9, 3, 6), (3, 70, 2, 32)])
@pytest.mark.parametrize("packed", [False, True])
def test_rotary_turns_q_and_k_by_their_positions(cpu, rng, batch, seq, heads, d, packed):
    qkv = rng.standard_normal((batch, seq, 3 * heads * d)).astype(np.float32)
    table = rotary_table(seq + 4, d, 10000.0)
    ref = rotate64(qkv, table, heads)
    if packed:  # holes inside the sequences: a row keeps its padded position
        mask = (rng.random((batch, seq)) > 0.3).astype(np.int32)
        mask[:, 0] = 1
        assert_close(cpu.rotary_embedding("float32", qkv, table, heads, mask=mask), ref[mask == 1], 2e-6)
    else:
        assert_close(cpu.rotary_embedding("float32", qkv, table, heads), ref, 2e-6)


@pytest.mark.parametrize("packed", [False, True])
def test_rotary_adds_the_q_and_k_bias_first_and_leaves_v_alone(cpu, rng, packed):
    # The rotary families with a QKV bias (GTE, Jina): Q's and K's parts before the rotation; V's
    # is attention's to add.
    batch, seq, heads, d = 2, 13, 3, 10
    qkv = rng.standard_normal((batch, seq, 3 * heads * d)).astype(np.float32)
    bias = rng.standard_normal(3 * heads * d).astype(np.float32)
    table = rotary_table(seq, d, 20000.0)
    biased = qkv.astype(np.float64) + np.concatenate([bias[: 2 * heads * d], np.zeros(heads * d)])
    ref = rotate64(biased, table, heads)
    mask = np.ones((batch, seq), np.int32)
    mask[1, 9:] = 0
    got = cpu.rotary_embedding("float32", qkv, table, heads, mask=mask if packed else None, bias=bias)
    assert_close(got, ref[mask == 1] if packed else ref, 4e-6)
    v = slice(2 * heads * d, None)
    np.testing.assert_array_equal(got[..., v], (qkv[mask == 1] if packed else qkv)[..., v])
    with pytest.raises(ValueError, match=r"bias must be \[3H\]"):
        cpu.rotary_embedding("float32", qkv, table, heads, bias=bias[:-1])


def dynamic_frequencies(positions, original, d, theta, factor):
    """[positions - original, d/2] float32: the frequencies of each extent n past `original` under
    dynamic NTK scaling (transformers' rope_type "dynamic")."""
    n = np.arange(original + 1, positions + 1, dtype=np.float64)[:, None]
    base = theta * (factor * n / original - (factor - 1)) ** (d / (d - 2))
    return (1.0 / base ** (np.arange(0, d, 2) / d)[None, :]).astype(np.float32)


def extents(mask):
    """Per sequence of mask [B, S]: 1 + its last attended position."""
    return np.array([np.nonzero(row)[0].max() + 1 for row in mask])


def rotate_dynamic64(qkv, table, dynamic, original, mask, heads):
    """Q and K of qkv [B, S, 3H] turned as rotary_embedding's dynamic scaling says, float64: each
    sequence by the frequencies of its extent where that passes `original`, else by the table. The
    angles are float32 products, as transformers forms them."""
    out = np.empty(qkv.shape)
    for b, extent in enumerate(extents(mask)):
        rows = table
        if extent > original:
            angles = np.arange(qkv.shape[1], dtype=np.float32)[:, None] * dynamic[extent - original - 1][None, :]
            angles = angles.astype(np.float64)
            rows = np.concatenate([np.cos(angles), np.sin(angles)], axis=1)
        out[b] = rotate64(qkv[b:b + 1], rows, heads)[0]
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", ["right", "left", "holes"])
@pytest.mark.parametrize("heads,d", [(3, 10), (2, 64), (1, 4)])
def test_rotary_dynamic_scaling_turns_each_sequence_by_its_own_extent(cpu, rng, dtype, style, heads, d):
    batch, seq, original = 5, 47, 20
    qkv = rng.standard_normal((batch, seq, 3 * heads * d)).astype(np.float32)
    table = rotary_table(seq + 3, d, 1000.0)
    dynamic = dynamic_frequencies(seq + 3, original, d, 1000.0, 2.0)
    mask = ragged_mask(rng, batch, seq, left=style == "left")
    mask[1] = np.arange(seq) < original  # an extent of exactly `original`: the table's angles
    if style == "holes":
        mask[:, 1:-1] *= (rng.random((batch, seq - 2)) > 0.3).astype(np.int32)
    want = rotate_dynamic64(qkv, table, dynamic, original, mask, heads)[mask == 1]
    got = cpu.rotary_embedding(dtype, qkv, table, heads, mask=mask, dynamic=dynamic, original=original)
    assert_close(got, want, 2e-6 if dtype == "float32" else 2e-2 * np.abs(want).max())
    # A sequence that does not pass `original` gets exactly what the table alone gives it.
    plain = cpu.rotary_embedding(dtype, qkv, table, heads, mask=mask)
    row = np.cumsum(mask.ravel()).reshape(mask.shape) - 1  # packed row of each attended position
    short = (extents(mask) <= original)[:, None] & (mask == 1)
    assert short.any() and not short.all()
    np.testing.assert_array_equal(got[row[short]], plain[row[short]])


def test_rotary_dynamic_scaling_needs_a_packed_layout_and_whole_frequencies(cpu, rng):
    qkv = rng.standard_normal((2, 9, 3 * 2 * 8)).astype(np.float32)
    table, dynamic = rotary_table(9, 8, 1000.0), dynamic_frequencies(9, 4, 8, 1000.0, 2.0)
    with pytest.raises(RuntimeError, match="dynamic rope scaling needs a packed layout"):
        cpu.rotary_embedding("float32", qkv, table, 2, dynamic=dynamic, original=4)
    mask = np.ones((2, 9), np.int32)
    with pytest.raises(ValueError, match=r"dynamic must be \[P - original, d/2\]"):
        cpu.rotary_embedding("float32", qkv, table, 2, mask=mask, dynamic=dynamic[:-1], original=4)
    with pytest.raises(ValueError, match=r"dynamic must be \[P - original, d/2\]"):
        cpu.rotary_embedding("float32", qkv, table, 2, mask=mask, dynamic=dynamic[:, :-1], original=4)


def test_rotary_leaves_v_alone(cpu, rng):
    qkv = rng.standard_normal((2, 11, 3 * 2 * 8)).astype(np.float32)
    out = cpu.rotary_embedding("float32", qkv, rotary_table(11, 8, 160000.0), 2)
    np.testing.assert_array_equal(out[..., 32:], qkv[..., 32:])


ACTS = {
    "gelu": lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2))),
    "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
    "relu": lambda x: np.maximum(x, 0),
    "tanh": np.tanh,
    "identity": lambda x: x,
    "silu": lambda x: x / (1 + np.exp(-x)),  # SwiGLU's gate
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("rows,n", [(1, 1), (7, 33), (40, 131)])
def test_gated_activation_is_act_of_the_input_times_the_gate(cpu, rng, dtype, act, rows, n):
    x = rng.standard_normal((rows, 2 * n)).astype(np.float32)
    x64 = x.astype(np.float64)
    ref = ACTS[act](x64[:, :n]) * x64[:, n:]
    tol = 2e-6 if dtype == "float32" else 2e-2 * max(1.0, np.abs(ref).max())
    if dtype == "bfloat16":  # the op reads bfloat16 values
        x = x.astype(np.float32)
    assert_close(cpu.gated_activation(dtype, x, act), ref, tol)


@pytest.mark.parametrize("with_x", [True, False])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("rows,hidden", [(1, 5), (13, 48), (33, 100)])
def test_residual_add_layernorm_keeps_the_sum_and_norms_it(cpu, rng, with_x, with_bias, rows, hidden):
    residual = rng.standard_normal((rows, hidden)).astype(np.float32)
    x = rng.standard_normal((rows, hidden)).astype(np.float32) if with_x else None
    bias = rng.standard_normal(hidden).astype(np.float32) if with_bias else None
    gamma = rng.standard_normal(hidden).astype(np.float32)
    beta = rng.standard_normal(hidden).astype(np.float32)
    total = residual.astype(np.float64) + (0 if x is None else x) + (0 if bias is None else bias)
    got_sum, got = cpu.residual_add_layernorm("float32", residual, x, bias, gamma, beta, 1e-5)
    assert_close(got_sum, total, 1e-5)
    assert_close(got, layernorm64(total, gamma, beta, 1e-5), 1e-4)


def test_residual_add_layernorm_reports_nonfinite_outputs(cpu, rng):
    residual = rng.standard_normal((4, 16)).astype(np.float32)
    x = np.zeros_like(residual)
    ones = np.ones(16, np.float32)
    _, (_, flagged) = cpu.residual_add_layernorm("float32", residual, x, None, ones, ones, 1e-5,
                                                 report_nonfinite=True)
    assert not flagged
    x[2, 3] = np.inf
    _, (out, flagged) = cpu.residual_add_layernorm("float32", residual, x, None, ones, ones, 1e-5,
                                                   report_nonfinite=True)
    assert flagged and np.isfinite(out[[0, 1, 3]]).all()


def window_mask(seq, window):
    i = np.arange(seq)
    return np.abs(i[None, :] - i[:, None]) <= window  # [query, key]


def softmax64(scores, keep):
    scores = np.where(keep, scores, -np.inf)
    mx = scores.max(-1, keepdims=True)
    e = np.exp(scores - np.where(np.isfinite(mx), mx, 0.0))
    den = e.sum(-1, keepdims=True)
    return np.divide(e, den, out=np.zeros_like(e), where=den > 0)


@pytest.mark.parametrize("batch,heads,seq", [(2, 3, 7), (3, 2, 90)])
@pytest.mark.parametrize("window", [1, 5, 200])
@pytest.mark.parametrize("left", [False, True])
def test_masked_softmax_keeps_the_window(cpu, rng, batch, heads, seq, window, left):
    scores = (rng.standard_normal((batch, heads, seq, seq)) * 3).astype(np.float32)
    mask = ragged_mask(rng, batch, seq, left=left)
    keep = (mask[:, None, None, :] == 1) & window_mask(seq, window)[None, None]
    ref = softmax64(scores.astype(np.float64) * 0.3, keep)
    got = cpu.masked_softmax("float32", scores, mask, 0.3, window=window)
    assert_close(got, ref, 2e-6)
    assert (got[~np.broadcast_to(keep, got.shape)] == 0).all()  # exactly 0 outside, not ~1e-38


def attention64(qkv, bias, mask, heads, scale, window):
    B, S, H3 = qkv.shape
    d = H3 // 3 // heads
    x = (qkv.astype(np.float64) + bias).reshape(B, S, 3, heads, d).transpose(2, 0, 3, 1, 4)
    q, k, v = x
    scores = np.einsum("bhqd,bhkd->bhqk", q, k) * scale
    keep = (mask[:, None, None, :] == 1) & window_mask(S, window)[None, None]
    p = softmax64(scores, keep)
    return np.einsum("bhqk,bhkd->bhqd", p, v).transpose(0, 2, 1, 3).reshape(B, S, heads * d)


# Past one key block (256) and one query tile (64): blocks outside every query's window are skipped.
@pytest.mark.parametrize("batch,seq,heads,d", [(2, 9, 3, 5), (2, 300, 2, 16), (1, 600, 1, 8)])
@pytest.mark.parametrize("window", [1, 8, 64])
@pytest.mark.parametrize("style", ["right", "left", "holes"])
@pytest.mark.parametrize("packed", [False, True])
def test_flash_attention_keeps_the_window(cpu, rng, batch, seq, heads, d, window, style, packed):
    qkv = rng.standard_normal((batch, seq, 3 * heads * d)).astype(np.float32)
    bias = rng.standard_normal(3 * heads * d).astype(np.float32)
    if style == "holes":
        mask = (rng.random((batch, seq)) > 0.3).astype(np.int32)
        mask[:, 0] = 1
    else:
        mask = ragged_mask(rng, batch, seq, left=style == "left")
    scale = 1.0 / math.sqrt(d)
    ref = attention64(qkv, bias, mask, heads, scale, window)
    got = cpu.flash_attention("float32", qkv, bias, mask, heads, scale, packed=packed, window=window)
    assert_close(got, ref[mask == 1] if packed else ref, 2e-5)


def test_a_window_past_the_sequence_changes_nothing(cpu, rng):
    qkv = rng.standard_normal((2, 40, 3 * 2 * 8)).astype(np.float32)
    bias = rng.standard_normal(48).astype(np.float32)
    mask = ragged_mask(rng, 2, 40)
    plain = cpu.flash_attention("float32", qkv, bias, mask, 2, 0.3)
    np.testing.assert_array_equal(cpu.flash_attention("float32", qkv, bias, mask, 2, 0.3, window=40), plain)


def test_a_negative_window_is_refused(cpu, rng):
    with pytest.raises(ValueError, match="window must be >= 0"):
        cpu.masked_softmax("float32", np.zeros((1, 1, 3, 3), np.float32), np.ones((1, 3), np.int32), 1.0,
                           window=-1)


@pytest.mark.parametrize("packed", [False, True])
def test_embeddings_without_a_position_table(cpu, rng, packed):
    batch, seq, hidden, vocab = 3, 11, 40, 29
    ids = rng.integers(0, vocab, (batch, seq)).astype(np.int32)
    tt = np.zeros((batch, seq), np.int32)
    word = rng.standard_normal((vocab, hidden)).astype(np.float32)
    typ = rng.standard_normal((1, hidden)).astype(np.float32)
    gamma = rng.standard_normal(hidden).astype(np.float32)
    beta = rng.standard_normal(hidden).astype(np.float32)
    ref = layernorm64(word[ids].astype(np.float64) + typ[0], gamma, beta, 1e-5)
    mask = ragged_mask(rng, batch, seq) if packed else None
    got = cpu.embed_layernorm("float32", ids, tt, word, None, typ, gamma, beta, 1e-5, mask=mask)
    assert_close(got, ref[mask == 1] if packed else ref, 1e-4)
