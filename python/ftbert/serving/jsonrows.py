"""Float rows (embeddings) as JSON text, at a fraction of json's cost.

json writes each float as its shortest float64 repr, about 1 µs a number: a 384-float embedding
took 230-390 µs of a front's CPU, more than the rest of a short request. The engine's values are
float32: each is written as the shortest decimal that reads back as the same float32
(`_C.json_float_rows`, C++'s std::to_chars), in one C++ loop over the rows. A client that reads
the numbers as float32 gets the engine's values bit for bit; a float64 reader gets the float32's
shortest decimal."""

from __future__ import annotations

import numpy as np

from .._native import _C


def float_rows(values: np.ndarray) -> list[str]:
    """Each row of `values` ([n, d], any float dtype, taken as float32) as a JSON array's text.
    Non-finite values have no JSON form: ValueError, as json.dumps(allow_nan=False) raises."""
    v = np.asarray(values, dtype=np.float32)
    if v.ndim != 2:
        raise ValueError(f"float_rows takes [n, d] values, got shape {v.shape}")
    return _C.json_float_rows(v)
