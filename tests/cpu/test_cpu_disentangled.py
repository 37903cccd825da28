"""DeBERTa's disentangled attention at the op level on the CPU: the relative-embedding row of every
distance (disentangled_column) against transformers' make_log_bucket_position and clamp, and the
unfused path's op, disentangled_scores, against a float64 numpy reference in float32 and bfloat16
(random inputs, odd sizes, c2p and p2c alone and together, tables wider than the distances reach)."""

import numpy as np
import pytest

from ftbert import _C, _ops
from tests.cpu.test_cpu_bfloat16 import assert_rounded_once, bf16


@pytest.fixture(scope="module")
def cpu():
    return _ops.OpRunner("cpu")


def hf_columns(buckets, max_relative, positions):
    """{δ: transformers' row of the relative embeddings for distance δ = i − j}, |δ| < positions:
    build_relative_position's bucket (as its own forward computes it, over a [P, P] grid) plus the
    span, clamped as DisentangledSelfAttention clamps c2p_pos."""
    import torch
    from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position

    x = torch.zeros(1, positions, 1)
    rel = build_relative_position(x, x, bucket_size=buckets, max_position=max_relative)[0]
    span = buckets if buckets > 0 else max_relative
    rows = torch.clamp(rel + span, 0, 2 * span - 1)
    out = {i: int(v) for i, v in enumerate(rows[:, 0])}  # δ = i − 0 >= 0
    out.update({-j: int(v) for j, v in enumerate(rows[0, :])})  # δ = 0 − j <= 0
    return out


# v3's own (256 buckets over 512), the tests' small models (8 over 16 and over 64), no buckets
# (the span max_relative itself, clamped past it), buckets / 2 + 2 (the least reach the engine
# takes), odd bucket counts and reaches.
@pytest.mark.parametrize("buckets,max_relative,positions", [
    (256, 512, 1024), (8, 16, 64), (8, 64, 64), (-1, 16, 64), (0, 5, 40), (4, 4, 50), (7, 23, 97),
    (32, 128, 512), (6, 1000, 1024), (2, 3, 33),
])
def test_columns_are_transformers_at_every_distance(buckets, max_relative, positions):
    want = hf_columns(buckets, max_relative, positions)
    got = {d: _ops.disentangled_column(buckets, max_relative, d) for d in want}
    wrong = {d: (got[d], want[d]) for d in want if got[d] != want[d]}
    assert not wrong, f"distance: (ftbert, transformers) {dict(list(wrong.items())[:10])}"


def test_columns_reach_the_log_buckets_and_the_clamped_ends():
    # The distances the model tests use (8 buckets over 16, sequences up to 64) land in all three
    # regions: exact, logarithmic and the clamped last row; a bucket table that forgot one would
    # still be tested by them.
    cols = [_ops.disentangled_column(8, 16, d) for d in range(-63, 64)]
    assert min(cols) == 0 and max(cols) == 15
    assert len(set(cols)) == 16
    assert cols == sorted(cols)  # non-decreasing in δ, as DisentangledAttention says


def columns(buckets, max_relative, positions):
    """[2P − 1] int32: the engine's column of every distance −(P − 1) .. P − 1."""
    return np.array([_ops.disentangled_column(buckets, max_relative, d)
                     for d in range(-(positions - 1), positions)], np.int32)


def reference(scores, column, c2p, p2c):
    """scores[b, h, i, j] + c2p[b·heads + h][i][col(i − j)] + p2c[b·heads + h][j][col(i − j)] in float64,
    col(δ) = column[δ] − column[−(S − 1)]."""
    B, h, S, _ = scores.shape
    P = (len(column) + 1) // 2
    i, j = np.arange(S)[:, None], np.arange(S)[None, :]
    col = column[i - j + P - 1] - column[P - 1 - (S - 1)]  # [S, S]
    out = scores.astype(np.float64).copy()
    if c2p is not None:
        t = c2p.astype(np.float64).reshape(B, h, S, -1)
        out += t[:, :, i, col]
    if p2c is not None:
        t = p2c.astype(np.float64).reshape(B, h, S, -1)
        out += t[:, :, j, col]
    return out


def random_case(rng, batch, heads, seq, column, terms, extra_width=0, round_to=None):
    """(scores, c2p or None, p2c or None): O(1) scores and terms; tables [B·h, S, width] with the
    columns the distances reach (and `extra_width` unread ones after them)."""
    P = (len(column) + 1) // 2
    width = int(column[P - 1 + seq - 1] - column[P - 1 - (seq - 1)]) + 1 + extra_width
    r = round_to or (lambda x: x)
    scores = r(rng.standard_normal((batch, heads, seq, seq)).astype(np.float32) * 3)
    c2p = r(rng.standard_normal((batch * heads, seq, width)).astype(np.float32)) if "c2p" in terms else None
    p2c = r(rng.standard_normal((batch * heads, seq, width)).astype(np.float32)) if "p2c" in terms else None
    return scores, c2p, p2c


TERMS = ["c2p", "p2c", "c2p|p2c"]
# (batch, heads, seq, buckets, max_relative, P): one position, odd sizes, sequences inside the
# exact buckets, past the log buckets and past the clamped end, P > S (a table longer than the
# batch's sequences: the columns start at column[−(S − 1)], not column[−(P − 1)]).
SHAPES = [(1, 1, 1, 8, 16, 1), (2, 3, 5, 8, 16, 64), (3, 2, 41, 8, 16, 64), (1, 4, 61, 8, 16, 64),
          (2, 3, 37, -1, 12, 40), (2, 1, 130, 32, 128, 512), (1, 2, 9, 4, 5, 9)]


@pytest.mark.parametrize("terms", TERMS)
@pytest.mark.parametrize("batch,heads,seq,buckets,max_relative,positions", SHAPES)
def test_scores_get_the_terms_of_each_distance_float32(cpu, rng, terms, batch, heads, seq, buckets,
                                                       max_relative, positions):
    column = columns(buckets, max_relative, positions)
    scores, c2p, p2c = random_case(rng, batch, heads, seq, column, terms)
    got = cpu.disentangled_scores("float32", scores, column, c2p=c2p, p2c=p2c)
    want = reference(scores, column, c2p, p2c)
    assert np.isfinite(got).all()
    err = np.abs(got - want).max()
    assert err <= 2e-6, f"max abs error {err:.2e}"


def test_unread_table_columns_change_nothing(cpu, rng):
    # Tables wider than the distances reach (as at the start of a width the engine rounds up):
    # the columns past the last reached one are never read.
    column = columns(8, 16, 64)
    scores, c2p, p2c = random_case(rng, 2, 3, 23, column, "c2p|p2c", extra_width=5)
    got = cpu.disentangled_scores("float32", scores, column, c2p=c2p, p2c=p2c)
    c2p[:, :, -5:] = np.nan
    p2c[:, :, -5:] = np.nan
    np.testing.assert_array_equal(cpu.disentangled_scores("float32", scores, column, c2p=c2p, p2c=p2c),
                                  got)
    assert np.abs(got - reference(scores, column, c2p[:, :, :-5], p2c[:, :, :-5])).max() <= 2e-6


@pytest.mark.skipif(bool(_C.cpu_dtype_unsupported_reason("bfloat16")),
                    reason=_C.cpu_dtype_unsupported_reason("bfloat16") or "runs")
@pytest.mark.parametrize("terms", TERMS)
@pytest.mark.parametrize("batch,heads,seq,buckets,max_relative,positions", SHAPES)
def test_scores_get_the_terms_of_each_distance_bfloat16(cpu, rng, terms, batch, heads, seq, buckets,
                                                        max_relative, positions):
    # The op adds in float32 and rounds once: within half a bfloat16 ulp of the float64 sum of the
    # same bfloat16 inputs, plus float32's rounding of the sum.
    column = columns(buckets, max_relative, positions)
    scores, c2p, p2c = random_case(rng, batch, heads, seq, column, terms, round_to=bf16)
    got = cpu.disentangled_scores("bfloat16", scores, column, c2p=c2p, p2c=p2c)
    want = reference(scores, column, c2p, p2c)
    magnitude = reference(np.abs(scores), column, None if c2p is None else np.abs(c2p),
                          None if p2c is None else np.abs(p2c))
    assert_rounded_once(got, want, 1e-6 * magnitude)


def test_a_column_outside_the_tables_is_refused(cpu, rng):
    # The op reads no bounds; the binding refuses a table too narrow for the distances.
    column = columns(8, 16, 64)
    scores, c2p, _ = random_case(rng, 1, 2, 30, column, "c2p")
    with pytest.raises(ValueError, match="outside the tables' columns"):
        cpu.disentangled_scores("float32", scores, column, c2p=c2p[:, :, :-1])
