"""serving/jsonrows.py: float rows as JSON text give the float32 values back bit for bit, at any
magnitude (subnormals, the largest finite, signed zeros), for any width; non-finite values and
other shapes are refused as json refuses them."""

import json

import numpy as np
import pytest

from ftbert.serving.jsonrows import float_rows


@pytest.mark.parametrize("width", [1, 7, 384, 1025])
def test_rows_read_back_as_the_same_float32_bits(rng, width):
    v = (rng.standard_normal((5, width)) * 10.0 ** rng.integers(-44, 37, (5, width))).astype(np.float32)
    v[0, 0] = -0.0
    v[1, :1] = np.float32(1e-45)  # the smallest subnormal
    v[2, :1] = np.finfo(np.float32).max
    v[3, :1] = -np.finfo(np.float32).tiny
    v[4, :1] = np.nextafter(np.float32(1), np.float32(2))
    rows = float_rows(v)
    assert len(rows) == 5
    back = np.array([json.loads(r) for r in rows], dtype=np.float64).astype(np.float32)
    assert np.array_equal(back.view(np.uint32), v.view(np.uint32))
    assert json.loads("[" + ",".join(rows) + "]") == [json.loads(r) for r in rows]


def test_float64_values_are_taken_as_float32(rng):
    v = rng.standard_normal((3, 16))
    back = np.array(json.loads("[" + ",".join(float_rows(v)) + "]"), dtype=np.float32)
    assert np.array_equal(back, v.astype(np.float32))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_are_refused(bad):
    v = np.zeros((2, 4), np.float32)
    v[1, 2] = bad
    with pytest.raises(ValueError, match="not JSON compliant"):
        float_rows(v)


def test_other_shapes_are_refused():
    with pytest.raises(ValueError, match=r"\[n, d\]"):
        float_rows(np.zeros(4, np.float32))


def test_each_number_reads_back_and_is_no_longer_than_nine_digits(rng):
    # std::to_chars: the shortest text (digits, or the exact integer where that is fewer characters)
    # that reads back as the same float32.
    v = (rng.standard_normal((4, 257)) * 10.0 ** rng.integers(-40, 38, (4, 257))).astype(np.float32)
    for row, text in zip(v, float_rows(v)):
        numbers = text[1:-1].split(",")
        assert len(numbers) == len(row)
        for x, s in zip(row, numbers):
            assert np.float32(float(s)) == x
            assert len(s) <= len("%.9g" % x), (s, "%.9g" % x)
    assert float_rows(np.array([[0.1, 1.0, -0.0, 0.0, 1e-45, -2.5]], np.float32)) == ["[0.1,1,-0.0,0,1e-45,-2.5]"]
