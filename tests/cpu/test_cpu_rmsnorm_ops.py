"""The CPU ops of pre-RMSNorm encoders (EuroBERT) against float64 torch references, on random
inputs and odd sizes; bfloat16 where the CPU has it (the CPU backend has no float16).

  - residual_add_rmsnorm: the stored residual is round(residual + (x + bias)) exactly (float32
    arithmetic is the same in numpy, and torch rounds to bfloat16 as the op does), x and bias
    each optional; the output the RMSNorm of that stored value, rounded once. Outputs that are
    NaN or overflow are flagged.
  - embed_rmsnorm: embedded = word[id] bit for bit and out = RMSNorm(word[id]), padded and packed
    (holes inside the sequences too); the rows past the tokens of a bucketed packed layout are
    zeros in both, and ids given one per packed row read the same rows.

Tolerances: float32 within float32 noise (1e-5 of the largest output); bfloat16 within one
rounding of the output (2^-8 of its magnitude) plus that noise.
"""

import numpy as np
import pytest

from ftbert import _C, _ops
from tests._util import ragged_mask

torch = pytest.importorskip("torch")

BF16 = not _C.cpu_dtype_unsupported_reason("bfloat16")
DTYPES = ["float32", pytest.param("bfloat16", marks=pytest.mark.skipif(
    not BF16, reason=_C.cpu_dtype_unsupported_reason("bfloat16") or "runs"))]
TORCH_DTYPE = {"float32": torch.float32, "bfloat16": torch.bfloat16}
EPS = 1e-6
FP32_NOISE = 1e-5
ROUNDING = {"float32": 0.0, "bfloat16": 2.0**-8}  # a rounding's error relative to the value


@pytest.fixture(scope="module")
def cpu():
    return _ops.OpRunner("cpu")


def rounded(x, dtype):
    """x as the op holds it after upload in `dtype` (round to nearest even), as float32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    return torch.from_numpy(x).to(TORCH_DTYPE[dtype]).float().numpy()


def randn(rng, shape, dtype, scale=1.0, offset=0.0):
    return rounded(rng.standard_normal(shape) * scale + offset, dtype)


def rmsnorm64(x, gamma, eps=EPS):
    x = torch.from_numpy(np.asarray(x, np.float64))
    gamma = torch.from_numpy(np.asarray(gamma, np.float64))
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gamma).numpy()


def check(got, want, dtype):
    """|got - want| <= rounding(dtype) · |want| + FP32_NOISE · max |want|, elementwise."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    assert np.isfinite(got).all(), "non-finite values"
    if got.size == 0:
        return
    tol = ROUNDING[dtype] * np.abs(want) + FP32_NOISE * max(1.0, np.abs(want).max())
    err = np.abs(got - want)
    worst = np.unravel_index(np.argmax(err - tol), err.shape)
    assert (err <= tol).all(), f"{dtype}: error {err[worst]:.3e} > {tol[worst]:.3e} at {worst}"


# ---- residual add + RMSNorm ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,hidden", [(1, 37), (5, 768), (130, 37), (130, 768), (3, 5000)])
@pytest.mark.parametrize("with_x,with_bias", [(True, True), (True, False), (False, True),
                                              (False, False)], ids=["x+bias", "x", "bias", "none"])
def test_residual_add_rmsnorm_keeps_the_sum_and_norms_it(cpu, rng, dtype, rows, hidden, with_x,
                                                         with_bias):
    residual = randn(rng, (rows, hidden), dtype, 3.0, offset=0.5)
    x = randn(rng, (rows, hidden), dtype, 3.0) if with_x else None
    bias = randn(rng, hidden, dtype) if with_bias else None
    gamma = randn(rng, hidden, dtype, 0.3, offset=1.0)
    added = np.zeros_like(residual) if x is None else x
    if bias is not None:
        added = added + bias
    # The op's float32 sum residual + (x + bias), rounded to the dtype once: the same bits.
    want_sum = rounded(residual + added, dtype) if (with_x or with_bias) else residual
    got_sum, got = cpu.residual_add_rmsnorm(dtype, residual, x, bias, gamma, EPS)
    np.testing.assert_array_equal(got_sum, want_sum)
    check(got, rmsnorm64(want_sum, gamma), dtype)


@pytest.mark.parametrize("eps", [1e-5, 1e-2])
def test_residual_add_rmsnorm_adds_eps_to_the_mean_square(cpu, rng, eps):
    residual = randn(rng, (4, 48), "float32", 0.05)  # mean square ~ eps: eps matters
    gamma = randn(rng, 48, "float32", 0.3, offset=1.0)
    _, got = cpu.residual_add_rmsnorm("float32", residual, None, None, gamma, eps)
    check(got, rmsnorm64(residual, gamma, eps), "float32")


def test_residual_add_rmsnorm_reports_nonfinite_outputs(cpu, rng):
    residual = randn(rng, (4, 37), "float32")
    x = np.zeros_like(residual)
    ones = np.ones(37, np.float32)
    _, (_, flagged) = cpu.residual_add_rmsnorm("float32", residual, x, None, ones, EPS,
                                               report_nonfinite=True)
    assert not flagged
    x[2, 3] = np.inf
    _, (out, flagged) = cpu.residual_add_rmsnorm("float32", residual, x, None, ones, EPS,
                                                 report_nonfinite=True)
    assert flagged and np.isfinite(out[[0, 1, 3]]).all()


@pytest.mark.parametrize("gain,overflows", [(1e37, False), (1e38, True)])
def test_residual_add_rmsnorm_flags_outputs_that_overflow(cpu, gain, overflows):
    # One spike per row: element 0 normalizes to sqrt(hidden) = 6, the rest to 0.
    residual = np.zeros((3, 36), np.float32)
    residual[:, 0] = 1.0
    gamma = np.full(36, gain, np.float32)
    after, (out, flagged) = cpu.residual_add_rmsnorm("float32", residual, None, None, gamma, 0.0,
                                                     report_nonfinite=True)
    np.testing.assert_array_equal(after, residual)
    assert flagged == overflows
    assert np.isinf(out[:, 0]).all() == overflows
    assert (out[:, 1:] == 0).all()


# ---- embeddings + RMSNorm --------------------------------------------------------------------


def embed_inputs(rng, dtype, batch, seq, hidden, vocab=61):
    ids = rng.integers(0, vocab, (batch, seq)).astype(np.int32)
    word = randn(rng, (vocab, hidden), dtype, 0.5, offset=0.1)
    gamma = randn(rng, hidden, dtype, 0.3, offset=1.0)
    return ids, word, gamma


def holes_mask(rng, batch, seq):
    mask = (rng.random((batch, seq)) > 0.3).astype(np.int32)
    mask[:, 0] = 1
    return mask


# rows = batch · seq: 1, 5, 130.
EMBED_SHAPES = [(1, 1, 37), (1, 5, 768), (2, 65, 37), (2, 65, 768), (1, 3, 5000)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch,seq,hidden", EMBED_SHAPES)
@pytest.mark.parametrize("layout", ["padded", "ragged", "holes"])
def test_embed_rmsnorm_is_the_word_row_and_its_norm(cpu, rng, dtype, batch, seq, hidden, layout):
    ids, word, gamma = embed_inputs(rng, dtype, batch, seq, hidden)
    want_embedded = word[ids]
    want = rmsnorm64(want_embedded, gamma)
    mask = None
    if layout == "ragged":
        mask = ragged_mask(rng, batch, seq)
    elif layout == "holes":
        mask = holes_mask(rng, batch, seq)
    embedded, got = cpu.embed_rmsnorm(dtype, ids, word, gamma, EPS, mask=mask)
    if mask is not None:  # one row per attended token, in order
        want_embedded, want = want_embedded[mask == 1], want[mask == 1]
    np.testing.assert_array_equal(embedded, want_embedded)
    check(got, want, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch,seq,hidden", [(2, 9, 37), (3, 50, 768)])
def test_embed_rmsnorm_packed_rows_are_the_padded_rows(cpu, rng, dtype, batch, seq, hidden):
    ids, word, gamma = embed_inputs(rng, dtype, batch, seq, hidden)
    mask = holes_mask(rng, batch, seq)
    padded_embedded, padded = cpu.embed_rmsnorm(dtype, ids, word, gamma, EPS)
    embedded, got = cpu.embed_rmsnorm(dtype, ids, word, gamma, EPS, mask=mask)
    np.testing.assert_array_equal(embedded, padded_embedded[mask == 1])
    np.testing.assert_array_equal(got, padded[mask == 1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ids_packed", [False, True])
def test_embed_rmsnorm_zeroes_the_rows_past_the_tokens(cpu, rng, dtype, ids_packed):
    batch, seq, hidden = 3, 20, 37
    ids, word, gamma = embed_inputs(rng, dtype, batch, seq, hidden)
    mask = ragged_mask(rng, batch, seq)
    tokens = int(mask.sum())
    embedded, got = cpu.embed_rmsnorm(dtype, ids, word, gamma, EPS, mask=mask)
    # a bucketed recording's row counts (a mask drawn without padding has only B*S)
    for rows in sorted({tokens, min(tokens + 1, batch * seq), batch * seq}):
        bucket_embedded, bucket = cpu.embed_rmsnorm(dtype, ids, word, gamma, EPS, mask=mask,
                                                    rows=rows, ids_packed=ids_packed)
        assert bucket.shape == bucket_embedded.shape == (rows, hidden)
        np.testing.assert_array_equal(bucket_embedded[:tokens], embedded)
        np.testing.assert_array_equal(bucket[:tokens], got)
        assert (bucket_embedded[tokens:] == 0).all() and (bucket[tokens:] == 0).all()


def test_embed_rmsnorm_clamps_out_of_range_ids(cpu, rng):
    ids, word, gamma = embed_inputs(rng, "float32", 1, 4, 37, vocab=10)
    ids[0, 1], ids[0, 2] = -3, 10 + 5
    embedded, got = cpu.embed_rmsnorm("float32", ids, word, gamma, EPS)
    np.testing.assert_array_equal(embedded[0, 1], word[0])
    np.testing.assert_array_equal(embedded[0, 2], word[9])
    check(got, rmsnorm64(word[np.clip(ids, 0, 9)], gamma), "float32")
