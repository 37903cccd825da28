"""The CUDA ops ModernBERT adds, against float64 numpy references (and the CPU backend in float32);
skipped without a GPU.

  - rotary_embedding: Q and K of every token row turned by the angles of its position in the
    padded row (packed batches, holes included, must give the padded rows' values bit for bit);
    V untouched.
  - gated_activation: act(x[:, :n]) · x[:, n:], rounded once.
  - residual_add_layernorm: the stored residual is round(residual + (x + bias)) exactly (float32
    arithmetic is the same in numpy), the output the LayerNorm of that stored value; NaN / Inf
    outputs flagged.
  - embed_layernorm without a position table: word + token type only.
  - the sliding window (AttentionOptions::window): key j attends query i only where
    |j − i| <= window (padded positions), in the masked softmax (every kernel variant) and in
    flash attention (padded and packed, with and without a relative bias, windows narrower than a
    key tile and wider, on sequences of one tile and of several, left / right padding and masks
    with holes). A window as long as the sequence must give exactly the bits of no window; rows
    whose window holds no kept key give zeros.

Tolerances as tests/cuda/test_cuda_ops.py (a couple of units in the last place of the dtype plus
float32 noise) and, for flash attention, tests/cuda/test_relative_bias.py (twice the error of
torch's own scaled_dot_product_attention in the same dtype, given the same mask, plus 1e-4).
"""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
_ops = pytest.importorskip("ftbert._ops")

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(not _ops.cuda_backend_built(), reason="this ftbert build has no CUDA backend"),
]

from tests._util import layernorm64, ragged_mask  # noqa: E402
from tests.cpu.test_cpu_modernbert_ops import dynamic_frequencies, rotate_dynamic64  # noqa: E402
from tests.cuda.test_cuda_ops import (  # noqa: E402
    DTYPES, FP32_NOISE, TORCH_DTYPE, check, randn, rounded, spike_rows)
from tests.cuda.test_relative_bias import (  # noqa: E402
    HALF, MASK_STYLES, SDPA_SLACK, bias_by_position, make_mask, max_err, relative_table,
    sdpa_backends)

ACTS = {
    "gelu": lambda x: 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0))),
    "gelu_tanh": lambda x: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi)
                                                    * (x + 0.044715 * x**3))),
    "relu": lambda x: np.maximum(x, 0.0),
    "tanh": np.tanh,
    "identity": lambda x: x,
    "silu": lambda x: x / (1 + np.exp(-x)),  # SwiGLU's gate
}


# ---- rotary embedding ----------------------------------------------------------------------------


def rotary_table(positions, d, theta=10000.0):
    """[positions, d] float32: cos of the d/2 angles | sin of them (transformers' layout)."""
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    angles = np.arange(positions, dtype=np.float64)[:, None] * inv[None, :]
    return np.concatenate([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)


def rotate64(qkv, table, heads):
    """qkv [B, S, 3H] with Q and K of padded position s turned by row s of the table, in float64
    (the table's float32 values as they are)."""
    B, S, H3 = qkv.shape
    d = H3 // 3 // heads
    half = d // 2
    x = qkv.astype(np.float64).reshape(B, S, 3, heads, d).copy()
    cos = table[:S, :half].astype(np.float64)[None, :, None, :]
    sin = table[:S, half:].astype(np.float64)[None, :, None, :]
    for part in (0, 1):
        x1 = x[:, :, part, :, :half].copy()
        x2 = x[:, :, part, :, half:].copy()
        x[:, :, part, :, :half] = x1 * cos - x2 * sin
        x[:, :, part, :, half:] = x2 * cos + x1 * sin
    return x.reshape(B, S, H3)


def rotary_bound(qkv, heads):
    """|x1| + |x2| at every element of Q and K (the scale of the float32 rounding noise), |x| for
    V."""
    B, S, H3 = qkv.shape
    d = H3 // 3 // heads
    half = d // 2
    a = np.abs(qkv.astype(np.float64)).reshape(B, S, 3, heads, d)
    pair = a[..., :half] + a[..., half:]
    out = a.copy()
    out[:, :, :2, :, :half] = pair[:, :, :2]
    out[:, :, :2, :, half:] = pair[:, :, :2]
    return out.reshape(B, S, H3)


# (heads, d): d/2 of 32 and 64 (16-byte vectors), 3 (scalars), 1 (d = 2); hidden not a power of two.
ROTARY_SHAPES = [(2, 37, 3, 64), (3, 130, 2, 6), (1, 300, 4, 32), (2, 9, 5, 128), (1, 1, 1, 2)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch,seq,heads,d", ROTARY_SHAPES)
@pytest.mark.parametrize("layout", ["padded", "right", "left", "holes"])
def test_rotary_embedding_matches_float64(gpu, rng, dtype, batch, seq, heads, d, layout):
    qkv = randn(rng, (batch, seq, 3 * heads * d), dtype)
    table = rotary_table(seq + 5, d)
    want = rotate64(qkv, table, heads)
    atol = FP32_NOISE * rotary_bound(qkv, heads)
    if layout == "padded":
        got = gpu.rotary_embedding(dtype, qkv, table, heads)
        check(got, want, dtype, atol=atol)
        v = slice(2 * heads * d, None)
        np.testing.assert_array_equal(got[..., v], qkv[..., v])  # V is left as it is
        return
    # Packed: the attended rows only, each turned by its position in the padded row.
    mask = make_mask(rng, batch, seq, layout)
    got = gpu.rotary_embedding(dtype, qkv, table, heads, mask=mask)
    keep = mask.astype(bool)
    check(got, want[keep], dtype, atol=atol[keep])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", MASK_STYLES)
def test_rotary_embedding_packed_equals_padded_on_attended_rows(gpu, rng, dtype, style):
    batch, seq, heads, d = 3, 77, 3, 64
    qkv = randn(rng, (batch, seq, 3 * heads * d), dtype)
    table = rotary_table(seq, d, theta=160000.0)
    mask = make_mask(rng, batch, seq, style)
    padded = gpu.rotary_embedding(dtype, qkv, table, heads)
    packed = gpu.rotary_embedding(dtype, qkv, table, heads, mask=mask)
    np.testing.assert_array_equal(packed, padded[mask.astype(bool)])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["padded", "holes"])
@pytest.mark.parametrize("heads,d", [(3, 64), (2, 6)])
def test_rotary_embedding_with_a_qkv_bias(gpu, cpu, rng, dtype, layout, heads, d):
    # Q's and K's bias parts are added before the rotation; V and its bias are left alone.
    batch, seq = 2, 41
    qkv = randn(rng, (batch, seq, 3 * heads * d), dtype)
    bias = randn(rng, 3 * heads * d, dtype)
    table = rotary_table(seq, d)
    biased = qkv.astype(np.float64) + np.concatenate([bias[: 2 * heads * d], np.zeros(heads * d)])
    want = rotate64(biased, table, heads)
    atol = FP32_NOISE * rotary_bound(biased, heads)
    mask = None if layout == "padded" else make_mask(rng, batch, seq, layout)
    got = gpu.rotary_embedding(dtype, qkv, table, heads, mask=mask, bias=bias)
    keep = np.ones((batch, seq), bool) if mask is None else mask.astype(bool)
    check(got, want[keep] if mask is not None else want, dtype,
          atol=atol[keep] if mask is not None else atol)
    v = slice(2 * heads * d, None)
    np.testing.assert_array_equal(got[..., v], (qkv[keep] if mask is not None else qkv)[..., v])


@pytest.mark.parametrize("batch,seq,heads,d", [(2, 37, 3, 64), (3, 130, 2, 6)])
def test_rotary_embedding_matches_cpu(gpu, cpu, rng, batch, seq, heads, d):
    qkv = randn(rng, (batch, seq, 3 * heads * d), "float32")
    table = rotary_table(seq, d)
    mask = make_mask(rng, batch, seq, "holes")
    atol = FP32_NOISE * rotary_bound(qkv, heads)
    check(gpu.rotary_embedding("float32", qkv, table, heads),
          cpu.rotary_embedding("float32", qkv, table, heads), "float32", atol=atol)
    keep = mask.astype(bool)
    check(gpu.rotary_embedding("float32", qkv, table, heads, mask=mask),
          cpu.rotary_embedding("float32", qkv, table, heads, mask=mask), "float32",
          atol=atol[keep])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", ["right", "left", "holes"])
@pytest.mark.parametrize("batch,seq,heads,d", [(5, 77, 3, 64), (4, 130, 2, 6), (3, 41, 1, 4)])
def test_rotary_embedding_dynamic_scaling_matches_float64(gpu, cpu, rng, dtype, style, batch, seq, heads, d):
    # Each packed sequence past `original` turns by its own extent's frequencies, computed with
    # sincosf; the others read the table. Against float64 (float32 angles) and the CPU op.
    original = seq // 2
    qkv = randn(rng, (batch, seq, 3 * heads * d), dtype)
    table = rotary_table(seq + 2, d, theta=1000.0)
    dynamic = dynamic_frequencies(seq + 2, original, d, 1000.0, 2.0)
    mask = make_mask(rng, batch, seq, style)
    mask[0] = 1  # one sequence over the full length, past `original`
    keep = mask.astype(bool)
    want = rotate_dynamic64(qkv, table, dynamic, original, mask, heads)[keep]
    atol = 2 * FP32_NOISE * rotary_bound(qkv, heads)[keep]
    got = gpu.rotary_embedding(dtype, qkv, table, heads, mask=mask, dynamic=dynamic, original=original)
    check(got, want, dtype, atol=atol)
    if dtype == "float32":
        check(got, cpu.rotary_embedding(dtype, qkv, table, heads, mask=mask, dynamic=dynamic,
                                        original=original), dtype, atol=atol)
    with pytest.raises(RuntimeError, match="dynamic rope scaling needs a packed layout"):
        gpu.rotary_embedding(dtype, qkv, table, heads, dynamic=dynamic, original=original)


# ---- gated activation ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("rows,n", [(1, 1), (7, 33), (40, 131), (5, 1152), (3, 768)])
def test_gated_activation_matches_float64(gpu, rng, dtype, act, rows, n):
    x = randn(rng, (rows, 2 * n), dtype, 3.0)
    x64 = x.astype(np.float64)
    a, g = x64[:, :n], x64[:, n:]
    want = ACTS[act](a) * g
    got = gpu.gated_activation(dtype, x, act)
    # float32 noise of act(a) (GELU's tail is a difference of nearly equal terms) times the gate.
    check(got, want, dtype, atol=FP32_NOISE * np.maximum(1.0, np.abs(a)) * np.abs(g))


@pytest.mark.parametrize("act", list(ACTS))
def test_gated_activation_matches_cpu(gpu, cpu, rng, act):
    x = randn(rng, (9, 2 * 101), "float32", 3.0)
    n = 101
    bound = np.maximum(1.0, np.abs(x[:, :n])) * np.abs(x[:, n:])
    check(gpu.gated_activation("float32", x, act), cpu.gated_activation("float32", x, act),
          "float32", atol=FP32_NOISE * bound)


# ---- residual add + LayerNorm --------------------------------------------------------------------


# A warp per row while a row fits 4 vectors a lane (1024 16-bit values, 512 float32), at every row
# count; longer rows a block each (13000: more than 48 KiB of shared memory, the opt-in).
RESIDUAL_SHAPES = [(1, 32), (7, 48), (97, 333), (128, 768), (300, 1024), (5, 1030), (4, 3000),
                   (2, 13000)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,hidden", RESIDUAL_SHAPES)
@pytest.mark.parametrize("with_x,with_bias", [(True, True), (True, False), (False, True),
                                              (False, False)], ids=["x+bias", "x", "bias", "none"])
def test_residual_add_layernorm_matches_float64(gpu, rng, dtype, rows, hidden, with_x, with_bias):
    residual = randn(rng, (rows, hidden), dtype, 3.0, offset=2.0)
    x = randn(rng, (rows, hidden), dtype, 3.0) if with_x else None
    bias = randn(rng, hidden, dtype) if with_bias else None
    gamma = randn(rng, hidden, dtype, 0.3, offset=1.0)
    beta = randn(rng, hidden, dtype, 0.2)
    added = np.zeros_like(residual) if x is None else x
    if bias is not None:
        added = added + bias
    # The kernel's float32 sum residual + (x + bias), rounded to the dtype once: the same bits.
    want_sum = rounded(residual + added, dtype)
    got_sum, got = gpu.residual_add_layernorm(dtype, residual, x, bias, gamma, beta, 1e-5)
    np.testing.assert_array_equal(got_sum, want_sum)
    want = layernorm64(want_sum.astype(np.float64), gamma, beta, 1e-5)
    check(got, want, dtype, atol=FP32_NOISE * np.abs(want).max())


@pytest.mark.parametrize("rows,hidden", [(7, 48), (300, 768), (4, 3000)])
def test_residual_add_layernorm_matches_cpu(gpu, cpu, rng, rows, hidden):
    residual = randn(rng, (rows, hidden), "float32", 3.0, offset=2.0)
    x = randn(rng, (rows, hidden), "float32", 3.0)
    bias = randn(rng, hidden, "float32")
    gamma = randn(rng, hidden, "float32", 0.3, offset=1.0)
    beta = randn(rng, hidden, "float32", 0.2)
    got_sum, got = gpu.residual_add_layernorm("float32", residual, x, bias, gamma, beta, 1e-5)
    want_sum, want = cpu.residual_add_layernorm("float32", residual, x, bias, gamma, beta, 1e-5)
    check(got_sum, want_sum, "float32", atol=FP32_NOISE * np.abs(want_sum).max())
    check(got, want, "float32", atol=FP32_NOISE * np.abs(want).max())


# Outputs either side of where rounding to the dtype overflows (the spike of
# tests/cuda/test_cuda_ops.py, as the residual with nothing added), through the warp kernel
# (hidden 776 in 16-bit dtypes) and the block kernel (float32: 194 vectors of 4).
@pytest.mark.parametrize("rows", [1, 300])
@pytest.mark.parametrize("dtype,gain,overflows", [("float16", 2352.0, False),
                                                  ("float16", 2354.0, True),
                                                  ("float32", 1.2e37, False),
                                                  ("float32", 1.23e37, True)])
def test_residual_add_layernorm_flags_outputs_that_overflow(gpu, dtype, rows, gain, overflows):
    spike, _, _, gamma, beta = spike_rows(rows, 776, gain, dtype)
    residual_after, (out, flagged) = gpu.residual_add_layernorm(dtype, spike, None, None, gamma,
                                                                beta, 1e-5, report_nonfinite=True)
    np.testing.assert_array_equal(residual_after, spike)
    assert flagged == overflows
    assert np.isinf(out[:, 0]).all() == overflows
    assert np.isfinite(out[:, 1:]).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,hidden", [(5, 96), (3, 3000)])
@pytest.mark.parametrize("where", ["x", "bias", "gamma"])
def test_residual_add_layernorm_flags_nan(gpu, rng, dtype, rows, hidden, where):
    residual = randn(rng, (rows, hidden), dtype)
    x = randn(rng, (rows, hidden), dtype)
    bias, beta = randn(rng, hidden, dtype), randn(rng, hidden, dtype)
    gamma = randn(rng, hidden, dtype, 0.3, 1.0)
    _, (_, flagged) = gpu.residual_add_layernorm(dtype, residual, x, bias, gamma, beta, 1e-5,
                                                 report_nonfinite=True)
    assert not flagged
    if where == "x":
        x[rows - 1, 7] = np.nan
    elif where == "bias":
        bias[11] = np.nan
    else:
        gamma[50] = np.nan
    residual_after, (out, flagged) = gpu.residual_add_layernorm(
        dtype, residual, x, bias, gamma, beta, 1e-5, report_nonfinite=True)
    assert flagged
    assert np.isnan(out).any()
    if where == "gamma":  # the residual sum is untouched by gamma
        assert np.isfinite(residual_after).all()


# ---- embeddings without a position table ---------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch,seq,hidden", [(1, 1, 32), (3, 7, 336), (2, 97, 333), (2, 129, 768),
                                              (1, 5, 1030)])
@pytest.mark.parametrize("packed", [False, True])
def test_embed_layernorm_without_position_matches_float64(gpu, cpu, rng, dtype, batch, seq, hidden,
                                                          packed):
    vocab, types = 1000, 2
    ids = rng.integers(0, vocab, (batch, seq)).astype(np.int32)
    tt = rng.integers(0, types, (batch, seq)).astype(np.int32)
    word = randn(rng, (vocab, hidden), dtype, 0.5)
    typ = randn(rng, (types, hidden), dtype, 0.5, offset=0.3)
    gamma = randn(rng, hidden, dtype, 0.3, offset=1.0)
    beta = randn(rng, hidden, dtype, 0.2)
    want = layernorm64(word[ids].astype(np.float64) + typ[tt], gamma, beta, 1e-5)
    mask = ragged_mask(rng, batch, seq) if packed else None
    got = gpu.embed_layernorm(dtype, ids, tt, word, None, typ, gamma, beta, 1e-5, mask=mask)
    if packed:
        want = want[mask.astype(bool)]
    check(got, want, dtype, atol=FP32_NOISE * np.abs(want).max())
    if dtype == "float32":
        on_cpu = cpu.embed_layernorm("float32", ids, tt, word, None, typ, gamma, beta, 1e-5,
                                     mask=mask)
        check(got, on_cpu, "float32", atol=FP32_NOISE * np.abs(on_cpu).max())


def test_embed_layernorm_without_position_ignores_the_pad_id(gpu, rng):
    # RoBERTa-style positions need a table; without one there is nothing to count them for.
    batch, seq, hidden, vocab = 2, 19, 96, 50
    ids = rng.integers(0, vocab, (batch, seq)).astype(np.int32)
    ids[0, :5] = 1
    tt = np.zeros((batch, seq), np.int32)
    word = randn(rng, (vocab, hidden), "float16", 0.5)
    typ = randn(rng, (1, hidden), "float16", 0.5)
    gamma, beta = randn(rng, hidden, "float16", 0.3, 1.0), randn(rng, hidden, "float16", 0.2)
    plain = gpu.embed_layernorm("float16", ids, tt, word, None, typ, gamma, beta, 1e-5)
    padded_ids = gpu.embed_layernorm("float16", ids, tt, word, None, typ, gamma, beta, 1e-5,
                                     position_pad_id=1)
    np.testing.assert_array_equal(padded_ids, plain)


# ---- sliding window: reference -------------------------------------------------------------------


def window_keep(mask, seq, window):
    """[B, 1, S, S] bool: key j (last axis) kept for query i: mask[b, j] != 0 and |j − i| <= window
    (0: every key)."""
    i = np.arange(seq)
    near = np.abs(i[None, :] - i[:, None]) <= window if window > 0 else np.ones((seq, seq), bool)
    return (mask[:, None, None, :] != 0) & near[None, None]


def softmax_keep(x, keep):
    """softmax over the last axis of x (float64) over the kept keys; rows with none: zeros."""
    x = np.where(keep, x, -np.inf)
    row_max = x.max(-1, keepdims=True)
    e = np.exp(x - np.where(np.isfinite(row_max), row_max, 0.0))
    total = e.sum(-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def split_heads(x, heads):
    """[B, S, 3H] -> q, k, v [B, heads, S, d]."""
    B, S, H3 = x.shape
    return x.reshape(B, S, 3, heads, H3 // 3 // heads).transpose(2, 0, 3, 1, 4)


def attention64(qkv, bias, keep, heads, scale, add=None):
    """[B, S, H] float64: softmax(scale · q kᵀ + add, kept keys) v, q/k/v = qkv + bias, nothing
    rounded."""
    q, k, v = split_heads(qkv.astype(np.float64) + bias.astype(np.float64), heads)
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * scale
    if add is not None:
        s = s + add
    p = softmax_keep(s, keep)
    B, S = qkv.shape[:2]
    return np.einsum("bhqk,bhkd->bhqd", p, v).transpose(0, 2, 1, 3).reshape(B, S, -1)


def torch_sdpa(qkv, bias, keep, heads, scale, dtype, add=None):
    """[B, S, H] float64 numpy: torch's fused attention in `dtype` on q/k/v = round(qkv + bias),
    with the kept keys (and `add`, rounded to the dtype) as one additive mask. Rows with no kept
    key come out as torch leaves them (not compared)."""
    B, S, H3 = qkv.shape
    tdt = TORCH_DTYPE[dtype]
    x = torch.from_numpy(qkv + bias).cuda().to(tdt).view(B, S, 3, heads, H3 // 3 // heads)
    x = x.permute(2, 0, 3, 1, 4)
    add_t = torch.zeros((B, heads, S, S), dtype=torch.float64, device="cuda")
    if add is not None:
        add_t += torch.from_numpy(np.ascontiguousarray(add)).cuda()
    add_t = add_t.masked_fill(~torch.from_numpy(keep).cuda(), float("-inf")).to(tdt).contiguous()
    with sdpa_backends():
        out = torch.nn.functional.scaled_dot_product_attention(x[0], x[1], x[2], attn_mask=add_t,
                                                               scale=scale)
    return out.permute(0, 2, 1, 3).reshape(B, S, H3 // 3).double().cpu().numpy()


def flash_inputs(rng, dtype, batch, seq, heads, head_dim):
    """qkv [B, S, 3H] and bias [3H] in float32 (the op rounds them on upload) and as rounded."""
    H = heads * head_dim
    qkv = rng.standard_normal((batch, seq, 3 * H), dtype=np.float32)
    bias = rng.standard_normal(3 * H, dtype=np.float32)
    return qkv, bias, rounded(qkv, dtype), rounded(bias, dtype)


def check_flash_window(gpu, rng, dtype, batch, seq, heads, head_dim, mask, window, table=None,
                       live=None):
    """Flash attention with a window (and `table`, a relative bias), padded and packed, against
    float64 within 2x torch SDPA's error on the rows that keep a key; rows whose window keeps none
    must be exactly zero; packed against padded within twice the budget. `live`: the sequences to
    hold to the reference."""
    scale = 1.0 / math.sqrt(head_dim)
    qkv, bias, qkv_r, bias_r = flash_inputs(rng, dtype, batch, seq, heads, head_dim)
    padded = gpu.flash_attention(dtype, qkv, bias, mask, heads, scale, relative_bias=table,
                                 window=window)
    packed = gpu.flash_attention(dtype, qkv, bias, mask, heads, scale, packed=True,
                                 relative_bias=table, window=window)
    H = heads * head_dim
    assert padded.shape == (batch, seq, H) and packed.shape == (int(mask.sum()), H)
    assert np.isfinite(padded).all() and np.isfinite(packed).all()

    live = np.arange(batch) if live is None else np.asarray(live)
    m = mask[live]
    keep = window_keep(m, seq, window)
    add = None if table is None else bias_by_position(table, seq)[None]
    ref = attention64(qkv_r[live], bias_r, keep, heads, scale, add)
    sdpa = torch_sdpa(qkv_r[live], bias_r, keep, heads, scale, dtype, add)
    # [L, S, heads]: whether the row of that head keeps any key; outputs per head [.., heads, d].
    has = keep.any(-1).transpose(0, 2, 1)
    has = np.broadcast_to(has, (len(live), seq, heads))

    def per_head(x):
        return np.asarray(x).reshape(x.shape[:-1] + (heads, head_dim))

    budget = 2 * max_err(per_head(sdpa)[has], per_head(ref)[has]) + SDPA_SLACK
    got = per_head(padded[live])
    err = max_err(got[has], per_head(ref)[has])
    assert err <= budget, f"padded: max error {err:.3e} > {budget:.3e}"
    assert (got[~has] == 0).all(), "a row whose window keeps no key must give zeros"

    attended = m.astype(bool)
    cu = np.concatenate([[0], np.cumsum(mask.sum(1))])
    packed_live = per_head(np.concatenate([packed[cu[b]:cu[b + 1]] for b in live]))
    has_rows = has[attended]
    err = max_err(packed_live[has_rows], per_head(ref[attended])[has_rows])
    assert err <= budget, f"packed: max error {err:.3e} > {budget:.3e}"
    assert (packed_live[~has_rows] == 0).all()
    diff = max_err(packed, padded[mask.astype(bool)])
    assert diff <= 2 * budget, f"packed vs padded: {diff:.3e} > {2 * budget:.3e}"
    return padded, packed


# ---- sliding window: masked softmax --------------------------------------------------------------


# 37, 130 and 300 keys: the warp-per-row kernel; 1101: the block kernel holding the row in
# registers; 2101 (odd: scalar loads, more than 8 per thread): the streaming block kernel.
SOFTMAX_SHAPES = [(3, 3, 37), (3, 2, 130), (2, 2, 300), (2, 2, 1101), (2, 1, 2101)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch,heads,seq", SOFTMAX_SHAPES)
@pytest.mark.parametrize("window", [1, 5, 64])
@pytest.mark.parametrize("style", MASK_STYLES)
def test_masked_softmax_window_matches_float64(gpu, rng, dtype, batch, heads, seq, window, style):
    scores = randn(rng, (batch, heads, seq, seq), dtype, 4.0)
    mask = make_mask(rng, batch, seq, style)
    mask[-1] = 0  # a sequence with every key masked
    scale = 0.125
    keep = window_keep(mask, seq, window)
    want = softmax_keep(scores.astype(np.float64) * scale, keep)
    got = gpu.masked_softmax(dtype, scores, mask, scale, window=window)
    check(got, want, dtype, atol=1e-6)
    dropped = np.broadcast_to(~keep, got.shape)
    assert (got[dropped] == 0).all(), "keys outside the window or masked must get exactly 0"
    assert (got[-1] == 0).all(), "a row with every key masked must be all zeros"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch,heads,seq", [(3, 3, 37), (2, 2, 300), (2, 2, 1101), (2, 1, 2101)])
@pytest.mark.parametrize("window", [1, 64])
def test_masked_softmax_window_with_relative_bias_matches_float64(gpu, rng, dtype, batch, heads,
                                                                   seq, window):
    scores = randn(rng, (batch, heads, seq, seq), dtype, 4.0)
    mask = make_mask(rng, batch, seq, "holes")
    table = relative_table(rng, heads, seq + 3)
    scale = 0.125
    keep = window_keep(mask, seq, window)
    rel = bias_by_position(table, seq)[None]
    want = softmax_keep(scores.astype(np.float64) * scale + rel, keep)
    got = gpu.masked_softmax(dtype, scores, mask, scale, relative_bias=table, window=window)
    check(got, want, dtype, atol=1e-6)
    assert (got[np.broadcast_to(~keep, got.shape)] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seq", [37, 300, 1101, 2101])
@pytest.mark.parametrize("with_bias", [False, True], ids=["plain", "relative-bias"])
def test_masked_softmax_window_at_least_seq_is_bitwise_no_window(gpu, rng, dtype, seq, with_bias):
    batch, heads = 2, 2
    scores = randn(rng, (batch, heads, seq, seq), dtype, 4.0)
    mask = make_mask(rng, batch, seq, "holes")
    table = relative_table(rng, heads, seq) if with_bias else None
    plain = gpu.masked_softmax(dtype, scores, mask, 0.125, relative_bias=table)
    for window in (seq - 1, seq, seq + 9):  # seq - 1: every distance fits too
        got = gpu.masked_softmax(dtype, scores, mask, 0.125, relative_bias=table, window=window)
        if window >= seq:
            np.testing.assert_array_equal(got, plain)
        else:
            check(got, plain, dtype, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", MASK_STYLES)
def test_masked_softmax_window_packed_is_padded(gpu, rng, dtype, style):
    # The scores are [B, heads, S, S] at padded positions either way: the same distances.
    batch, heads, seq = 3, 3, 77
    scores = randn(rng, (batch, heads, seq, seq), dtype, 4.0)
    mask = make_mask(rng, batch, seq, style)
    padded = gpu.masked_softmax(dtype, scores, mask, 0.125, window=6)
    packed = gpu.masked_softmax(dtype, scores, mask, 0.125, packed=True, window=6)
    np.testing.assert_array_equal(packed, padded)


# ---- sliding window: flash attention -------------------------------------------------------------


# One key tile and several (64 / 128 keys); windows narrower than a tile, about one, and with
# 300 keys none reaching across the sequence.
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("seq", [37, 130, 300])
@pytest.mark.parametrize("window", [1, 5, 64])
@pytest.mark.parametrize("style", MASK_STYLES)
def test_flash_window_matches_float64(gpu, rng, dtype, head_dim, seq, window, style):
    batch, heads = 3, 3
    mask = make_mask(rng, batch, seq, style)
    check_flash_window(gpu, rng, dtype, batch, seq, heads, head_dim, mask, window)


# 24 sequences x 12 heads: the wide tiles (two mma tiles per warp; at head dim 32 the windowed
# configuration of its own; at head dim 64, 128-key tiles once 128 rows plus the window either side
# pass 256 keys: window 100, not 64), with and without a relative bias. Right and left padding and
# holes in one batch; the float64 reference for one sequence of each.
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("seq", [257, 401])
@pytest.mark.parametrize("window,with_bias", [(5, False), (64, False), (100, False), (64, True),
                                              (100, True)])
def test_flash_window_wide_tiles_on_a_large_grid(gpu, rng, dtype, head_dim, seq, window,
                                                 with_bias):
    batch, heads = 24, 12
    mask = np.concatenate([make_mask(rng, 8, seq, style) for style in MASK_STYLES])
    table = relative_table(rng, heads, seq + 7) if with_bias else None
    check_flash_window(gpu, rng, dtype, batch, seq, heads, head_dim, mask, window, table=table,
                       live=[0, 9, 20])


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("seq,window", [(37, 1), (130, 5), (300, 64), (401, 100)])
@pytest.mark.parametrize("style", ["left", "holes"])
def test_flash_window_with_relative_bias_matches_float64(gpu, rng, dtype, head_dim, seq, window,
                                                         style):
    batch, heads = 3, 3
    mask = make_mask(rng, batch, seq, style)
    table = relative_table(rng, heads, seq + 2)
    check_flash_window(gpu, rng, dtype, batch, seq, heads, head_dim, mask, window, table=table)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["plain", "relative-bias"])
@pytest.mark.parametrize("batch,heads,seq", [(3, 3, 130), (24, 12, 401)], ids=["few", "large-grid"])
def test_flash_window_at_least_seq_is_bitwise_no_window(gpu, rng, dtype, head_dim, packed,
                                                        with_bias, batch, heads, seq):
    qkv, bias, _, _ = flash_inputs(rng, dtype, batch, seq, heads, head_dim)
    mask = make_mask(rng, batch, seq, "holes")
    table = relative_table(rng, heads, seq) if with_bias else None
    scale = 1.0 / math.sqrt(head_dim)
    plain = gpu.flash_attention(dtype, qkv, bias, mask, heads, scale, packed=packed,
                                relative_bias=table)
    for window in (seq, seq + 1, 1 << 20):
        got = gpu.flash_attention(dtype, qkv, bias, mask, heads, scale, packed=packed,
                                  relative_bias=table, window=window)
        np.testing.assert_array_equal(got, plain)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_flash_window_rows_without_keys_give_zeros(gpu, rng, dtype, head_dim):
    # Tokens every 4th position: with window 1 the padding queries two positions from any token
    # keep no key (padded layout); one sequence has no token at all.
    batch, heads, seq = 3, 2, 150
    mask = np.zeros((batch, seq), np.int32)
    mask[0, ::4] = 1
    mask[1] = 0
    mask[2, :seq // 2] = 1
    padded, packed = check_flash_window(gpu, rng, dtype, batch, seq, heads, head_dim, mask, 1)
    assert (padded[0, 2::4] == 0).all()
    assert (padded[1] == 0).all()
    assert (padded[0, ::4] != 0).any(axis=-1).all()  # a token keeps itself


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("portable", ["0", "1"], ids=["default", "portable-forced"])
@pytest.mark.parametrize("batch,heads,seq", [(3, 3, 300), (24, 12, 401)], ids=["few", "large-grid"])
def test_flash_window_both_kernels_match_float64(gpu, rng, monkeypatch, dtype, head_dim, portable,
                                                 batch, heads, seq):
    # On Hopper a window runs flash_sm90.cu's one-warpgroup kernel at head dims 64 and 128, and
    # flash.cu's where that is forced: both are held to float64, windows narrower than a key tile.
    monkeypatch.setenv("FTBERT_FLASH_PORTABLE", portable)
    mask = make_mask(rng, batch, seq, "holes")
    check_flash_window(gpu, rng, dtype, batch, seq, heads, head_dim, mask, 64)
    check_flash_window(gpu, rng, dtype, batch, seq, heads, head_dim, mask, 5)
