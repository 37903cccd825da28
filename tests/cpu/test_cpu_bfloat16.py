"""The CPU ops in bfloat16 (where the CPU has AVX512-BF16): each against a float64 reference on
the same bfloat16-rounded inputs, on random inputs and odd sizes. The ops compute in float32 and
round their result once, so each may differ from the reference by half a bfloat16 ulp (2^-9
relative, 2^-8 with margin) plus float32's own rounding; the weight GEMMs' products are exact
(bfloat16 x bfloat16 fits a float32) and accumulate in float32. The fused attention at head dims
a multiple of 16 runs its two products on bfloat16 pairs (its query and its probabilities rounded
to bfloat16 first): dots_bound says by how much more it may differ."""

import math

import numpy as np
import pytest

import ftbert
from ftbert import _C, _ops
from tests._util import layernorm64, ragged_mask
from tests.cpu.test_cpu_ops import ACTS, attention64

pytestmark = pytest.mark.skipif(bool(_C.cpu_dtype_unsupported_reason("bfloat16")),
                                reason=_C.cpu_dtype_unsupported_reason("bfloat16") or "runs")

BF = "bfloat16"
HALF_ULP = 2.0**-8  # relative, with a factor 2 of margin


@pytest.fixture(scope="module")
def cpu():
    return _ops.OpRunner("cpu")


def bf16(x):
    """x rounded to bfloat16 (nearest even), as float32: what the ops see after the upload."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint32) << 16
    return rounded.view(np.float32)


def assert_rounded_once(got, ref, floor):
    """got (bfloat16 values) within half an ulp of the float64 reference, plus `floor`
    (float32 rounding in the computation, scaled by the caller)."""
    assert got.shape == ref.shape
    assert np.isfinite(got).all()
    assert np.array_equal(bf16(got), got), "not bfloat16 values"
    excess = np.abs(got.astype(np.float64) - ref) - HALF_ULP * np.abs(ref) - floor
    i = np.unravel_index(np.argmax(excess), excess.shape)
    assert excess[i] <= 0, f"at {i}: got {got[i]!r}, want {ref[i]!r}"


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (5, 15, 7), (6, 16, 9), (13, 17, 33), (25, 47, 64),
                                   (193, 33, 5), (401, 100, 31), (32, 1152, 384), (7, 384, 1536)])
def test_weight_gemm_matches_float64_matmul(cpu, rng, m, n, k):
    # Around the 12-row tile and the 16-column panel, past a 192-row block, odd k (the last row
    # of a's pairs taken alone), and the model's shapes.
    a, w = bf16(rng.standard_normal((m, k))), bf16(rng.standard_normal((k, n)))
    ref = a.astype(np.float64) @ w.astype(np.float64)
    floor = 1e-6 * math.sqrt(k) * (np.abs(a).astype(np.float64) @ np.abs(w))
    assert_rounded_once(cpu.weight_gemm(BF, a, w), ref, floor)
    assert_rounded_once(cpu.weight_gemm(BF, a, w, repeat=3), ref, floor)  # overwrites


@pytest.mark.parametrize("act", sorted(ACTS))
@pytest.mark.parametrize("m,n,k", [(1, 5, 3), (13, 37, 29), (200, 48, 64)])
def test_weight_gemm_epilogue_is_applied_before_the_one_rounding(cpu, rng, act, m, n, k):
    a = bf16(rng.standard_normal((m, k)))
    w = bf16(rng.standard_normal((k, n)) / math.sqrt(k))
    bias = bf16(rng.standard_normal(n))
    ref = ACTS[act](a.astype(np.float64) @ w + bias)
    got = cpu.weight_gemm(BF, a, w, bias=bias, act=act)
    assert_rounded_once(got, ref, 1e-5)


def test_weight_gemm_odd_k_ignores_what_follows_a_row(cpu):
    # With k odd, a row's last value pairs with a zero: the next row's value (here inf) must not
    # reach it (inf x 0 is NaN).
    a = np.array([[1.0, 2.0, 3.0], [np.inf, 1.0, 1.0]], np.float32)
    w = np.ones((3, 2), np.float32)
    got = cpu.weight_gemm(BF, a, w)
    assert np.array_equal(got[0], [6.0, 6.0])
    assert np.isinf(got[1]).all()


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (7, 13, 5), (97, 129, 33)])
@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
def test_gemm_matches_float64_matmul(cpu, rng, m, n, k, ta, tb):
    a = bf16(rng.standard_normal((k, m) if ta else (m, k)))
    b = bf16(rng.standard_normal((n, k) if tb else (k, n)))
    opa, opb = (a.T if ta else a).astype(np.float64), (b.T if tb else b).astype(np.float64)
    ref = opa @ opb * 0.5
    floor = 1e-6 * math.sqrt(k) * (np.abs(opa) @ np.abs(opb))
    assert_rounded_once(cpu.gemm(BF, a, b, ta, tb, 0.5), ref, floor)


@pytest.mark.parametrize("batch,m,n,k", [(1, 1, 1, 1), (6, 7, 9, 32), (24, 97, 97, 48)])
@pytest.mark.parametrize("tb", [False, True])
def test_batched_gemm_matches_per_matrix_matmul(cpu, rng, batch, m, n, k, tb):
    a = bf16(rng.standard_normal((batch, m, k)))
    b = bf16(rng.standard_normal((batch, n, k) if tb else (batch, k, n)))
    bb = np.swapaxes(b, 1, 2) if tb else b
    ref = np.einsum("bmk,bkn->bmn", a.astype(np.float64), bb.astype(np.float64))
    floor = 1e-6 * math.sqrt(k) * np.einsum("bmk,bkn->bmn", np.abs(a), np.abs(bb)).astype(np.float64)
    assert_rounded_once(cpu.batched_gemm(BF, a, b, False, tb), ref, floor)


@pytest.mark.parametrize("batch,seq,hidden", [(1, 1, 32), (3, 7, 48), (2, 129, 336)])
def test_embed_layernorm_matches_lookup_and_layernorm(cpu, rng, batch, seq, hidden):
    vocab, positions, types = 53, seq + 5, 3
    ids = rng.integers(0, vocab, (batch, seq)).astype(np.int32)
    tt = rng.integers(0, types, (batch, seq)).astype(np.int32)
    word, pos, typ = (bf16(rng.standard_normal((r, hidden))) for r in (vocab, positions, types))
    gamma, beta = bf16(rng.standard_normal(hidden)), bf16(rng.standard_normal(hidden))
    ref = layernorm64(word[ids].astype(np.float64) + pos[None, :seq] + typ[tt], gamma, beta, 1e-12)
    got = cpu.embed_layernorm(BF, ids, tt, word, pos, typ, gamma, beta, 1e-12)
    assert_rounded_once(got, ref, 1e-5)


@pytest.mark.parametrize("rows,hidden", [(1, 32), (7, 48), (97, 336), (3, 1000)])
def test_add_bias_residual_layernorm_matches_reference(cpu, rng, rows, hidden):
    x, res = (bf16(rng.standard_normal((rows, hidden)) * 3) for _ in range(2))
    bias, gamma, beta = (bf16(rng.standard_normal(hidden)) for _ in range(3))
    ref = layernorm64(x.astype(np.float64) + bias + res, gamma, beta, 1e-5)
    got = cpu.add_bias_residual_layernorm(BF, x, res, bias, gamma, beta, 1e-5)
    assert_rounded_once(got, ref, 2e-5)


@pytest.mark.parametrize("act", sorted(ACTS))
@pytest.mark.parametrize("rows,cols", [(1, 1), (7, 130), (33, 1000)])
def test_add_bias_activation_matches_reference(cpu, rng, act, rows, cols):
    x = bf16(rng.standard_normal((rows, cols)) * 3)
    bias = bf16(rng.standard_normal(cols))
    ref = ACTS[act](x.astype(np.float64) + bias)
    assert_rounded_once(cpu.add_bias_activation(BF, x, bias, act), ref, 2e-6)


def test_results_round_to_nearest_even_and_keep_nan_and_inf(cpu):
    # 1 + 2^-8 lies halfway between bfloat16's 1 and 1 + 2^-7: the even one (1) wins; 1 + 3 * 2^-8
    # lies halfway between 1 + 2^-7 and 1 + 2^-6: 1 + 2^-6 wins. A NaN stays NaN; past the
    # largest bfloat16 is inf.
    x = np.array([[1.0, 1.0 + 2**-7, -1.0, np.nan, 3e38, 1.0 + 2**-7]], np.float32)
    bias = np.array([2**-8, 2**-8, -(2**-8), 0.0, 3e38, 2**-9], np.float32)
    got = cpu.add_bias_activation(BF, x, bias, "identity")[0]
    assert got[0] == 1.0 and got[1] == 1.0 + 2**-6 and got[2] == -1.0
    assert np.isnan(got[3]) and got[4] == np.inf and got[5] == 1.0 + 2**-7


@pytest.mark.parametrize("batch,heads,seq", [(1, 1, 1), (2, 3, 7), (3, 2, 129)])
@pytest.mark.parametrize("left", [False, True])
def test_masked_softmax_matches_reference_and_excludes_padding(cpu, rng, batch, heads, seq, left):
    scores = bf16(rng.standard_normal((batch, heads, seq, seq)) * 4)
    mask = ragged_mask(rng, batch, seq, left=left)
    x = np.where(mask[:, None, None, :] == 1, scores.astype(np.float64) * 0.125, -np.inf)
    e = np.exp(x - x.max(-1, keepdims=True))
    ref = e / e.sum(-1, keepdims=True)
    assert_rounded_once(cpu.masked_softmax(BF, scores, mask, 0.125), ref, 1e-7)


@pytest.mark.parametrize("batch,seq,heads,d", [(1, 1, 1, 32), (2, 7, 3, 48), (3, 97, 2, 64)])
def test_add_qkv_bias_transpose_and_transpose_heads(cpu, rng, batch, seq, heads, d):
    # The split: the float32 sum, rounded once, exactly; the merge: a copy, exactly.
    H = heads * d
    qkv = bf16(rng.standard_normal((batch, seq, 3 * H)))
    bias = bf16(rng.standard_normal(3 * H))
    q, k, v = cpu.add_qkv_bias_transpose(BF, qkv, bias, heads)
    full = bf16(qkv + bias).reshape(batch, seq, 3, heads, d).transpose(2, 0, 3, 1, 4)
    for got, want in zip((q, k, v), full):
        assert np.array_equal(got, want)
    assert np.array_equal(cpu.transpose_heads(BF, q), full[0].transpose(0, 2, 1, 3).reshape(batch, seq, H))


def dots_bound(qkv, bias, mask, heads, scale):
    """[B, S, H]: how far the attention on bfloat16 pairs may be from the float64 one beyond the
    final rounding. Its query (biased, scaled) is rounded to bfloat16, so a score moves by at most
    ds = 2^-9 · scale · Σ_c |q_c| |k_c| (the key bias, which the softmax cancels, is left out), and
    each weight by a factor of at most e^(2 max ds); then each weight is rounded by 2^-9 of it. The
    output moves by at most (2^-9 + e^(2 max ds) - 1) · Σ_j p_j |v_j|; twice that, with margin."""
    B, S, H3 = qkv.shape
    d = H3 // 3 // heads
    x = qkv.astype(np.float64).reshape(B, S, 3, heads, d).transpose(2, 0, 3, 1, 4)
    q = x[0] + bias.astype(np.float64).reshape(3, heads, d)[0][None, :, None, :]
    ds = 2.0**-9 * scale * np.einsum("bhqd,bhkd->bhqk", np.abs(q), np.abs(x[1]))
    ds = np.where(mask[:, None, None, :] == 1, ds, 0.0).max(-1)  # [B, heads, S]
    # Σ_j p_j |v_j|: the attention of |v| with no value bias (the kernel adds it afterwards).
    abs_v = qkv.astype(np.float64).reshape(B, S, 3, heads * d).copy()
    abs_v[:, :, 2] = np.abs(abs_v[:, :, 2])
    no_v_bias = bias.astype(np.float64).reshape(3, heads * d).copy()
    no_v_bias[2] = 0.0
    weighted = attention64(abs_v.reshape(B, S, H3), no_v_bias.reshape(-1), mask, heads, scale)
    factor = 2.0**-9 + np.expm1(2.0 * ds)  # [B, heads, S]
    return 2.0 * np.repeat(factor.transpose(0, 2, 1), d, axis=-1) * weighted


@pytest.mark.parametrize("batch,seq,heads,d", [(1, 1, 1, 1), (2, 7, 3, 5), (3, 97, 2, 48),
                                               (2, 300, 2, 64), (2, 33, 3, 16)])
@pytest.mark.parametrize("packed", [False, True])
def test_flash_attention_matches_float64_reference(cpu, rng, batch, seq, heads, d, packed):
    qkv = bf16(rng.standard_normal((batch, seq, 3 * heads * d)))
    bias = bf16(rng.standard_normal(3 * heads * d))
    mask = ragged_mask(rng, batch, seq, left=not packed)
    scale = 1.0 / math.sqrt(d)
    ref = attention64(qkv, bias, mask, heads, scale)
    got = cpu.flash_attention(BF, qkv, bias, mask, heads, scale, packed=packed)
    # Head dims a multiple of 16: the products on bfloat16 pairs; others in float32, rounded once.
    bound = dots_bound(qkv, bias, mask, heads, scale) if d % 16 == 0 else np.zeros_like(ref)
    if packed:
        ref, bound = ref[mask == 1], bound[mask == 1]
    assert_rounded_once(got, ref, 2e-5 + bound)


def test_the_bfloat16_products_need_their_bound_and_stay_within_it(cpu, rng):
    # The bound is not slack: the products on bfloat16 pairs do move the result past what float32
    # products rounded once would give, by a good part of it.
    batch, seq, heads, d = 2, 130, 2, 32
    qkv = bf16(rng.standard_normal((batch, seq, 3 * heads * d)))
    bias = bf16(rng.standard_normal(3 * heads * d))
    mask = np.ones((batch, seq), np.int32)
    scale = 1.0 / math.sqrt(d)
    ref = attention64(qkv, bias, mask, heads, scale)
    got = cpu.flash_attention(BF, qkv, bias, mask, heads, scale, packed=False).astype(np.float64)
    beyond = np.abs(got - ref) - HALF_ULP * np.abs(ref)
    bound = dots_bound(qkv, bias, mask, heads, scale)
    assert (beyond <= 2e-5 + bound).all()
    assert beyond.max() > 2e-5  # the rounded-once bound alone would not hold


@pytest.mark.parametrize("act", ["tanh", "identity"])
@pytest.mark.parametrize("out", [48, 1, 5])
def test_first_token_dense_is_act_of_dense_on_token_0(cpu, rng, act, out):
    # Two roundings: the GEMM's result, then the bias and activation's (tanh's slope is <= 1).
    hidden = bf16(rng.standard_normal((3, 7, 48)))
    w = bf16(rng.standard_normal((48, out)) * 0.2)
    b = bf16(rng.standard_normal(out))
    dense = hidden[:, 0].astype(np.float64) @ w
    ref = ACTS[act](dense + b)
    got = cpu.first_token_dense(BF, hidden, w, b, act)
    assert_rounded_once(got, ref, HALF_ULP * np.abs(dense) + 1e-5)


def test_both_attention_kinds_run_bfloat16(cpu):
    assert cpu.supports_attention("flash", BF, 64) and cpu.supports_attention("unfused", BF, 7)


def test_bfloat16_models_on_tile_sized_weights_stay_batch_invariant(tmp_path):
    # hidden 64, intermediate 128: k a multiple of 32, where AMX-BF16 takes the weight GEMMs on a
    # CPU that has it (its 32-row steps and the zero-padded last rows included).
    from tests._invariance import VOCAB, check_invariance
    from tests._models import make_model

    make_model(tmp_path, "bert", "cls", hidden=64, heads=2, layers=2, vocab=VOCAB, num_labels=3, seed=4,
               intermediate=128)
    enc = ftbert.Encoder.from_pretrained(tmp_path, dtype="bfloat16")
    check_invariance(enc, "cls", 0, left_ok=False, first_token_always=False, examples=10)


def test_bf16_dot_peak_gives_a_rate_and_refuses_nothing_to_run():
    # The benchmarks' ceiling: a positive rate for one thread and for two; bad arguments refused.
    for threads in (1, 2):
        rate = _ops.cpu_bf16_dot_peak(threads, 1000)
        assert math.isfinite(rate) and rate > 0
    for threads, steps in ((0, 1000), (1, 0)):
        with pytest.raises(ValueError, match="at least 1"):
            _ops.cpu_bf16_dot_peak(threads, steps)
