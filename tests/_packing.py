"""Helpers for the padding-free ("packed") tests: masks of every padding style, packing in numpy,
and the first-token and right-padding views of a padded batch."""

import numpy as np

# sequence_mask's styles: how the tokens of each row lie among its padding.
SEQUENCE_MASK_STYLES = ("right", "left", "inner", "empty_rows", "full", "mixed")


def sequence_mask(rng, batch, seq, style):
    """[B, S] int32 1/0 mask for packing tests. right / left: one run of tokens at the start / end
    of each row (lengths 0..S, row 0 full); inner: tokens anywhere (holes inside a sequence);
    empty_rows: right padding with every other row all zeros; full: all ones; mixed: each row one of
    right, left, inner, empty or full."""
    mask = np.zeros((batch, seq), dtype=np.int32)
    for b in range(batch):
        row_style = style
        if style == "mixed":
            row_style = ("right", "left", "inner", "empty", "full")[int(rng.integers(0, 5))]
        elif style == "empty_rows":
            row_style = "empty" if b % 2 else "right"
        n = seq if b == 0 and row_style in ("right", "left") else int(rng.integers(0, seq + 1))
        if row_style == "right":
            mask[b, :n] = 1
        elif row_style == "left":
            mask[b, seq - n :] = 1
        elif row_style == "inner":
            mask[b] = rng.random(seq) < 0.55
        elif row_style == "full":
            mask[b] = 1
    return mask


def pack_reference(mask):
    """Packing in numpy: cu_seqlens [B + 1] (prefix sums of the row lengths) and token_index [B*S]
    (the attended flat positions b*S + s in order, then -1)."""
    flat = np.flatnonzero(mask.reshape(-1) != 0)
    cu = np.concatenate([[0], np.cumsum((mask != 0).sum(1))])
    index = np.full(mask.size, -1, dtype=np.int64)
    index[: flat.size] = flat
    return cu, index


def first_positions(mask):
    """Each row's first attended position, -1 for a row with none."""
    return np.array([int(np.flatnonzero(r)[0]) if r.any() else -1 for r in mask], dtype=np.int64)


def compacted(x, mask):
    """x [B, S, ...] with each row's attended positions moved, in order, to its start and zeros after:
    the same sequences padded on the right."""
    out = np.zeros_like(x)
    for b in range(x.shape[0]):
        rows = x[b][mask[b] != 0]
        out[b, : len(rows)] = rows
    return out
