"""Random forward inputs for the staging op (Backend::stage_inputs) and its numpy reference."""

import numpy as np

DTYPES = (np.int32, np.int64, np.uint8, np.bool_)
FIELDS = {1: "input_ids", 2: "token_type_ids", 3: "attention_mask"}


def random_inputs(rng, n, vocab, type_vocab, dtypes, bad_ids=0, bad_types=0, bad_mask=0):
    """ids, mask, types of length n in the given dtypes, with the given numbers of bad values
    (out of range for their dtype's reach: negative or >= the limit; a mask value not 0 or 1)."""
    ids = rng.integers(0, vocab, n)
    mask = rng.integers(0, 2, n)
    types = rng.integers(0, type_vocab, n)
    for a, count, bad in ((ids, bad_ids, [vocab, vocab + 7, -1, -(2**40), 2**40]),
                          (types, bad_types, [type_vocab, -3, 2**33]),
                          (mask, bad_mask, [2, -1, 255, 2**35])):
        for i in rng.choice(n, size=min(count, n), replace=False):
            a[i] = rng.choice(bad)
    return tuple(as_dtype(a, dt) for a, dt in zip((ids, mask, types), dtypes))


def as_dtype(a, dt):
    """a in dtype dt, its values wrapped as a cast would (uint8, bool: what such a tensor holds)."""
    if dt == np.bool_:
        return a != 0
    if dt == np.uint8:
        return (a % 256).astype(np.uint8)
    if dt == np.int32:
        return ((a + 2**31) % 2**32 - 2**31).astype(np.int32)
    return a.astype(np.int64)


def staged_reference(ids, mask, types, vocab, type_vocab):
    """The int32 staging and the set of (field, value) pairs that are bad."""
    i, m, t = (np.asarray(a).astype(np.int64) for a in (ids, mask, types))
    ok_i, ok_m, ok_t = (i >= 0) & (i < vocab), (m == 0) | (m == 1), (t >= 0) & (t < type_vocab)
    bad = {(1, int(v)) for v in i[~ok_i]} | {(2, int(v)) for v in t[~ok_t]} | {(3, int(v)) for v in m[~ok_m]}
    out = tuple(np.where(ok, a, 0).astype(np.int32) for a, ok in ((i, ok_i), (m, ok_m), (t, ok_t)))
    return out, bad
