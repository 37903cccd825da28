"""Each CPU backend op against a float64 numpy reference, on random inputs and odd sizes."""

import math

import numpy as np
import pytest

from ftbert import _C, _ops
from tests._util import assert_close, layernorm64, ragged_mask


@pytest.fixture(scope="module")
def cpu():
    return _ops.OpRunner("cpu")


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (7, 13, 5), (97, 129, 33), (128, 384, 96)])
@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
def test_gemm_matches_float64_matmul(cpu, rng, m, n, k, ta, tb):
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    ref = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64) * 0.5
    assert_close(cpu.gemm("float32", a, b, ta, tb, 0.5), ref, 1e-4 * math.sqrt(k))


# The packed weight path: m around the register tile (3, 6, 12 rows) and past a row block (192),
# n around the 16-wide panel, k odd; and the model's shapes.
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (5, 15, 7), (6, 16, 9), (13, 17, 33), (25, 47, 64),
                                   (193, 33, 5), (401, 100, 31), (32, 1152, 384), (7, 384, 1536)])
def test_weight_gemm_matches_float64_matmul(cpu, rng, m, n, k):
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    ref = a.astype(np.float64) @ w.astype(np.float64)
    assert_close(cpu.weight_gemm("float32", a, w), ref, 1e-4 * math.sqrt(k))
    # Repeated calls overwrite, never accumulate.
    assert_close(cpu.weight_gemm("float32", a, w, repeat=3), ref, 1e-4 * math.sqrt(k))


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh", "relu", "tanh", "identity", "silu"])
@pytest.mark.parametrize("m,n,k", [(1, 5, 3), (13, 37, 29), (200, 48, 64)])
def test_weight_gemm_epilogue_matches_the_two_op_path(cpu, rng, act, m, n, k):
    # act(a · W + bias) in the GEMM's epilogue: the float64 reference, and the unfused GEMM then
    # add_bias_activation.
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((k, n)) / math.sqrt(k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    ref = ACTS[act](a.astype(np.float64) @ w.astype(np.float64) + bias)
    got = cpu.weight_gemm("float32", a, w, bias=bias, act=act)
    assert_close(got, ref, 2e-5)
    two_ops = cpu.add_bias_activation("float32", cpu.weight_gemm("float32", a, w), bias, act)
    assert_close(got, two_ops.astype(np.float64), 1e-6)


def test_weight_gemm_refuses_mismatched_shapes(cpu, rng):
    a = rng.standard_normal((4, 6)).astype(np.float32)
    with pytest.raises(ValueError, match=r"weight_gemm: inner dimensions differ \(6 vs 5\)"):
        cpu.weight_gemm("float32", a, np.zeros((5, 3), np.float32))
    with pytest.raises(ValueError, match=r"weight_gemm: bias must be \[3\]"):
        cpu.weight_gemm("float32", a, np.zeros((6, 3), np.float32), bias=np.zeros(4, np.float32))
    with pytest.raises(RuntimeError, match=r"float32 and bfloat16 only, not float16 \(upload_weight called"):
        cpu.weight_gemm("float16", a, np.zeros((6, 3), np.float32))


def test_gemm_choice_has_one_way_on_the_cpu(cpu, rng):
    # One GEMM kernel per shape: both modes are accepted and change nothing, and there are no
    # candidates to name or run.
    a = rng.standard_normal((600, 40)).astype(np.float32)
    w = rng.standard_normal((40, 24)).astype(np.float32)
    want = cpu.weight_gemm("float32", a, w)
    for mode in ("fixed", "auto"):
        cpu.set_gemm_choice(mode)
        assert np.array_equal(cpu.weight_gemm("float32", a, w), want)
    assert cpu.gemm_choice == "fixed"
    assert cpu.weight_gemm_candidates("float32", 600, 24, 40) == []
    assert cpu.weight_gemm_pick("float32", 600, 24, 40) == ""
    with pytest.raises(ValueError, match="gemm choice must be 'auto' or 'fixed', got 'cublas'"):
        cpu.set_gemm_choice("cublas")
    with pytest.raises(ValueError, match="'cublas' cannot run a float32 \\[600, 40\\]"):
        cpu.weight_gemm_candidate("cublas", "float32", a, w)


@pytest.mark.parametrize("batch,m,n,k", [(1, 1, 1, 1), (6, 7, 9, 32), (24, 97, 97, 48)])
@pytest.mark.parametrize("tb", [False, True])
def test_batched_gemm_matches_per_matrix_matmul(cpu, rng, batch, m, n, k, tb):
    a = rng.standard_normal((batch, m, k)).astype(np.float32)
    b = rng.standard_normal((batch, n, k) if tb else (batch, k, n)).astype(np.float32)
    bb = np.swapaxes(b, 1, 2) if tb else b
    ref = np.einsum("bmk,bkn->bmn", a.astype(np.float64), bb.astype(np.float64))
    assert_close(cpu.batched_gemm("float32", a, b, False, tb), ref, 1e-4 * math.sqrt(k))


@pytest.mark.parametrize("batch,seq,hidden", [(1, 1, 32), (3, 7, 48), (2, 129, 336)])
def test_embed_layernorm_matches_lookup_and_layernorm(cpu, rng, batch, seq, hidden):
    vocab, positions, types = 53, seq + 5, 3
    ids = rng.integers(0, vocab, (batch, seq)).astype(np.int32)
    tt = rng.integers(0, types, (batch, seq)).astype(np.int32)
    word = rng.standard_normal((vocab, hidden)).astype(np.float32)
    pos = rng.standard_normal((positions, hidden)).astype(np.float32)
    typ = rng.standard_normal((types, hidden)).astype(np.float32)
    gamma = rng.standard_normal(hidden).astype(np.float32)
    beta = rng.standard_normal(hidden).astype(np.float32)
    x = word[ids].astype(np.float64) + pos[None, :seq] + typ[tt]
    ref = layernorm64(x, gamma, beta, 1e-12)
    assert_close(cpu.embed_layernorm("float32", ids, tt, word, pos, typ, gamma, beta, 1e-12), ref, 1e-4)


def padding_offset_positions(ids, pad):
    """transformers' create_position_ids_from_input_ids: pad + running count of non-pad ids, pad on pads."""
    real = (ids != pad).astype(np.int64)
    return np.cumsum(real, axis=1) * real + pad


@pytest.mark.parametrize("batch,seq,hidden,pad", [(1, 1, 32, 1), (3, 7, 48, 1), (2, 129, 336, 0), (4, 33, 40, 5)])
def test_embed_layernorm_counts_positions_from_the_pad_id(cpu, rng, batch, seq, hidden, pad):
    # The RoBERTa family: positions from the pad id, over non-pad ids, left or right padded.
    vocab, types = 53, 1
    ids = rng.integers(0, vocab, (batch, seq)).astype(np.int32)
    for b in range(batch):  # pad runs on the left or the right, plus stray pad ids inside
        n = int(rng.integers(0, seq))
        ids[b, :n] = pad if b % 2 else ids[b, :n]
        ids[b, seq - n:] = ids[b, seq - n:] if b % 2 else pad
    tt = np.zeros((batch, seq), np.int32)
    word = rng.standard_normal((vocab, hidden)).astype(np.float32)
    pos = rng.standard_normal((seq + pad + 1, hidden)).astype(np.float32)
    typ = rng.standard_normal((types, hidden)).astype(np.float32)
    gamma = rng.standard_normal(hidden).astype(np.float32)
    beta = rng.standard_normal(hidden).astype(np.float32)
    x = word[ids].astype(np.float64) + pos[padding_offset_positions(ids, pad)] + typ[tt]
    ref = layernorm64(x, gamma, beta, 1e-5)
    got = cpu.embed_layernorm("float32", ids, tt, word, pos, typ, gamma, beta, 1e-5, position_pad_id=pad)
    assert_close(got, ref, 1e-4)
    with pytest.raises(ValueError, match="too few positions"):
        cpu.embed_layernorm("float32", ids, tt, word, pos[:-1], typ, gamma, beta, 1e-5, position_pad_id=pad)


@pytest.mark.parametrize("batch,seq,heads,d", [(1, 1, 1, 32), (2, 7, 3, 48), (3, 97, 2, 64)])
def test_add_qkv_bias_transpose_splits_heads(cpu, rng, batch, seq, heads, d):
    H = heads * d
    qkv = rng.standard_normal((batch, seq, 3 * H)).astype(np.float32)
    bias = rng.standard_normal(3 * H).astype(np.float32)
    q, k, v = cpu.add_qkv_bias_transpose("float32", qkv, bias, heads)
    full = (qkv + bias).reshape(batch, seq, 3, heads, d).transpose(2, 0, 3, 1, 4)
    for got, ref in zip((q, k, v), full):
        assert_close(got, ref.astype(np.float64), 1e-6)


@pytest.mark.parametrize("batch,heads,seq", [(1, 1, 1), (2, 3, 7), (3, 2, 129)])
@pytest.mark.parametrize("left", [False, True])
def test_masked_softmax_matches_reference_and_excludes_padding(cpu, rng, batch, heads, seq, left):
    scores = (rng.standard_normal((batch, heads, seq, seq)) * 4).astype(np.float32)
    mask = ragged_mask(rng, batch, seq, left=left)
    scale = 0.125
    x = scores.astype(np.float64) * scale
    x = np.where(mask[:, None, None, :] == 1, x, -np.inf)
    e = np.exp(x - x.max(-1, keepdims=True))
    ref = e / e.sum(-1, keepdims=True)
    assert_close(cpu.masked_softmax("float32", scores, mask, scale), ref, 1e-6)


def test_masked_softmax_fully_masked_row_is_zero_not_nan(cpu, rng):
    scores = rng.standard_normal((2, 2, 5, 5)).astype(np.float32)
    mask = np.ones((2, 5), np.int32)
    mask[1] = 0
    out = cpu.masked_softmax("float32", scores, mask, 1.0)
    assert np.isfinite(out).all()
    assert (out[1] == 0).all()
    np.testing.assert_allclose(out[0].sum(-1), 1.0, rtol=1e-6)


@pytest.mark.parametrize("batch,heads,seq,d", [(1, 1, 1, 32), (2, 3, 7, 48), (2, 4, 97, 64)])
def test_transpose_heads_merges_heads(cpu, rng, batch, heads, seq, d):
    x = rng.standard_normal((batch, heads, seq, d)).astype(np.float32)
    ref = x.transpose(0, 2, 1, 3).reshape(batch, seq, heads * d)
    assert_close(cpu.transpose_heads("float32", x), ref.astype(np.float64), 0.0)


@pytest.mark.parametrize("rows,hidden", [(1, 32), (7, 48), (97, 336), (3, 1000)])
def test_add_bias_residual_layernorm_matches_reference(cpu, rng, rows, hidden):
    x, res = (rng.standard_normal((rows, hidden)).astype(np.float32) * 3 for _ in range(2))
    bias, gamma, beta = (rng.standard_normal(hidden).astype(np.float32) for _ in range(3))
    ref = layernorm64(x.astype(np.float64) + bias + res, gamma, beta, 1e-5)
    assert_close(cpu.add_bias_residual_layernorm("float32", x, res, bias, gamma, beta, 1e-5), ref, 2e-5)


@pytest.mark.parametrize("bad", [None, "x", "gamma", "overflow"])
def test_add_bias_residual_layernorm_reports_nonfinite_outputs(cpu, rng, bad):
    rows, hidden = 5, 64
    x, res = (rng.standard_normal((rows, hidden)).astype(np.float32) for _ in range(2))
    bias, beta = (rng.standard_normal(hidden).astype(np.float32) for _ in range(2))
    gamma = np.ones(hidden, np.float32)
    if bad == "x":
        x[3, 9] = np.nan
    elif bad == "gamma":
        gamma[40] = np.nan
    elif bad == "overflow":
        x[2, 0] = 1e3  # normalizes to ~sqrt(hidden - 1) = 7.9: times 1e38 past float32's range
        gamma[:] = 1e38
    out, flagged = cpu.add_bias_residual_layernorm("float32", x, res, bias, gamma, beta, 1e-5,
                                                   report_nonfinite=True)
    assert flagged == (bad is not None)
    assert np.isfinite(out).all() == (bad is None)


@pytest.mark.parametrize("m,n,k", [(1, 32, 32), (77, 48, 130), (130, 40, 512)])
def test_dense_residual_layernorm_matches_reference(cpu, rng, m, n, k):
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((k, n)) / math.sqrt(k)).astype(np.float32)
    res = rng.standard_normal((m, n)).astype(np.float32)
    bias, gamma, beta = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    ref = layernorm64(a.astype(np.float64) @ w + bias + res, gamma, beta, 1e-5)
    assert_close(cpu.dense_residual_layernorm("float32", a, w, bias, res, gamma, beta, 1e-5), ref, 5e-5)


@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=pytest.mark.skipif(
    bool(_C.cpu_dtype_unsupported_reason("bfloat16")), reason=_C.cpu_dtype_unsupported_reason("bfloat16") or "runs"))])
def test_dense_residual_layernorm_into_its_own_product_buffer_is_the_same(cpu, rng, dtype):
    m, n, k = 37, 48, 70
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((k, n)) / math.sqrt(k)).astype(np.float32)
    res = rng.standard_normal((m, n)).astype(np.float32)
    bias, gamma, beta = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    want = cpu.dense_residual_layernorm(dtype, a, w, bias, res, gamma, beta, 1e-5)
    got = cpu.dense_residual_layernorm(dtype, a, w, bias, res, gamma, beta, 1e-5, product=True)
    np.testing.assert_array_equal(got, want)


def test_dense_residual_layernorm_refuses_to_write_quantized_rows_on_the_cpu(cpu, rng):
    # Only a backend whose weight GEMMs read e4m3 rows (CUDA under "fp8") writes them
    # (tests/cuda/test_fp8.py); asked here, the op says so instead of ignoring the request.
    a = rng.standard_normal((4, 64)).astype(np.float32)
    v = np.ones(64, np.float32)
    with pytest.raises(ValueError, match="write no quantized rows of width 64"):
        cpu.dense_residual_layernorm("float32", a, np.eye(64, dtype=np.float32), v, a, v, v, codes=True)


@pytest.mark.parametrize("bad", [None, "a", "gamma"])
def test_dense_residual_layernorm_reports_nonfinite_outputs(cpu, rng, bad):
    m, n, k = 6, 40, 24
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((k, n)) / math.sqrt(k)).astype(np.float32)
    res = rng.standard_normal((m, n)).astype(np.float32)
    bias, beta = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    gamma = np.ones(n, np.float32)
    if bad == "a":
        a[4, 2] = np.nan  # its row
    elif bad == "gamma":
        gamma[9] = np.nan  # its column
    out, flagged = cpu.dense_residual_layernorm("float32", a, w, bias, res, gamma, beta, 1e-5,
                                                report_nonfinite=True)
    assert flagged == (bad is not None)
    assert np.isfinite(out).sum() == m * n - {None: 0, "a": n, "gamma": m}[bad]


def test_dense_residual_layernorm_names_bad_shapes(cpu):
    a, w, v = np.ones((4, 6), np.float32), np.ones((6, 3), np.float32), np.ones(3, np.float32)
    with pytest.raises(ValueError, match=r"dense_residual_layernorm: inner dimensions differ \(6 vs 5\)"):
        cpu.dense_residual_layernorm("float32", a, w[:5], v, np.ones((4, 3), np.float32), v, v)
    with pytest.raises(ValueError, match=r"dense_residual_layernorm: residual must be \[4, 3\]"):
        cpu.dense_residual_layernorm("float32", a, w, v, np.ones((3, 3), np.float32), v, v)
    with pytest.raises(ValueError, match=r"bias, gamma and beta must be \[3\]"):
        cpu.dense_residual_layernorm("float32", a, w, v, np.ones((4, 3), np.float32), v[:2], v)


ACTS = {
    "gelu": lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2))),
    "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "relu": lambda x: np.maximum(x, 0),
    "tanh": np.tanh,
    "identity": lambda x: x,  # a projection's bias alone
    "silu": lambda x: x / (1 + np.exp(-x)),  # SwiGLU's gate
}


@pytest.mark.parametrize("act", sorted(ACTS))
@pytest.mark.parametrize("rows,cols", [(1, 1), (7, 130), (33, 1000)])
def test_add_bias_activation_matches_reference(cpu, rng, act, rows, cols):
    x = (rng.standard_normal((rows, cols)) * 3).astype(np.float32)
    bias = rng.standard_normal(cols).astype(np.float32)
    ref = ACTS[act](x.astype(np.float64) + bias)
    assert_close(cpu.add_bias_activation("float32", x, bias, act), ref, 2e-6 * max(1.0, np.abs(ref).max()))


@pytest.mark.parametrize("act", ["tanh", "gelu", "relu", "identity"])
@pytest.mark.parametrize("out", [48, 1, 5])  # the pooler's H, and a classifier's label counts
def test_first_token_dense_is_act_of_dense_on_token_0(cpu, rng, act, out):
    hidden = rng.standard_normal((3, 7, 48)).astype(np.float32)
    w = rng.standard_normal((48, out)).astype(np.float32) * 0.2
    b = rng.standard_normal(out).astype(np.float32)
    ref = ACTS[act](hidden[:, 0].astype(np.float64) @ w + b)
    assert_close(cpu.first_token_dense("float32", hidden, w, b, act), ref, 1e-5)


def test_first_token_dense_refuses_mismatched_weights(cpu, rng):
    hidden = rng.standard_normal((2, 3, 8)).astype(np.float32)
    with pytest.raises(ValueError, match=r"weight must be \[H, N\] and bias \[N\]"):
        cpu.first_token_dense("float32", hidden, np.zeros((9, 4), np.float32), np.zeros(4, np.float32), "tanh")


def test_cpu_rejects_float16_with_clear_error(cpu, rng):
    a = rng.standard_normal((4, 4)).astype(np.float32)
    with pytest.raises(RuntimeError, match="float32 and bfloat16 only, not float16"):
        cpu.gemm("float16", a, a)


def attention64(qkv, bias, mask, heads, scale):
    """softmax(scale q kᵀ over the attended keys) v in float64, [B, S, H]; zeros for a query whose
    sequence has no attended key (what the unfused path gives)."""
    B, S, H3 = qkv.shape
    d = H3 // 3 // heads
    x = (qkv.astype(np.float64) + bias).reshape(B, S, 3, heads, d).transpose(2, 0, 3, 1, 4)
    q, k, v = x  # [B, heads, S, d]
    scores = np.einsum("bhqd,bhkd->bhqk", q, k) * scale
    scores = np.where(mask[:, None, None, :] == 1, scores, -np.inf)
    mx = scores.max(-1, keepdims=True)
    e = np.exp(scores - np.where(np.isfinite(mx), mx, 0.0))
    den = e.sum(-1, keepdims=True)
    p = np.divide(e, den, out=np.zeros_like(e), where=den > 0)
    return np.einsum("bhqk,bhkd->bhqd", p, v).transpose(0, 2, 1, 3).reshape(B, S, heads * d)


# Odd head dims (not multiples of any vector width), more queries than one tile (64) and more keys
# than one key block (256), left and right padding.
@pytest.mark.parametrize("batch,seq,heads,d", [(1, 1, 1, 1), (2, 7, 3, 5), (3, 97, 2, 48),
                                               (2, 129, 4, 32), (2, 300, 2, 64), (1, 70, 1, 100)])
@pytest.mark.parametrize("left", [False, True])
def test_flash_attention_matches_float64_reference_padded(cpu, rng, batch, seq, heads, d, left):
    qkv = rng.standard_normal((batch, seq, 3 * heads * d)).astype(np.float32)
    bias = rng.standard_normal(3 * heads * d).astype(np.float32)
    mask = ragged_mask(rng, batch, seq, left=left)
    scale = 1.0 / math.sqrt(d)
    ref = attention64(qkv, bias, mask, heads, scale)
    assert_close(cpu.flash_attention("float32", qkv, bias, mask, heads, scale), ref, 2e-5)


def test_flash_attention_repeated_gives_one_run_s_output(cpu, rng):
    # `repeat` (for kernel timing) reruns the op on the same operands: it overwrites its output.
    qkv = rng.standard_normal((2, 37, 3 * 2 * 16)).astype(np.float32)
    bias = rng.standard_normal(96).astype(np.float32)
    mask = ragged_mask(rng, 2, 37)
    once = cpu.flash_attention("float32", qkv, bias, mask, 2, 0.25, window=5)
    np.testing.assert_array_equal(cpu.flash_attention("float32", qkv, bias, mask, 2, 0.25, window=5, repeat=3),
                                  once)
    with pytest.raises(ValueError, match="repeat must be at least 1"):
        cpu.flash_attention("float32", qkv, bias, mask, 2, 0.25, repeat=0)


@pytest.mark.parametrize("batch,seq,heads,d", [(3, 9, 2, 16), (4, 130, 3, 32), (2, 280, 1, 24)])
def test_flash_attention_packed_matches_reference_on_attended_rows(cpu, rng, batch, seq, heads, d):
    qkv = rng.standard_normal((batch, seq, 3 * heads * d)).astype(np.float32)
    bias = rng.standard_normal(3 * heads * d).astype(np.float32)
    mask = ragged_mask(rng, batch, seq)
    scale = 1.0 / math.sqrt(d)
    ref = attention64(qkv, bias, mask, heads, scale)[mask == 1]
    got = cpu.flash_attention("float32", qkv, bias, mask, heads, scale, packed=True)
    assert_close(got, ref, 2e-5)


def test_flash_attention_all_masked_sequence_is_zero_not_nan(cpu, rng):
    qkv = rng.standard_normal((2, 5, 3 * 2 * 8)).astype(np.float32)
    mask = np.ones((2, 5), np.int32)
    mask[1] = 0
    out = cpu.flash_attention("float32", qkv, np.zeros(48, np.float32), mask, 2, 0.3)
    assert np.isfinite(out).all()
    assert (out[1] == 0).all()


def test_flash_attention_agrees_with_unfused_path_on_large_scores(cpu, rng):
    # Scores in the thousands: the running max must keep exp() from overflowing, which would give
    # non-finite values or errors of the size of v itself. A float32 score that large carries a
    # rounding error the softmax passes on, beyond 1e-4 of the output's range for some draws.
    qkv = (rng.standard_normal((2, 40, 3 * 64)) * 12).astype(np.float32)
    bias = rng.standard_normal(3 * 64).astype(np.float32)
    mask = ragged_mask(rng, 2, 40)
    ref = attention64(qkv, bias, mask, 2, 1.0)
    got = cpu.flash_attention("float32", qkv, bias, mask, 2, 1.0)
    assert np.isfinite(got).all()
    assert_close(got, ref, 1e-3 * np.abs(ref).max())


def test_cpu_attention_support_and_reasons(cpu, rng):
    assert cpu.supports_attention("unfused", "float32", 64)
    assert cpu.supports_attention("flash", "float32", 7)
    assert not cpu.supports_attention("flash", "float16", 64)
    qkv = rng.standard_normal((1, 3, 96)).astype(np.float32)
    with pytest.raises(RuntimeError, match="float32 and bfloat16 only, not float16"):
        cpu.flash_attention("float16", qkv, np.zeros(96, np.float32), np.ones((1, 3), np.int32), 1, 0.1)


def test_bf16_dot_peak_names_the_instruction_set_it_lacks():
    # Kernels capped below AVX512-BF16 (FTBERT_CPU_ISA) have no bfloat16 dot product to time.
    import os
    import subprocess
    import sys

    code = ("from ftbert import _ops\ntry:\n    _ops.cpu_bf16_dot_peak(1, 10)\n"
            "except ValueError as e:\n    print('refused:', e)\n")
    done = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, FTBERT_CPU_ISA="avx2"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    isa = "avx2" if "avx2" in done.stdout else "baseline"  # the cap takes what the CPU has
    assert f"refused: cpu_bf16_dot_peak: the CPU kernels run {isa}, without AVX512-BF16" in done.stdout
