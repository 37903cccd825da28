"""Shared helpers for the tests."""

import numpy as np


def ragged_mask(rng, batch, seq, left=False, min_len=1):
    """[B, S] int32 1/0 mask with random lengths; left=True pads on the left."""
    lens = rng.integers(min_len, seq + 1, size=batch)
    lens[0] = seq  # one full row keeps the longest length in play
    mask = np.zeros((batch, seq), dtype=np.int32)
    for b, n in enumerate(lens):
        if left:
            mask[b, seq - n :] = 1
        else:
            mask[b, :n] = 1
    return mask
