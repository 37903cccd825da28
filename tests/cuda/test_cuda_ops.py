"""Each CUDA backend op against the CPU backend's op, for float32, float16 and bfloat16.

Inputs are random and rounded to the dtype under test first, so both backends see the same
values; the CPU op runs in float32 and is the reference. The CUDA ops compute in fp32 and round
their result to the dtype once, so the tolerance is `ulps` units in the last place of the output
dtype at the output's magnitude, plus fp32-level noise (FP32_NOISE of the op's natural scale);
for float32 the relative part is FP32_NOISE too. Head split/merge must match exactly.
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

DTYPES = ["float32", "float16", "bfloat16"]
TORCH_DTYPE = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
ULP_AT_ONE = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}
FP32_NOISE = 2e-6  # ~17 float32 ulps; the ops measured well under 1e-6 on an H100
# Half the spacing of the subnormals: below the smallest normal, rounding to the dtype errs by up
# to this much however small the value (float16: a product of ~1e-6 has only ~5 bits left).
SUBNORMAL_HALF_STEP = {"float32": 2.0**-150, "float16": 2.0**-25, "bfloat16": 2.0**-134}


def rounded(x, dtype):
    """x as the device holds it after upload in `dtype` (round to nearest even), as float32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    return torch.from_numpy(x).to(TORCH_DTYPE[dtype]).float().numpy()


def randn(rng, shape, dtype, scale=1.0, offset=0.0):
    return rounded(rng.standard_normal(shape) * scale + offset, dtype)


def check(got, want, dtype, atol, ulps=2, magnitude=None):
    """|got - want| <= rtol * magnitude + atol (+ half a subnormal step) elementwise, magnitude
    defaulting to |want|."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    assert np.isfinite(got).all(), "non-finite values in the CUDA result"
    if got.size == 0:
        return
    rtol = FP32_NOISE if dtype == "float32" else ulps * ULP_AT_ONE[dtype]
    mag = np.abs(want) if magnitude is None else magnitude
    err = np.abs(got - want)
    tol = rtol * mag + atol + SUBNORMAL_HALF_STEP[dtype]
    worst = np.unravel_index(np.argmax(err - tol), err.shape)
    assert (err <= tol).all(), (
        f"{dtype}: error {err[worst]:.3e} > tolerance {tol[worst]:.3e} at {worst} "
        f"(got {got[worst]!r}, want {want[worst]!r})")


# ---- GEMMs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (7, 13, 5), (97, 129, 33), (128, 384, 96),
                                   (37, 53, 1000)])
@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
def test_gemm_matches_cpu_for_every_transpose(gpu, cpu, rng, dtype, m, n, k, ta, tb):
    a = randn(rng, (k, m) if ta else (m, k), dtype)
    b = randn(rng, (n, k) if tb else (k, n), dtype)
    alpha = 0.5
    want = cpu.gemm("float32", a, b, ta, tb, alpha)
    got = gpu.gemm(dtype, a, b, ta, tb, alpha)
    opa, opb = (a.T if ta else a).astype(np.float64), (b.T if tb else b).astype(np.float64)
    bound = alpha * (np.abs(opa) @ np.abs(opb))  # scale of the accumulation's rounding noise
    check(got, want, dtype, atol=FP32_NOISE * bound)


# Without a bias, Hopper runs up to 128 rows as the CUTLASS kernel without its epilogue (n and k
# multiples of 8; gemm_sm90.h), more rows and other shapes as cuBLAS: shapes on both sides of that
# switch and of the 64 x 64 tiles' edges.
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (13, 17, 33), (128, 2304, 768), (1, 64, 64),
                                   (37, 136, 200), (65, 72, 8), (129, 136, 72), (100, 92, 64),
                                   (96, 64, 60)])
def test_weight_gemm_matches_cpu(gpu, cpu, rng, dtype, m, n, k):
    # The CUDA backend keeps weights as they are (row-major) and runs its gemm; the CPU packs them.
    a = randn(rng, (m, k), dtype)
    w = randn(rng, (k, n), dtype)
    want = cpu.weight_gemm("float32", a, w)
    bound = np.abs(a.astype(np.float64)) @ np.abs(w.astype(np.float64))
    check(gpu.weight_gemm(dtype, a, w), want, dtype, atol=FP32_NOISE * bound)
    # With the FFN-in epilogue (bias + GELU). The GEMM's output is rounded to dtype before the
    # bias and GELU (slope at most ~1.13) are applied: the tolerance is relative to |a·W| + |bias|.
    bias = randn(rng, (n,), dtype)
    want = cpu.weight_gemm("float32", a, w, bias=bias, act="gelu")
    got = gpu.weight_gemm(dtype, a, w, bias=bias, act="gelu")
    magnitude = np.abs(cpu.weight_gemm("float32", a, w)) + np.abs(bias)
    check(got, want, dtype, atol=1.2 * FP32_NOISE * bound + 1e-6, ulps=3, magnitude=magnitude)
    # A bias alone (DeBERTa's QKV): in cuBLASLt's epilogue in 16 bits, a pass after in float32.
    want = cpu.weight_gemm("float32", a, w, bias=bias, act="identity")
    got = gpu.weight_gemm(dtype, a, w, bias=bias, act="identity")
    check(got, want, dtype, atol=FP32_NOISE * bound + 1e-6, ulps=2, magnitude=magnitude)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_bias_alone_is_added_in_the_gemm(gpu, rng, dtype):
    # One kernel: no bias pass after the product (DeBERTa-v3-base's QKV shape at 128 rows).
    a = randn(rng, (128, 768), dtype)
    w = randn(rng, (768, 2304), dtype, scale=768**-0.5)
    bias = randn(rng, (2304,), dtype)
    names = _kernel_names(lambda: gpu.weight_gemm(dtype, a, w, bias=bias, act="identity"))
    assert names and not any("bias_activation" in n for n in names), names


# Hopper runs FFN-in (bias + erf-GELU) as one CUTLASS kernel that applies the bias and GELU to
# the fp32 accumulators, in 64 x 64 tiles up to 128 rows and 128 x 256 from 4,096 (gemm_sm90.h);
# other row counts, shapes TMA cannot take (rows not 16-byte aligned) and float32 run cuBLAS +
# add_bias_activation. Each against the CPU in float32, on both sides of each switch and of the
# tiles' edges.
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k", [(1, 64, 64), (77, 136, 200), (128, 264, 72), (129, 136, 72),
                                   (4096, 136, 72), (4133, 264, 200), (4097, 100, 40)])
def test_ffn_in_gemm_matches_cpu(gpu, cpu, rng, dtype, m, n, k):
    a = randn(rng, (m, k), dtype)
    w = randn(rng, (k, n), dtype, scale=k**-0.5)
    bias = randn(rng, (n,), dtype)
    want = cpu.weight_gemm("float32", a, w, bias=bias, act="gelu")
    got = gpu.weight_gemm(dtype, a, w, bias=bias, act="gelu")
    bound = np.abs(a.astype(np.float64)) @ np.abs(w.astype(np.float64))
    magnitude = np.abs(cpu.weight_gemm("float32", a, w)) + np.abs(bias)
    check(got, want, dtype, atol=1.2 * FP32_NOISE * bound + 1e-6, ulps=3, magnitude=magnitude)


@pytest.mark.skipif(not _ops.cuda_fused_gemm_built(),
                    reason="this build has no Hopper CUTLASS GEMMs (no CUTLASS headers at build time)")
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="the Hopper CUTLASS GEMMs are sm_90a code")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("choice", ["fixed", "auto"])
def test_plain_weight_gemm_runs_as_gemm_sm90_h_says(gpu, rng, dtype, choice):
    # Up to 128 rows with n and k multiples of 8: one CUTLASS kernel; otherwise cuBLAS. A path
    # that silently fell back would pass the value tests. Below 512 rows "auto" keeps the rule.
    gpu.set_gemm_choice(choice)
    try:
        for m, n, k, cutlass in ((1, 96, 64, True), (128, 96, 64, True), (129, 96, 64, False),
                                 (100, 92, 64, False), (100, 96, 60, False)):
            a = randn(rng, (m, k), dtype)
            w = randn(rng, (k, n), dtype)
            names = _kernel_names(lambda: gpu.weight_gemm(dtype, a, w))
            kernels = [x for x in names if "Memcpy" not in x and "Memset" not in x]
            ours = [x for x in kernels if "GemmUniversal" in x]  # CUTLASS 3's kernel
            assert len(ours) == int(cutlass), (m, n, k, kernels)
            assert len(kernels) == 1, (m, n, k, kernels)
    finally:
        gpu.set_gemm_choice("auto")


@pytest.mark.skipif(not _ops.cuda_fused_gemm_built(),
                    reason="this build has no Hopper FFN-in GEMM (no CUTLASS headers at build time)")
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="the Hopper FFN-in GEMM is sm_90a code")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_fused_gemm_gelu_is_erf_gelu_rounded_once(gpu, dtype):
    # x · I = x exactly, so the fused kernel's output is its GELU of x, rounded once: within an
    # ulp of float64 erf-GELU wherever the result is representable, the negative tail included
    # (the epilogue's GELU is a polynomial fit, not erff).
    x = np.linspace(-12.0, 12.0, 4096 * 64)
    x = np.concatenate([x, -np.logspace(-6, 1.2, 4096), np.logspace(-6, 1.2, 4096)])
    x = rounded(x[: x.size // 64 * 64], dtype).reshape(-1, 64)
    # The fixed rule runs the fused kernel at these 4,224 rows; "auto" may pick cuBLAS +
    # add_bias_activation instead, whose 1 + erf loses the far tail's relative precision.
    assert x.shape[0] >= 4096
    gpu.set_gemm_choice("fixed")
    try:
        got = gpu.weight_gemm(dtype, x, np.eye(64, dtype=np.float32), bias=np.zeros(64, np.float32),
                              act="gelu").astype(np.float64)
    finally:
        gpu.set_gemm_choice("auto")
    xd = x.astype(np.float64)
    want = 0.5 * xd * np.vectorize(math.erfc)(-xd / math.sqrt(2.0))  # 1 + erf cancels in the tail
    core = xd >= -8.0  # Φ(-8) ~ 6e-16: below that the result is zero to any use
    subnormal_step = 2.0**-24 if dtype == "float16" else 0.0
    check(got[core], want[core], dtype, atol=subnormal_step, ulps=1)
    assert np.abs(got[~core]).max() < 1e-13


def _kernel_names(fn):
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.key for e in prof.key_averages()
            if (getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)) > 0]


@pytest.mark.skipif(not _ops.cuda_fused_gemm_built(),
                    reason="this build has no Hopper FFN-in GEMM (no CUTLASS headers at build time)")
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="the Hopper FFN-in GEMM is sm_90a code")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_ffn_in_gemm_runs_as_gemm_sm90_h_says(gpu, rng, dtype):
    # The rule of gemm_sm90.h: one fused kernel in 64 x 64 tiles up to 128 rows and in cooperative
    # 128 x 256 tiles from 4,096 (aligned shapes); cuBLAS + add_bias_activation in between and when
    # n is not a multiple of 8. A fused path that silently fell back would pass the value tests.
    # This is the "fixed" choice; "auto" times candidates from 512 rows (test_gemm_choice.py).
    bias = randn(rng, (96,), dtype)
    gpu.set_gemm_choice("fixed")
    try:
        for m, n, tiles in ((1, 96, "64x64"), (128, 96, "64x64"), (129, 96, None),
                            (4095, 96, None), (4096, 96, "128x256"), (100, 92, None),
                            (4096, 92, None)):
            _check_ffn_in_kernels(gpu, rng, dtype, bias, m, n, tiles)
    finally:
        gpu.set_gemm_choice("auto")


def _check_ffn_in_kernels(gpu, rng, dtype, bias, m, n, tiles):
    a = randn(rng, (m, 64), dtype)
    w = randn(rng, (64, n), dtype)
    names = _kernel_names(lambda: gpu.weight_gemm(dtype, a, w, bias=bias[:n], act="gelu"))
    kernels = [k for k in names if "Memcpy" not in k and "Memset" not in k]
    ours = [k for k in kernels if "GemmUniversal" in k]  # CUTLASS 3's kernel (cuBLAS has others)
    assert len(ours) == (tiles is not None), (m, n, kernels)
    assert len(kernels) == (1 if tiles else 2), (m, n, kernels)
    if tiles:
        assert ("Cooperative" in ours[0]) == (tiles == "128x256"), (m, n, kernels)


@pytest.fixture
def invariant_gpu():
    """A runner whose backend is batch-invariant (its batched_gemm runs the ordered kernel)."""
    from ftbert import _ops

    runner = _ops.OpRunner("cuda")
    runner.batch_invariant = True
    return runner


# cuBLAS's choice ("gpu"), and under batch_invariant the ordered kernel: tensor cores for 16-bit
# A · Bᵀ with aligned rows (k 32 and 64 here), FMAs otherwise.
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("runner,batch,m,n,k", [
    ("gpu", 1, 1, 1, 1), ("gpu", 6, 7, 9, 32), ("gpu", 24, 97, 97, 48), ("gpu", 4, 129, 64, 129),
    ("invariant_gpu", 1, 1, 1, 1), ("invariant_gpu", 6, 7, 9, 32), ("invariant_gpu", 3, 130, 67, 64),
    ("invariant_gpu", 2, 65, 129, 17)])
@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
def test_batched_gemm_matches_cpu(request, cpu, rng, dtype, runner, batch, m, n, k, ta, tb):
    a = randn(rng, (batch, k, m) if ta else (batch, m, k), dtype)
    b = randn(rng, (batch, n, k) if tb else (batch, k, n), dtype)
    want = cpu.batched_gemm("float32", a, b, ta, tb, 1.0)
    got = request.getfixturevalue(runner).batched_gemm(dtype, a, b, ta, tb, 1.0)
    opa = np.swapaxes(a, 1, 2) if ta else a
    opb = np.swapaxes(b, 1, 2) if tb else b
    bound = np.abs(opa.astype(np.float64)) @ np.abs(opb.astype(np.float64))
    check(got, want, dtype, atol=FP32_NOISE * bound)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 48, 20])
def test_batch_invariant_batched_gemm_keeps_each_elements_bits_at_any_shape(invariant_gpu, rng, dtype, d):
    # DeBERTa's term tables: [rows, d] x [d, columns] per head, the rows being every token of the
    # batch. A row's products must not move with how many rows, columns or heads come with it.
    # d 64 and 48 run the tensor-core kernel in 16-bit dtypes (48: a last k slice half zeros), 20
    # the FMA kernel (rows not 16-byte aligned).
    heads, rows, cols = 5, 300, 77
    q = randn(rng, (heads, rows, d), dtype)
    rel = randn(rng, (heads, cols, d), dtype)
    full = invariant_gpu.batched_gemm(dtype, q, rel, False, True, 1.0)
    for h, r0, r1, c1 in [(5, 0, 1, 77), (5, 17, 18, 77), (2, 0, 300, 40), (1, 250, 300, 8), (3, 64, 129, 77)]:
        part = invariant_gpu.batched_gemm(dtype, np.ascontiguousarray(q[:h, r0:r1]),
                                          np.ascontiguousarray(rel[:h, :c1]), False, True, 1.0)
        assert np.array_equal(part, full[:h, r0:r1, :c1]), (h, r0, r1, c1)
    # cuBLAS's own choice, for contrast, is held to a tolerance only (test_batched_gemm_matches_cpu).


# ---- embeddings + LayerNorm ------------------------------------------------------------------


def embedding_inputs(rng, dtype, batch, seq, hidden, vocab=1000, types=2):
    ids = rng.integers(0, vocab, (batch, seq)).astype(np.int32)
    tt = rng.integers(0, types, (batch, seq)).astype(np.int32)
    word = randn(rng, (vocab, hidden), dtype, 0.5)
    pos = randn(rng, (seq + 3, hidden), dtype, 0.5)
    typ = randn(rng, (types, hidden), dtype, 0.5, offset=0.3)
    gamma = randn(rng, hidden, dtype, 0.3, offset=1.0)
    beta = randn(rng, hidden, dtype, 0.2)
    return ids, tt, word, pos, typ, gamma, beta


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch,seq,hidden", [(1, 1, 32), (3, 7, 336), (2, 97, 333),
                                              (2, 129, 768), (1, 5, 1030)])
@pytest.mark.parametrize("eps", [1e-12, 1e-5])
def test_embed_layernorm_matches_cpu(gpu, cpu, rng, dtype, batch, seq, hidden, eps):
    ids, tt, word, pos, typ, gamma, beta = embedding_inputs(rng, dtype, batch, seq, hidden)
    want = cpu.embed_layernorm("float32", ids, tt, word, pos, typ, gamma, beta, eps)
    got = gpu.embed_layernorm(dtype, ids, tt, word, pos, typ, gamma, beta, eps)
    check(got, want, dtype, atol=FP32_NOISE * np.abs(want).max())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch,seq,hidden", [(1, 1, 32), (3, 7, 336), (2, 300, 768)])
def test_embed_layernorm_padding_offset_positions_match_cpu(gpu, cpu, rng, dtype, batch, seq, hidden):
    # The RoBERTa family's positions (counted from pad id 1 over non-pad ids), left and right pads.
    pad = 1
    ids, tt, word, _, typ, gamma, beta = embedding_inputs(rng, dtype, batch, seq, hidden, vocab=50)
    ids[0, : seq // 3] = pad
    ids[-1, seq - seq // 4 :] = pad
    pos = randn(rng, (seq + pad + 1, hidden), dtype, 0.5)
    want = cpu.embed_layernorm("float32", ids, tt, word, pos, typ, gamma, beta, 1e-5, position_pad_id=pad)
    got = gpu.embed_layernorm(dtype, ids, tt, word, pos, typ, gamma, beta, 1e-5, position_pad_id=pad)
    check(got, want, dtype, atol=FP32_NOISE * np.abs(want).max())


def test_embed_layernorm_clamps_out_of_range_ids(gpu, cpu, rng):
    # The kernel clamps ids and types into range, so bad device input reads valid rows. If the
    # binding validates host ids first, nothing reaches the kernel and there is nothing to check.
    batch, seq, hidden, vocab = 2, 6, 96, 50
    ids, tt, word, pos, typ, gamma, beta = embedding_inputs(rng, "float32", batch, seq, hidden,
                                                            vocab=vocab)
    ids[0, 1], ids[1, 4] = -3, vocab + 7
    tt[1, 2] = 5
    try:
        got = gpu.embed_layernorm("float32", ids, tt, word, pos, typ, gamma, beta, 1e-12)
    except (RuntimeError, ValueError):
        pytest.skip("the binding rejects out-of-range host ids before the kernel runs")
    clamped_ids = np.clip(ids, 0, vocab - 1).astype(np.int32)
    clamped_tt = np.clip(tt, 0, typ.shape[0] - 1).astype(np.int32)
    want = cpu.embed_layernorm("float32", clamped_ids, clamped_tt, word, pos, typ, gamma, beta,
                               1e-12)
    check(got, want, "float32", atol=FP32_NOISE * np.abs(want).max())


# ---- attention pieces -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch,seq,heads,d", [(1, 1, 1, 32), (2, 7, 7, 48), (2, 97, 3, 64),
                                               (1, 129, 2, 128), (2, 5, 3, 33), (1, 9, 2, 36)])
def test_add_qkv_bias_transpose_matches_cpu_exactly(gpu, cpu, rng, dtype, batch, seq, heads, d):
    H = heads * d
    qkv = randn(rng, (batch, seq, 3 * H), dtype)
    bias = randn(rng, 3 * H, dtype)
    want = cpu.add_qkv_bias_transpose("float32", qkv, bias, heads)
    got = gpu.add_qkv_bias_transpose(dtype, qkv, bias, heads)
    for name, g, w in zip("qkv", got, want):
        assert g.shape == (batch, heads, seq, d), name
        # Same fp32 sum on both sides, rounded once to the dtype: bit-identical.
        np.testing.assert_array_equal(g, rounded(w, dtype), err_msg=name)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch,heads,seq,d", [(1, 1, 1, 32), (2, 3, 7, 48), (2, 4, 97, 64),
                                               (1, 2, 129, 128), (2, 3, 5, 33)])
def test_transpose_heads_matches_cpu_exactly(gpu, cpu, rng, dtype, batch, heads, seq, d):
    x = randn(rng, (batch, heads, seq, d), dtype)
    want = cpu.transpose_heads("float32", x)
    got = gpu.transpose_heads(dtype, x)
    assert got.shape == (batch, seq, heads * d)
    np.testing.assert_array_equal(got, want)


# seq <= 1024 runs the warp-per-row kernel (1024: 32 keys per lane); longer rows the block kernel,
# with the row cached in registers (1031: 8 scalars per thread; 2048: vectors) or, for 2049 keys
# with no vector width dividing them, streamed through global memory twice.
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch,heads,seq", [(1, 1, 1), (2, 3, 7), (3, 2, 97), (3, 2, 129),
                                             (2, 2, 512), (2, 1, 1024), (2, 1, 1031),
                                             (2, 2, 2048), (2, 1, 2049)])
@pytest.mark.parametrize("left", [False, True])
def test_masked_softmax_matches_cpu_and_zeroes_padding(gpu, cpu, rng, dtype, batch, heads, seq,
                                                       left):
    scores = randn(rng, (batch, heads, seq, seq), dtype, 4.0)
    mask = ragged_mask(rng, batch, seq, left=left)
    if batch > 1:
        mask[-1] = 0  # a sequence with every key masked
    scale = 0.125
    want = cpu.masked_softmax("float32", scores, mask, scale)
    got = gpu.masked_softmax(dtype, scores, mask, scale)
    check(got, want, dtype, atol=1e-6)
    padded_keys = np.broadcast_to(mask[:, None, None, :] == 0, got.shape)
    assert (got[padded_keys] == 0).all(), "padded keys must get probability exactly 0"
    if batch > 1:
        assert (got[-1] == 0).all(), "a fully masked row must be all zeros"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seq", [1, 7, 97, 1031, 2049])
@pytest.mark.parametrize("window", [0, 5])
def test_batch_invariant_masked_softmax_matches_cpu(invariant_gpu, cpu, rng, dtype, seq, window):
    # The ordered variant at every length (warp per row).
    batch, heads = 2, 2
    scores = randn(rng, (batch, heads, seq, seq), dtype, 4.0)
    mask = ragged_mask(rng, batch, seq)
    want = cpu.masked_softmax("float32", scores, mask, 0.125, window=window)
    got = invariant_gpu.masked_softmax(dtype, scores, mask, 0.125, window=window)
    check(got, want, dtype, atol=1e-6)
    assert (got[np.broadcast_to(mask[:, None, None, :] == 0, got.shape)] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_invariant_masked_softmax_keeps_a_rows_bits_at_any_padded_length(invariant_gpu, rng, dtype):
    # A sequence of 37 keys padded to 37, 40, 64, 1100 and 2100: its rows' probabilities are the
    # same bits (the default variants choose their layout by length).
    length, heads = 37, 3
    scores = randn(rng, (1, heads, length, length), dtype, 4.0)
    first = None
    for seq in (37, 40, 64, 1100, 2100):
        padded = np.zeros((1, heads, seq, seq), np.float32)
        padded[:, :, :length, :length] = scores
        padded[:, :, :length, length:] = rng.standard_normal((1, heads, length, seq - length))
        mask = np.zeros((1, seq), np.int32)
        mask[0, :length] = 1
        got = invariant_gpu.masked_softmax(dtype, padded, mask, 0.125)[:, :, :length, :length]
        if first is None:
            first = got
        assert np.array_equal(got, first), seq


@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_softmax_large_scores_do_not_overflow(gpu, cpu, rng, dtype):
    # Scaled scores around ±1e4: exp without the max subtracted would overflow to inf.
    batch, heads, seq = 2, 2, 77
    scores = randn(rng, (batch, heads, seq, seq), dtype, 1e4)
    mask = ragged_mask(rng, batch, seq)
    want = cpu.masked_softmax("float32", scores, mask, 1.0)
    got = gpu.masked_softmax(dtype, scores, mask, 1.0)
    check(got, want, dtype, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch,seq,heads,d", [(1, 1, 2, 32), (3, 97, 2, 48), (2, 129, 3, 64),
                                               (2, 512, 2, 128)])
def test_unfused_attention_composed_from_ops_matches_float64(gpu, cpu, rng, dtype, batch, seq,
                                                             heads, d):
    # The unfused path as the encoder runs it (QKV split, QKᵀ, masked softmax, PV, head merge)
    # against a float64 reference. Bound: 2x the error of the same sequence of ops on the CPU
    # with every intermediate rounded to the dtype, i.e. the error the dtype causes anyway.
    H = heads * d
    scale = 1.0 / math.sqrt(d)
    qkv = randn(rng, (batch, seq, 3 * H), dtype)
    bias = randn(rng, 3 * H, dtype)
    mask = ragged_mask(rng, batch, seq, left=True)
    if batch > 2:
        mask[1] = 0

    def attention(runner, run_dtype, round_to):
        q, k, v = (x.reshape(batch * heads, seq, d) for x in
                   runner.add_qkv_bias_transpose(run_dtype, qkv, bias, heads))
        q, k, v = (rounded(x, round_to) for x in (q, k, v))
        s = rounded(runner.batched_gemm(run_dtype, q, k, False, True, 1.0), round_to)
        p = runner.masked_softmax(run_dtype, s.reshape(batch, heads, seq, seq), mask, scale)
        p = rounded(p, round_to).reshape(batch * heads, seq, seq)
        ctx = rounded(runner.batched_gemm(run_dtype, p, v, False, False, 1.0), round_to)
        return runner.transpose_heads(run_dtype, ctx.reshape(batch, heads, seq, d))

    x = (qkv.astype(np.float64) + bias).reshape(batch, seq, 3, heads, d).transpose(2, 0, 3, 1, 4)
    s = np.einsum("bhqd,bhkd->bhqk", x[0], x[1]) * scale
    s = np.where(mask[:, None, None, :] != 0, s, -np.inf)
    row_max = s.max(-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(row_max), row_max, 0.0))
    denom = e.sum(-1, keepdims=True)
    p = e / np.where(denom > 0, denom, 1.0)
    ref = np.einsum("bhqk,bhkd->bhqd", p, x[2]).transpose(0, 2, 1, 3).reshape(batch, seq, H)

    got = attention(gpu, dtype, dtype)
    emulated = attention(cpu, "float32", dtype)
    assert np.isfinite(got).all()
    if batch > 2:
        assert (got[1] == 0).all(), "a sequence with no key to attend must give zeros"
    err = np.abs(got - ref).max()
    dtype_err = np.abs(emulated - ref).max()
    tol = 2 * dtype_err + FP32_NOISE * np.abs(x[2]).max()
    assert err <= tol, f"{dtype}: max error {err:.3e} > {tol:.3e} (dtype's own {dtype_err:.3e})"


def test_attention_kinds_reported_and_unsupported_flash_raises(gpu, rng):
    for dtype in DTYPES:
        for d in (32, 33, 48, 64, 128):
            assert gpu.supports_attention("unfused", dtype, d)
            if gpu.supports_attention("flash", dtype, d):
                continue
            heads, seq = 2, 3
            qkv = randn(rng, (1, seq, 3 * heads * d), "float32")
            with pytest.raises(RuntimeError, match="flash"):
                gpu.flash_attention(dtype, qkv, np.zeros(3 * heads * d, np.float32),
                                    np.ones((1, seq), np.int32), heads, 1.0 / math.sqrt(d))


# ---- residual LayerNorm, activation, pooler ---------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,hidden", [(1, 32), (7, 48), (97, 336), (127, 768), (5, 333),
                                         (3, 1030), (4, 4096), (2, 13000), (5, 768), (128, 768),
                                         (301, 1000), (4096, 768), (4097, 130), (4099, 1000),
                                         (4098, 1024), (4096, 1030)])
def test_add_bias_residual_layernorm_matches_cpu(gpu, cpu, rng, dtype, rows, hidden):
    # An offset mean (2.0) checks the variance is not computed as E[x²] - E[x]²; hidden 13000
    # needs more than 48 KiB of shared memory per row (the opt-in path). From 128 rows, rows of
    # up to 1024 16-bit values (512 float32) run one warp each, 1 to 4 vectors a lane (row counts
    # not a multiple of the 4 rows of a block too); longer rows, and fewer, a block each.
    x = randn(rng, (rows, hidden), dtype, 3.0, offset=2.0)
    residual = randn(rng, (rows, hidden), dtype, 3.0)
    bias = randn(rng, hidden, dtype)
    gamma = randn(rng, hidden, dtype, 0.3, offset=1.0)
    beta = randn(rng, hidden, dtype, 0.2)
    want = cpu.add_bias_residual_layernorm("float32", x, residual, bias, gamma, beta, 1e-5)
    got = gpu.add_bias_residual_layernorm(dtype, x, residual, bias, gamma, beta, 1e-5)
    check(got, want, dtype, atol=FP32_NOISE * np.abs(want).max())


def spike_rows(rows, hidden, gain, dtype):
    """x, residual, bias, gamma, beta whose every row normalizes to one spike: x[r, 0] = hidden
    and zeros elsewhere, so element 0 of each row comes out as gain * sqrt(hidden - 1) (the rest
    as -gain / sqrt(hidden - 1)); gamma = gain, everything else zero."""
    x = np.zeros((rows, hidden), np.float32)
    x[:, 0] = hidden
    zeros = np.zeros(hidden, np.float32)
    gamma = rounded(np.full(hidden, gain, np.float32), dtype)
    return x, np.zeros_like(x), zeros, gamma, zeros


# Outputs just either side of where rounding to the dtype overflows: float16 65,520 (the spike
# at 65,477 / 65,533), bfloat16 (2 - 2^-8) * 2^127 ~ 3.3962e38 (at 3.377e38 / 3.3998e38, finite in
# float32), float32 past its own range; through the block kernel (1 row) and the warp-per-row one
# (4,096 rows).
BF16_GAIN = 2.0**116  # bfloat16's spacing at 2^123: 146 and 147 of them are exact


@pytest.mark.parametrize("rows", [1, 4096])
@pytest.mark.parametrize("dtype,gain,overflows", [("float16", 2352.0, False),
                                                  ("float16", 2354.0, True),
                                                  ("bfloat16", 146 * BF16_GAIN, False),
                                                  ("bfloat16", 147 * BF16_GAIN, True),
                                                  ("float32", 1.2e37, False),
                                                  ("float32", 1.23e37, True)])
def test_add_bias_residual_layernorm_flags_outputs_that_overflow_the_dtype(gpu, dtype, rows, gain,
                                                                           overflows):
    hidden = 776  # the spike comes out as gain * sqrt(775) = gain * 27.84
    args = spike_rows(rows, hidden, gain, dtype)
    out, flagged = gpu.add_bias_residual_layernorm(dtype, *args, 1e-5, report_nonfinite=True)
    assert flagged == overflows
    assert np.isinf(out[:, 0]).all() == overflows
    assert np.isfinite(out[:, 1:]).all()
    if not overflows:
        assert out[0, 0] == pytest.approx(gain * math.sqrt(hidden - 1), rel=1e-2)
    else:  # what the value rounds from is finite in float32 (but for float32 itself)
        assert (gain * math.sqrt(hidden - 1) < 3.4e38) == (dtype != "float32")


@pytest.mark.parametrize("rows", [1, 4096])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("where", ["x", "gamma"])
def test_add_bias_residual_layernorm_flags_nan(gpu, rng, dtype, rows, where):
    # A NaN input poisons its whole row; a NaN gamma only its own column.
    x = randn(rng, (rows, 96), dtype)
    residual = randn(rng, (rows, 96), dtype)
    bias, gamma, beta = randn(rng, 96, dtype), randn(rng, 96, dtype, 0.3, 1.0), randn(rng, 96, dtype)
    _, flagged = gpu.add_bias_residual_layernorm(dtype, x, residual, bias, gamma, beta, 1e-5,
                                                 report_nonfinite=True)
    assert not flagged
    if where == "x":
        x[rows - 1, 7] = np.nan
    else:
        gamma[50] = np.nan
    out, flagged = gpu.add_bias_residual_layernorm(dtype, x, residual, bias, gamma, beta, 1e-5,
                                                   report_nonfinite=True)
    assert flagged
    assert np.isnan(out).any()


# (m, n, k) on both sides of each split rule of gemm/split_k.h (splits in the comment), k that
# allows fewer splits than the rule asks (slices stay multiples of 8), and odd n.
DENSE_LN_SHAPES = [(1, 768, 3072),     # 4
                   (77, 768, 3072),    # 4
                   (256, 768, 3072),   # 4
                   (257, 768, 3072),   # 1
                   (128, 768, 768),    # 2
                   (256, 768, 768),    # 2
                   (300, 768, 768),    # 1
                   (33, 96, 1000),     # 1: no split keeps slices multiples of 8
                   (33, 96, 2088),     # 3 (4 would not)
                   (5, 99, 2048),      # 4, odd n
                   (9, 64, 256)]       # 1: k too short


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k", DENSE_LN_SHAPES)
@pytest.mark.parametrize("workspace", [True, False], ids=["workspace", "none"])
def test_dense_residual_layernorm_matches_cpu(gpu, cpu, rng, dtype, m, n, k, workspace):
    a = randn(rng, (m, k), dtype)
    w = randn(rng, (k, n), dtype, 1.0 / math.sqrt(k))
    residual = randn(rng, (m, n), dtype, 2.0)
    bias, beta = randn(rng, n, dtype), randn(rng, n, dtype, 0.2)
    gamma = randn(rng, n, dtype, 0.3, offset=1.0)
    want = cpu.dense_residual_layernorm("float32", a, w, bias, residual, gamma, beta, 1e-5)
    got = gpu.dense_residual_layernorm(dtype, a, w, bias, residual, gamma, beta, 1e-5,
                                       workspace=workspace)
    # The GEMM's error before the normalization: the unsplit path rounds a·W to the dtype (2 ulps
    # of it), both accumulate in fp32; it reaches the output scaled by gamma / std of the row.
    a64, w64 = a.astype(np.float64), w.astype(np.float64)
    pre = a64 @ w64 + bias + residual
    gemm_ulp = FP32_NOISE if dtype == "float32" else 2 * ULP_AT_ONE[dtype]
    gemm_err = gemm_ulp * np.abs(a64 @ w64) + FP32_NOISE * (np.abs(a64) @ np.abs(w64))
    atol = (gemm_err.max(axis=1, keepdims=True) / pre.std(axis=1, keepdims=True)
            * np.abs(gamma).max() + FP32_NOISE * np.abs(want).max())
    check(got, want, dtype, atol=atol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k", [(128, 768, 3072), (300, 768, 768), (33, 96, 1000)])
def test_dense_residual_layernorm_into_its_own_product_buffer_is_the_same(gpu, rng, dtype, m, n, k):
    # With a product buffer (a forward's redirectable output), the GEMM writes there and only the
    # LayerNorm writes out: the same values as in place, split (128 rows) or not.
    a = randn(rng, (m, k), dtype)
    w = randn(rng, (k, n), dtype, 1.0 / math.sqrt(k))
    residual = randn(rng, (m, n), dtype, 2.0)
    bias, beta, gamma = randn(rng, n, dtype), randn(rng, n, dtype), randn(rng, n, dtype)
    for workspace in (True, False):
        want = gpu.dense_residual_layernorm(dtype, a, w, bias, residual, gamma, beta,
                                            workspace=workspace)
        got = gpu.dense_residual_layernorm(dtype, a, w, bias, residual, gamma, beta,
                                           workspace=workspace, product=True)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_dense_residual_layernorm_splits_as_split_k_h_says(gpu, rng, dtype):
    # The split path is one GEMM and the LayerNorm that reads the partials; without a workspace,
    # or with rows enough, the GEMM and the LayerNorm of the GEMM output.
    n = 768
    v = randn(rng, n, dtype)
    for m, k, workspace, split in ((128, 3072, True, True), (256, 768, True, True),
                                   (128, 3072, False, False), (257, 3072, True, False)):
        a, w = randn(rng, (m, k), dtype), randn(rng, (k, n), dtype, 1.0 / math.sqrt(k))
        r = randn(rng, (m, n), dtype)
        names = _kernel_names(lambda: gpu.dense_residual_layernorm(
            dtype, a, w, v, r, v, v, workspace=workspace))
        kernels = [x for x in names if "Memcpy" not in x and "Memset" not in x]
        norms = [x for x in kernels if "layernorm" in x]
        assert len(norms) == 1, (m, k, kernels)
        assert ("SplitPartials" in norms[0]) == split, (m, k, workspace, kernels)


# k split 2 ways (128 rows; split_k.h) and unsplit, at widths 768 and 392.
@pytest.mark.parametrize("m,n", [(128, 768), (300, 768), (1000, 768), (600, 392)])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("where", ["a", "gamma", "overflow"])
def test_dense_residual_layernorm_flags_nonfinite(gpu, rng, dtype, m, n, where):
    # A NaN in a row of `a` poisons that row; a NaN gamma its column; a gamma that scales a
    # spike past the dtype's range overflows its one value.
    k = 768
    a, w = randn(rng, (m, k), dtype), randn(rng, (k, n), dtype, 1.0 / math.sqrt(k))
    residual, bias = randn(rng, (m, n), dtype), randn(rng, n, dtype)
    gamma, beta = randn(rng, n, dtype, 0.3, offset=1.0), randn(rng, n, dtype)
    args = (a, w, bias, residual, gamma, beta, 1e-5)
    out, flagged = gpu.dense_residual_layernorm(dtype, *args, report_nonfinite=True)
    assert not flagged and np.isfinite(out).all()
    if where == "a":
        a[m - 1, 3] = np.nan
        bad = np.zeros((m, n), bool)
        bad[m - 1] = True
    elif where == "gamma":
        gamma[n - 5] = np.nan
        bad = np.zeros((m, n), bool)
        bad[:, n - 5] = True
    else:
        residual[m // 2, 7] = 1000.0  # about sqrt(n) standard deviations of its row
        gamma[7] = 3600.0 if dtype == "float16" else 3e37  # other rows' |z| < 5 stay finite
        bad = np.zeros((m, n), bool)
        bad[m // 2, 7] = True
    out, flagged = gpu.dense_residual_layernorm(dtype, *args, report_nonfinite=True)
    assert flagged
    assert not np.isfinite(out[bad]).any()
    assert np.isfinite(out[~bad]).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ["gelu", "gelu_tanh", "relu", "tanh", "identity", "silu"])
@pytest.mark.parametrize("rows,cols", [(1, 1), (7, 130), (33, 1000), (5, 3072), (3, 333)])
def test_add_bias_activation_matches_cpu(gpu, cpu, rng, dtype, act, rows, cols):
    x = randn(rng, (rows, cols), dtype, 3.0)
    bias = randn(rng, cols, dtype)
    want = cpu.add_bias_activation("float32", x, bias, act)
    got = gpu.add_bias_activation(dtype, x, bias, act)
    # Absolute noise scales with the input: gelu's tail is a difference of nearly equal terms.
    check(got, want, dtype, atol=FP32_NOISE * np.maximum(1.0, np.abs(x + bias)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch,seq,hidden,out,act", [
    (1, 1, 32, 32, "tanh"), (3, 7, 48, 48, "tanh"), (2, 9, 336, 336, "tanh"), (4, 5, 768, 768, "tanh"),
    # classification heads: their own dense (GELU, ReLU) and odd label counts
    (3, 7, 48, 48, "gelu"), (5, 4, 64, 64, "relu"), (3, 7, 48, 1, "identity"), (6, 3, 96, 5, "identity"),
])
def test_first_token_dense_matches_cpu(gpu, cpu, rng, dtype, batch, seq, hidden, out, act):
    hidden_states = randn(rng, (batch, seq, hidden), dtype)
    weight = randn(rng, (hidden, out), dtype, 1.0 / math.sqrt(hidden))
    bias = randn(rng, out, dtype, 0.5)
    want = cpu.first_token_dense("float32", hidden_states, weight, bias, act)
    got = gpu.first_token_dense(dtype, hidden_states, weight, bias, act)
    first = hidden_states[:, 0].astype(np.float64)
    dense = first @ weight
    # The CUDA op rounds the GEMM output to the dtype before bias + activation (slope <= ~1.13),
    # so that rounding counts at the GEMM output's magnitude too.
    check(got, want, dtype, magnitude=np.abs(want) + np.abs(dense),
          atol=FP32_NOISE * (np.abs(first) @ np.abs(weight) + np.abs(bias)))


# ---- errors -----------------------------------------------------------------------------------


def test_bad_device_index_raises_instead_of_aborting():
    with pytest.raises(RuntimeError, match="99"):
        _ops.OpRunner("cuda:99")


# ---- input staging ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtypes", [(np.int64, np.int64, np.int64), (np.int32, np.int32, np.int32),
                                    (np.int64, np.bool_, np.uint8), (np.uint8, np.int32, np.int64)],
                         ids=lambda d: "-".join(np.dtype(x).name for x in d))
@pytest.mark.parametrize("n,bad", [(1, (0, 0, 0)), (1, (1, 0, 0)), (777, (0, 0, 0)), (777, (3, 2, 5)),
                                   (300_001, (0, 0, 0)), (300_001, (40, 0, 1))])
def test_stage_inputs_matches_cpu(gpu, cpu, rng, dtypes, n, bad):
    from tests._inputs import FIELDS, random_inputs, staged_reference

    vocab, type_vocab = 30522, 2
    ids, mask, types = random_inputs(rng, n, vocab, type_vocab, dtypes, *bad)
    got = gpu.stage_inputs(ids, mask, types, vocab, type_vocab)
    want = cpu.stage_inputs(ids, mask, types, vocab, type_vocab)
    for g, w in zip(got[:3], want[:3]):
        np.testing.assert_array_equal(g, w)
    _, bad_values = staged_reference(ids, mask, types, vocab, type_vocab)
    # Threads race to record: any bad value may be the one kept, but it must be a bad one.
    assert (got[3] is None) == (not bad_values)
    if got[3] is not None:
        assert tuple(got[3]) in bad_values, (FIELDS[got[3][0]], got[3][1])
