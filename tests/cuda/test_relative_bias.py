"""MPNet's relative position bias (AttentionOptions) in the CUDA attention ops, against a float64
numpy reference (skipped without a GPU).

The score of query i and key j of head h gets relative_bias[h, (j - i) + span - 1] added after the
scale, before the key mask and the softmax; i and j are positions in the padded row, so a packed
batch, whose rows skip the padding, must give the padded batch's distances (masks with holes
inside a sequence included). Tables are wider than needed (span > seq) or exactly wide enough, and
hold a different random value at every distance, so a wrong offset, sign or head shows.

Tolerances: the unfused path's masked softmax as tests/cuda/test_cuda_ops.py holds it (a couple of
units in the last place of the dtype plus float32 noise); flash attention within twice the error
of torch's own scaled_dot_product_attention in the same dtype (given the same bias as an additive
mask) plus 1e-4, as tests/cuda/test_flash_attention.py holds it. A bias of zeros must give exactly
the bits of no bias.
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

from tests._util import ragged_mask  # noqa: E402
from tests.cuda.test_cuda_ops import (  # noqa: E402
    DTYPES, FP32_NOISE, TORCH_DTYPE, check, randn, rounded)

HALF = ["float16", "bfloat16"]
SDPA_SLACK = 1e-4
MASK_STYLES = ["right", "left", "holes"]


# ---- reference ----------------------------------------------------------------------------------


def relative_table(rng, heads, span):
    """[heads, 2·span − 1] float32, a random O(1) bias for every distance."""
    return rng.standard_normal((heads, 2 * span - 1)).astype(np.float32)


def bias_by_position(table, seq):
    """[heads, S, S] float64: the bias of query position i (rows) and key position j (columns)."""
    span = (table.shape[1] + 1) // 2
    i = np.arange(seq)[:, None]
    j = np.arange(seq)[None, :]
    return table.astype(np.float64)[:, j - i + span - 1]


def make_mask(rng, batch, seq, style):
    """[B, S] int32. right / left: one run of tokens per row (row 0 full); holes: right padding with
    positions dropped inside every sequence too (its first token kept), so that a packed row's
    position is not its offset in the sequence plus a constant."""
    if style == "left":
        return ragged_mask(rng, batch, seq, left=True)
    mask = ragged_mask(rng, batch, seq)
    if style == "holes":
        mask &= (rng.random((batch, seq)) > 0.3).astype(np.int32)
        mask[:, 0] = 1
    return mask


def softmax64(x, mask):
    """softmax over the last axis of x [B, heads, S, S] (float64) over the keys with mask [B, S]
    != 0; rows with no such key: zeros."""
    x = np.where(mask[:, None, None, :] != 0, x, -np.inf)
    row_max = x.max(-1, keepdims=True)
    e = np.exp(x - np.where(np.isfinite(row_max), row_max, 0.0))
    total = e.sum(-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def attention64(qkv, bias, mask, heads, scale, table):
    """[B, S, H] float64: softmax(scale · q kᵀ + relative bias, key mask) v with q/k/v = qkv + bias,
    nothing rounded."""
    B, S, H3 = qkv.shape
    d = H3 // 3 // heads
    x = (qkv.astype(np.float64) + bias.astype(np.float64)).reshape(B, S, 3, heads, d)
    q, k, v = x.transpose(2, 0, 3, 1, 4)  # [B, heads, S, d]
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * scale + bias_by_position(table, S)[None]
    p = softmax64(s, mask)
    return np.einsum("bhqk,bhkd->bhqd", p, v).transpose(0, 2, 1, 3).reshape(B, S, heads * d)


def sdpa_backends():
    """torch's memory-efficient SDPA (fused, fp32 accumulation, takes an additive mask), else its
    math path; never cuDNN, which builds a graph per new shape."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # older torch: its own choice
        import contextlib

        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def torch_sdpa(qkv, bias, mask, heads, scale, table, dtype):
    """[B, S, H] float64 numpy: torch's fused attention in `dtype` on q/k/v = round(qkv + bias), the
    relative bias (rounded to `dtype`) and the key mask given as one additive mask."""
    B, S, H3 = qkv.shape
    d = H3 // 3 // heads
    tdt = TORCH_DTYPE[dtype]
    x = torch.from_numpy(qkv + bias).cuda().to(tdt).view(B, S, 3, heads, d).permute(2, 0, 3, 1, 4)
    add = torch.from_numpy(bias_by_position(table, S)).cuda()[None].expand(B, heads, S, S)
    keep = torch.from_numpy(mask != 0).cuda().view(B, 1, 1, S)
    add = add.masked_fill(~keep, float("-inf")).to(tdt).contiguous()
    with sdpa_backends():
        out = torch.nn.functional.scaled_dot_product_attention(x[0], x[1], x[2], attn_mask=add,
                                                               scale=scale)
    return out.permute(0, 2, 1, 3).reshape(B, S, H3 // 3).double().cpu().numpy()


def flash_inputs(rng, dtype, batch, seq, heads, head_dim, span):
    """Random qkv [B, S, 3H] and bias [3H] (float32, rounded to `dtype` by the upload; also returned
    rounded, as the kernel sees them) and a table [heads, 2·span − 1]."""
    H = heads * head_dim
    qkv = rng.standard_normal((batch, seq, 3 * H), dtype=np.float32)
    bias = rng.standard_normal(3 * H, dtype=np.float32)
    return qkv, bias, rounded(qkv, dtype), rounded(bias, dtype), relative_table(rng, heads, span)


def max_err(got, want):
    return float(np.abs(np.asarray(got, np.float64) - want).max(initial=0.0))


# ---- masked softmax (the unfused path) ------------------------------------------------------------


# Rows of 37 and 300 keys take the warp-per-row kernel, 1101 the block kernel holding the row in
# registers, 2101 (odd: scalar loads, more than 8 per thread) the streaming block kernel.
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch,heads,seq,extra", [(3, 3, 37, 5), (3, 3, 130, 0), (3, 3, 300, 5),
                                                   (2, 2, 1101, 2), (2, 1, 2101, 5)])
@pytest.mark.parametrize("style", MASK_STYLES)
def test_masked_softmax_relative_bias_matches_float64(gpu, rng, dtype, batch, heads, seq, extra,
                                                      style):
    scores = randn(rng, (batch, heads, seq, seq), dtype, 4.0)
    mask = make_mask(rng, batch, seq, style)
    mask[-1] = 0  # a sequence with every key masked
    table = relative_table(rng, heads, seq + extra)
    scale = 0.125
    want = softmax64(scores.astype(np.float64) * scale + bias_by_position(table, seq)[None], mask)
    got = gpu.masked_softmax(dtype, scores, mask, scale, relative_bias=table)
    check(got, want, dtype, atol=1e-6)
    padded_keys = np.broadcast_to(mask[:, None, None, :] == 0, got.shape)
    assert (got[padded_keys] == 0).all(), "padded keys must get probability exactly 0"
    assert (got[-1] == 0).all(), "a row with every key masked must be all zeros"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seq", [37, 300, 1101, 2101])
def test_masked_softmax_zero_relative_bias_is_bitwise_no_bias(gpu, rng, dtype, seq):
    batch, heads = 2, 2
    scores = randn(rng, (batch, heads, seq, seq), dtype, 4.0)
    mask = make_mask(rng, batch, seq, "holes")
    zeros = np.zeros((heads, 2 * seq + 1), np.float32)  # span seq + 1
    plain = gpu.masked_softmax(dtype, scores, mask, 0.125)
    np.testing.assert_array_equal(
        gpu.masked_softmax(dtype, scores, mask, 0.125, relative_bias=zeros), plain)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", MASK_STYLES)
def test_masked_softmax_relative_bias_packed_is_padded(gpu, rng, dtype, style):
    # The scores are [B, heads, S, S] at padded positions either way: the same distances.
    batch, heads, seq = 3, 3, 77
    scores = randn(rng, (batch, heads, seq, seq), dtype, 4.0)
    mask = make_mask(rng, batch, seq, style)
    table = relative_table(rng, heads, seq + 4)
    padded = gpu.masked_softmax(dtype, scores, mask, 0.125, relative_bias=table)
    packed = gpu.masked_softmax(dtype, scores, mask, 0.125, packed=True, relative_bias=table)
    np.testing.assert_array_equal(packed, padded)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seq,d", [(37, 33), (130, 33), (97, 48)])
def test_unfused_attention_with_relative_bias_matches_float64(gpu, rng, dtype, seq, d):
    # The unfused path as the encoder runs it (QKV split, QKᵀ, masked softmax with the bias, PV,
    # head merge) at head dims flash attention does not take, against float64. Bound: 2x the error
    # of the same ops emulated in numpy with every intermediate rounded to the dtype (the error the
    # dtype causes anyway), plus float32 noise.
    batch, heads = 3, 3
    H = heads * d
    scale = 1.0 / math.sqrt(d)
    qkv = randn(rng, (batch, seq, 3 * H), dtype)
    bias = randn(rng, 3 * H, dtype)
    mask = make_mask(rng, batch, seq, "holes")
    mask[1] = 0  # no key to attend: zeros
    table = relative_table(rng, heads, seq + 3)
    rel = bias_by_position(table, seq)[None]

    q, k, v = (x.reshape(batch * heads, seq, d) for x in
               gpu.add_qkv_bias_transpose(dtype, qkv, bias, heads))
    s = gpu.batched_gemm(dtype, q, k, False, True, 1.0).reshape(batch, heads, seq, seq)
    p = gpu.masked_softmax(dtype, s, mask, scale, relative_bias=table)
    ctx = gpu.batched_gemm(dtype, p.reshape(batch * heads, seq, seq), v, False, False, 1.0)
    got = gpu.transpose_heads(dtype, ctx.reshape(batch, heads, seq, d))

    def split(x):  # [B, S, 3H] -> q, k, v [B, heads, S, d]
        return x.reshape(batch, seq, 3, heads, d).transpose(2, 0, 3, 1, 4)

    def merge(x):  # [B, heads, S, d] -> [B, S, H]
        return x.transpose(0, 2, 1, 3).reshape(batch, seq, H)

    x64 = split(qkv.astype(np.float64) + bias)
    ref = merge(np.einsum("bhqk,bhkd->bhqd",
                          softmax64(np.einsum("bhqd,bhkd->bhqk", x64[0], x64[1]) * scale + rel, mask),
                          x64[2]))
    xe = split(rounded(qkv + bias, dtype).astype(np.float64))
    se = rounded(np.einsum("bhqd,bhkd->bhqk", xe[0], xe[1]), dtype).astype(np.float64)
    pe = rounded(softmax64(se * scale + rel, mask), dtype).astype(np.float64)
    emulated = merge(rounded(np.einsum("bhqk,bhkd->bhqd", pe, xe[2]), dtype))

    assert np.isfinite(got).all()
    assert (got[1] == 0).all(), "a sequence with no key to attend must give zeros"
    err = max_err(got, ref)
    dtype_err = max_err(emulated, ref)
    tol = 2 * dtype_err + FP32_NOISE * np.abs(x64[2]).max()
    assert err <= tol, f"{dtype}: max error {err:.3e} > {tol:.3e} (dtype's own {dtype_err:.3e})"


# ---- flash attention ------------------------------------------------------------------------------


def check_flash(gpu, rng, dtype, batch, seq, heads, head_dim, mask, span, live=None):
    """Flash attention with a relative bias, padded and packed, against float64 within 2x torch
    SDPA's error: every row of the padded output, the attended rows of the packed one, and packed
    against padded within twice that. `live`: the sequences to check (all by default)."""
    scale = 1.0 / math.sqrt(head_dim)
    qkv, bias, qkv_r, bias_r, table = flash_inputs(rng, dtype, batch, seq, heads, head_dim, span)
    padded = gpu.flash_attention(dtype, qkv, bias, mask, heads, scale, relative_bias=table)
    packed = gpu.flash_attention(dtype, qkv, bias, mask, heads, scale, packed=True,
                                 relative_bias=table)
    H = heads * head_dim
    assert padded.shape == (batch, seq, H) and packed.shape == (int(mask.sum()), H)
    assert np.isfinite(padded).all() and np.isfinite(packed).all()

    live = np.arange(batch) if live is None else np.asarray(live)
    m = mask[live]
    ref = attention64(qkv_r[live], bias_r, m, heads, scale, table)
    sdpa = torch_sdpa(qkv_r[live], bias_r, m, heads, scale, table, dtype)
    budget = 2 * max_err(sdpa, ref) + SDPA_SLACK
    err = max_err(padded[live], ref)
    assert err <= budget, f"padded: max error {err:.3e} > {budget:.3e}"

    attended = m.astype(bool)
    budget_rows = 2 * max_err(sdpa[attended], ref[attended]) + SDPA_SLACK
    cu = np.concatenate([[0], np.cumsum(mask.sum(1))])
    packed_live = np.concatenate([packed[cu[b]:cu[b + 1]] for b in live])
    err = max_err(packed_live, ref[attended])
    assert err <= budget_rows, f"packed: max error {err:.3e} > {budget_rows:.3e}"
    diff = max_err(packed, padded[mask.astype(bool)])
    assert diff <= 2 * budget_rows, f"packed vs padded: {diff:.3e} > {2 * budget_rows:.3e}"


# Sequences of one key tile and of several (64 / 128 keys), and spans wider than the sequence and
# exactly as wide.
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("seq,extra", [(37, 5), (130, 0), (300, 5)])
@pytest.mark.parametrize("style", MASK_STYLES)
def test_flash_relative_bias_matches_float64(gpu, rng, dtype, head_dim, seq, extra, style):
    batch, heads = 3, 3
    mask = make_mask(rng, batch, seq, style)
    check_flash(gpu, rng, dtype, batch, seq, heads, head_dim, mask, seq + extra)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("seq", [257, 401])
def test_flash_relative_bias_wide_tiles_on_a_large_grid(gpu, rng, dtype, head_dim, seq):
    # 24 sequences x 12 heads x 3-4 query tiles: the wide tiles (two mma tiles per warp; at head
    # dim 64 from 257 keys, 128-key tiles). Right and left padding and holes in one batch; the
    # float64 reference for a few of the sequences.
    batch, heads = 24, 12
    mask = np.concatenate([make_mask(rng, 8, seq, style) for style in MASK_STYLES])
    check_flash(gpu, rng, dtype, batch, seq, heads, head_dim, mask, seq + 7,
                live=[0, 5, 8, 13, 16, 23])


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("batch,heads,seq", [(3, 3, 130), (24, 12, 401)], ids=["few", "large-grid"])
def test_flash_zero_relative_bias_is_bitwise_no_bias(gpu, rng, monkeypatch, dtype, head_dim,
                                                     packed, batch, heads, seq):
    # On Hopper the calls with and without a bias may take different kernels at head dims 64 and
    # 128 (flash_sm90.cu's persistent ones take no bias), so the comparison pins both to flash.cu's.
    monkeypatch.setenv("FTBERT_FLASH_PORTABLE", "1")
    qkv, bias, _, _, _ = flash_inputs(rng, dtype, batch, seq, heads, head_dim, seq)
    mask = make_mask(rng, batch, seq, "holes")
    zeros = np.zeros((heads, 2 * seq + 5), np.float32)  # span seq + 3
    scale = 1.0 / math.sqrt(head_dim)
    plain = gpu.flash_attention(dtype, qkv, bias, mask, heads, scale, packed=packed)
    got = gpu.flash_attention(dtype, qkv, bias, mask, heads, scale, packed=packed,
                              relative_bias=zeros)
    np.testing.assert_array_equal(got, plain)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("portable", ["0", "1"], ids=["default", "portable-forced"])
@pytest.mark.parametrize("batch,heads,seq", [(3, 3, 130), (24, 12, 401)], ids=["few", "large-grid"])
def test_flash_relative_bias_both_kernels_match_float64(gpu, rng, monkeypatch, dtype, head_dim,
                                                        portable, batch, heads, seq):
    # On Hopper a relative bias runs flash_sm90.cu's one-warpgroup kernel at head dims 64 and 128,
    # and flash.cu's where that is forced: both are held to float64.
    monkeypatch.setenv("FTBERT_FLASH_PORTABLE", portable)
    mask = make_mask(rng, batch, seq, "holes")
    check_flash(gpu, rng, dtype, batch, seq, heads, head_dim, mask, seq + 3)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_flash_relative_bias_fully_masked_sequence_gives_zeros(gpu, rng, dtype, head_dim):
    batch, heads, seq = 3, 3, 77
    qkv, bias, qkv_r, bias_r, table = flash_inputs(rng, dtype, batch, seq, heads, head_dim, seq)
    mask = make_mask(rng, batch, seq, "left")
    mask[1] = 0
    scale = 1.0 / math.sqrt(head_dim)
    out = gpu.flash_attention(dtype, qkv, bias, mask, heads, scale, relative_bias=table)
    assert np.isfinite(out).all()
    assert (out[1] == 0).all()
    packed = gpu.flash_attention(dtype, qkv, bias, mask, heads, scale, packed=True,
                                 relative_bias=table)
    assert packed.shape[0] == int(mask.sum())
    # The sequences around it are attended as usual.
    keep = [0, 2]
    ref = attention64(qkv_r[keep], bias_r, mask[keep], heads, scale, table)
    sdpa = torch_sdpa(qkv_r[keep], bias_r, mask[keep], heads, scale, table, dtype)
    budget = 2 * max_err(sdpa, ref) + SDPA_SLACK
    assert max_err(out[keep], ref) <= budget
