"""The CUDA ops of pre-RMSNorm encoders (EuroBERT), against float64 torch references and the CPU
backend in float32; skipped without a GPU.

  - residual_add_rmsnorm: the stored residual is round(residual + (x + bias)) exactly (float32
    arithmetic is the same in numpy), x and bias each optional; the output the RMSNorm of that
    stored value. Shapes through the warp-per-row kernel (rows up to 4 vectors a lane) and the
    block-per-row one (longer rows; 13000 float32 values: more than 48 KiB of shared memory, the
    opt-in). NaN outputs and outputs that overflow the dtype flagged.
  - embed_rmsnorm: embedded = word[id] bit for bit and out = RMSNorm(word[id]), padded and packed
    (ragged and with holes; packed rows the padded rows' bits); the rows past the tokens of a
    bucketed packed layout zeros in both; ids given one per packed row read the same rows;
    out-of-range ids clamped.

Tolerances as tests/cuda/test_cuda_ops.py: two units in the last place of the output dtype at
the output's magnitude, plus float32 noise.
"""

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
    BF16_GAIN, DTYPES, FP32_NOISE, check, randn, rounded)

EPS = 1e-6


def rmsnorm64(x, gamma, eps=EPS):
    x = torch.from_numpy(np.asarray(x, np.float64))
    gamma = torch.from_numpy(np.asarray(gamma, np.float64))
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gamma).numpy()


def check_output(got, want, dtype):
    check(got, want, dtype, atol=FP32_NOISE * max(1.0, np.abs(want).max()))


# ---- residual add + RMSNorm ----------------------------------------------------------------------


# A warp per row while a row fits 4 vectors a lane (1024 16-bit values, 512 float32; hidden 37:
# vectors of one value), at every row count; longer rows a block each.
RESIDUAL_SHAPES = [(1, 37), (5, 37), (130, 37), (1, 768), (5, 768), (130, 768), (300, 1024),
                   (5, 1030), (4, 3000), (2, 13000)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,hidden", RESIDUAL_SHAPES)
@pytest.mark.parametrize("with_x,with_bias", [(True, True), (True, False), (False, True),
                                              (False, False)], ids=["x+bias", "x", "bias", "none"])
def test_residual_add_rmsnorm_matches_float64(gpu, rng, dtype, rows, hidden, with_x, with_bias):
    residual = randn(rng, (rows, hidden), dtype, 3.0, offset=0.5)
    x = randn(rng, (rows, hidden), dtype, 3.0) if with_x else None
    bias = randn(rng, hidden, dtype) if with_bias else None
    gamma = randn(rng, hidden, dtype, 0.3, offset=1.0)
    added = np.zeros_like(residual) if x is None else x
    if bias is not None:
        added = added + bias
    # The kernel's float32 sum residual + (x + bias), rounded to the dtype once: the same bits.
    want_sum = rounded(residual + added, dtype)
    got_sum, got = gpu.residual_add_rmsnorm(dtype, residual, x, bias, gamma, EPS)
    np.testing.assert_array_equal(got_sum, want_sum)
    check_output(got, rmsnorm64(want_sum, gamma), dtype)


@pytest.mark.parametrize("rows,hidden", [(5, 37), (130, 768), (4, 3000)])
@pytest.mark.parametrize("with_x,with_bias", [(True, True), (False, False)], ids=["x+bias", "none"])
def test_residual_add_rmsnorm_matches_cpu(gpu, cpu, rng, rows, hidden, with_x, with_bias):
    residual = randn(rng, (rows, hidden), "float32", 3.0, offset=0.5)
    x = randn(rng, (rows, hidden), "float32", 3.0) if with_x else None
    bias = randn(rng, hidden, "float32") if with_bias else None
    gamma = randn(rng, hidden, "float32", 0.3, offset=1.0)
    got_sum, got = gpu.residual_add_rmsnorm("float32", residual, x, bias, gamma, EPS)
    want_sum, want = cpu.residual_add_rmsnorm("float32", residual, x, bias, gamma, EPS)
    np.testing.assert_array_equal(got_sum, want_sum)
    check_output(got, want, "float32")


# One spike a row: element 0 normalizes to sqrt(776) · gain, the rest to 0; gains either side of
# where rounding to the dtype overflows (float16 at 65,520; bfloat16 at (2 - 2^-8) · 2^127, finite
# in float32; float32 past its own range). Hidden 776: the warp kernel in 16-bit dtypes, the block
# kernel in float32 (194 vectors of 4).
@pytest.mark.parametrize("rows", [1, 300])
@pytest.mark.parametrize("dtype,gain,overflows", [("float16", 2346.0, False),
                                                  ("float16", 2354.0, True),
                                                  ("bfloat16", 146 * BF16_GAIN, False),
                                                  ("bfloat16", 147 * BF16_GAIN, True),
                                                  ("float32", 1.2e37, False),
                                                  ("float32", 1.23e37, True)])
def test_residual_add_rmsnorm_flags_outputs_that_overflow(gpu, dtype, rows, gain, overflows):
    hidden = 776
    spike = np.zeros((rows, hidden), np.float32)
    spike[:, 0] = 1.0
    gamma = rounded(np.full(hidden, gain, np.float32), dtype)
    residual_after, (out, flagged) = gpu.residual_add_rmsnorm(dtype, spike, None, None, gamma, 0.0,
                                                              report_nonfinite=True)
    np.testing.assert_array_equal(residual_after, spike)
    assert flagged == overflows
    assert np.isinf(out[:, 0]).all() == overflows
    assert (out[:, 1:] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,hidden", [(5, 96), (3, 3000)])
@pytest.mark.parametrize("where", ["x", "bias", "gamma"])
def test_residual_add_rmsnorm_flags_nan(gpu, rng, dtype, rows, hidden, where):
    residual = randn(rng, (rows, hidden), dtype)
    x = randn(rng, (rows, hidden), dtype)
    bias = randn(rng, hidden, dtype)
    gamma = randn(rng, hidden, dtype, 0.3, 1.0)
    _, (_, flagged) = gpu.residual_add_rmsnorm(dtype, residual, x, bias, gamma, EPS,
                                               report_nonfinite=True)
    assert not flagged
    if where == "x":
        x[rows - 1, 7] = np.nan
    elif where == "bias":
        bias[11] = np.nan
    else:
        gamma[50] = np.nan
    residual_after, (out, flagged) = gpu.residual_add_rmsnorm(dtype, residual, x, bias, gamma, EPS,
                                                              report_nonfinite=True)
    assert flagged
    assert np.isnan(out).any()
    if where == "gamma":  # the residual sum is untouched by gamma
        assert np.isfinite(residual_after).all()


# ---- embeddings + RMSNorm ------------------------------------------------------------------------


def embed_inputs(rng, dtype, batch, seq, hidden, vocab=1000):
    ids = rng.integers(0, vocab, (batch, seq)).astype(np.int32)
    word = randn(rng, (vocab, hidden), dtype, 0.5, offset=0.1)
    gamma = randn(rng, hidden, dtype, 0.3, offset=1.0)
    return ids, word, gamma


def holes_mask(rng, batch, seq):
    mask = (rng.random((batch, seq)) > 0.3).astype(np.int32)
    mask[:, 0] = 1
    return mask


def layout_mask(rng, layout, batch, seq):
    if layout == "ragged":
        return ragged_mask(rng, batch, seq)
    if layout == "holes":
        return holes_mask(rng, batch, seq)
    return None


# rows = batch · seq: 1, 5, 130 through the warp kernel; 1030 (16-bit: 515 vectors of 2) and
# 13000 through the block kernel.
EMBED_SHAPES = [(1, 1, 37), (1, 5, 768), (2, 65, 37), (2, 65, 768), (1, 5, 1030), (1, 3, 13000)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch,seq,hidden", EMBED_SHAPES)
@pytest.mark.parametrize("layout", ["padded", "ragged", "holes"])
def test_embed_rmsnorm_matches_float64(gpu, cpu, rng, dtype, batch, seq, hidden, layout):
    ids, word, gamma = embed_inputs(rng, dtype, batch, seq, hidden)
    want_embedded = word[ids]
    want = rmsnorm64(want_embedded, gamma)
    mask = layout_mask(rng, layout, batch, seq)
    embedded, got = gpu.embed_rmsnorm(dtype, ids, word, gamma, EPS, mask=mask)
    if mask is not None:  # one row per attended token, in order
        want_embedded, want = want_embedded[mask == 1], want[mask == 1]
    np.testing.assert_array_equal(embedded, want_embedded)
    check_output(got, want, dtype)
    if dtype == "float32":
        on_cpu = cpu.embed_rmsnorm("float32", ids, word, gamma, EPS, mask=mask)
        np.testing.assert_array_equal(embedded, on_cpu[0])
        check_output(got, on_cpu[1], "float32")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch,seq,hidden", [(2, 9, 37), (3, 50, 768), (2, 7, 1030)])
def test_embed_rmsnorm_packed_rows_are_the_padded_rows(gpu, rng, dtype, batch, seq, hidden):
    ids, word, gamma = embed_inputs(rng, dtype, batch, seq, hidden)
    mask = holes_mask(rng, batch, seq)
    padded_embedded, padded = gpu.embed_rmsnorm(dtype, ids, word, gamma, EPS)
    embedded, got = gpu.embed_rmsnorm(dtype, ids, word, gamma, EPS, mask=mask)
    np.testing.assert_array_equal(embedded, padded_embedded[mask == 1])
    np.testing.assert_array_equal(got, padded[mask == 1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [37, 1030])
@pytest.mark.parametrize("ids_packed", [False, True])
def test_embed_rmsnorm_zeroes_the_rows_past_the_tokens(gpu, rng, dtype, hidden, ids_packed):
    batch, seq = 3, 20
    ids, word, gamma = embed_inputs(rng, dtype, batch, seq, hidden)
    mask = ragged_mask(rng, batch, seq)
    tokens = int(mask.sum())
    embedded, got = gpu.embed_rmsnorm(dtype, ids, word, gamma, EPS, mask=mask)
    # a bucketed recording's row counts (a mask drawn without padding has only B*S)
    for rows in sorted({tokens, min(tokens + 1, batch * seq), batch * seq}):
        bucket_embedded, bucket = gpu.embed_rmsnorm(dtype, ids, word, gamma, EPS, mask=mask,
                                                    rows=rows, ids_packed=ids_packed)
        assert bucket.shape == bucket_embedded.shape == (rows, hidden)
        np.testing.assert_array_equal(bucket_embedded[:tokens], embedded)
        np.testing.assert_array_equal(bucket[:tokens], got)
        assert (bucket_embedded[tokens:] == 0).all() and (bucket[tokens:] == 0).all()


def test_embed_rmsnorm_clamps_out_of_range_ids(gpu, cpu, rng):
    # The kernel clamps ids into range, so bad device input reads valid rows.
    vocab = 50
    ids, word, gamma = embed_inputs(rng, "float32", 2, 6, 96, vocab=vocab)
    ids[0, 1], ids[1, 4] = -3, vocab + 7
    embedded, got = gpu.embed_rmsnorm("float32", ids, word, gamma, EPS)
    clamped = np.clip(ids, 0, vocab - 1).astype(np.int32)
    np.testing.assert_array_equal(embedded, word[clamped])
    _, want = cpu.embed_rmsnorm("float32", clamped, word, gamma, EPS)
    check_output(got, want, "float32")
