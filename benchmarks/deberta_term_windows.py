"""A host-side model of the flash kernel's inline DeBERTa terms (attention/flash.cu, kInlineTerms):
which relative row and which product column every score reads, checked against the direct
formula. Runs on any machine, in seconds:

    python benchmarks/deberta_term_windows.py

It replays the kernel's index arithmetic for blocks of 64 query rows and key tiles of 64 keys: the
ring of 128 relative rows that each tile extends downward, the row of each distance relative to
the window's first (sCol), each warp's first row (its c2p window of 80 columns), and the test that
sends a tile whose positions jump to the per-score path. For full-length and short sequences, left
padding (key tiles skipped), DeBERTa-v3's 256 log buckets over 512 positions, no buckets, and a
clamped span; then packed positions with random gaps. Every score on the windowed path must find
its distance's row in the ring at its column, and that column inside its warp's c2p window.
"""

import math
import random

import numpy as np

BR = BC = 64  # query rows a block, keys a tile
ROWS = BR + BC  # the ring's rows, and sCol's entries
WARP_COLS = 80  # a warp's c2p columns: 16 + 64 - 1 distances, rounded up to 16


def log_bucket(distance, buckets, max_position):
    """transformers' make_log_bucket_position for one distance, in float32."""
    mid = buckets // 2
    a = abs(distance)
    if a <= mid:
        return distance
    reach = np.float32((max_position - 1) / mid)
    scaled = np.float32(np.log(np.float32(a) / np.float32(mid))) / np.float32(np.log(reach)) * np.float32(mid - 1)
    bucket = math.ceil(scaled) + mid
    return -bucket if distance < 0 else bucket


def column_table(span, buckets, max_position, positions):
    """distance -> relative row, as cpp/core/models/deberta.cpp's disentangled_column."""
    out = {}
    for d in range(-(positions - 1), positions):
        b = log_bucket(d, buckets, max_position) if buckets > 0 else d
        out[d] = min(max(b + span, 0), 2 * span - 1)
    return out


def replay(pos, column, max_distance, first_tile=0):
    """Every block and key tile of one sequence whose rows have positions `pos`; returns the tiles
    on the windowed path and on the per-score path."""
    n = len(pos)
    windowed = alone = 0
    for q0 in range(0, n, BR):
        q = lambda r: pos[min(r, n - 1)]  # rows past the sequence take its last position
        q_span = q(q0 + BR - 1) - q(q0)
        warp_span = max(q(q0 + 16 * w + 15) - q(q0 + 16 * w) for w in range(BR // 16))
        ring, ring_low = [None] * ROWS, 1 << 30
        for t in range(first_tile, (n + BC - 1) // BC):
            keys = [pos[min(t * BC + i, n - 1)] for i in range(BC)]
            d_min = q(q0) - keys[-1]
            low = column[d_min]
            assert low <= ring_low, "a window moved up"
            for row in range(low, min(ring_low, low + ROWS)):
                ring[row % ROWS] = row
            ring_low = low
            col = [column[min(d_min + i, max_distance - 1)] - low for i in range(ROWS)]
            k_span = keys[-1] - keys[0]
            if q_span + k_span >= ROWS or warp_span + k_span >= WARP_COLS:
                alone += 1
                continue
            windowed += 1
            for w in range(BR // 16):
                warp_low = col[q(q0 + 16 * w) - q(q0)]
                for g in range(16):
                    qp = q(q0 + 16 * w + g)
                    for kp in keys:
                        c = col[qp - kp - d_min]
                        assert ring[(low + c) % ROWS] == column[qp - kp], "p2c reads another row"
                        assert 0 <= c - warp_low < WARP_COLS, "c2p outside the warp's window"
    return windowed, alone


def main():
    configs = {"v3 (256 buckets, 512 positions)": (256, 256, 512, 512), "no buckets": (256, 0, 512, 512),
               "64 buckets, span 128": (128, 64, 512, 512), "span 32 (clamped)": (32, 0, 512, 512)}
    for name, (span, buckets, max_position, positions) in configs.items():
        column = column_table(span, buckets, max_position, positions)
        for n in (1, 5, 63, 64, 65, 127, 129, 200, 512):
            for first in {0, 1 if n > 128 else 0}:
                replay(list(range(n)), column, positions, first)
        print(f"{name}: consecutive positions, every score found its row")
    rng = random.Random(3)
    windowed = alone = 0
    for span, buckets, max_position, positions in configs.values():
        column = column_table(span, buckets, max_position, positions)
        for _ in range(40):
            pos = [rng.randint(0, 20)]
            for _ in range(rng.randint(0, 400)):
                pos.append(pos[-1] + (1 if rng.random() > 0.02 else rng.randint(2, 30)))
            if pos[-1] < positions:
                a, b = replay(pos, column, positions)
                windowed, alone = windowed + a, alone + b
    print(f"positions with gaps: {windowed} tiles windowed (every score found its row), {alone} per score")


if __name__ == "__main__":
    main()
