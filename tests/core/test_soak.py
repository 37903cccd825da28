"""A short soak on the CPU backend: some hundreds of forwards of random shapes from several threads
on a tiny model must not grow the process's memory once warmed up, must keep the workspace within
what the largest shape needs, and must leave a fixed probe input's result as it was.
benchmarks/soak.py is the long GPU version."""

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

import ftbert
from tests._models import make_bert
from tests._util import ragged_mask

VOCAB = 211
MAX_BATCH, MAX_SEQ = 8, 128
THREADS = 4
CONCURRENCY = 2  # two sessions, each with a workspace of its own
WARMUP, FORWARDS = 80, 800

# Host memory may grow by this much between the end of the warm-up and the end of the soak.
# Warmed up, every buffer the engine keeps (weights, one workspace per session, the thread pools)
# exists already, and the soak's inputs (made 40 calls at a time) and outputs are freed as it goes;
# what is left is the allocator's fragmentation over a few MB of short-lived arrays (measured:
# 0.1 to 1 MiB). Leaking one forward's outputs per forward would add ~29 MiB here (800 forwards
# x 4.5 x 64.5 tokens on average x hidden 32 x 4 bytes), leaking a workspace-sized buffer per
# forward about 2 GiB. (The model is narrow for that reason: a leak per forward stands out more,
# for each second of compute, the smaller the hidden size.)
RSS_GROWTH_LIMIT = 8 * 2**20


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def random_call(rng):
    b, s = int(rng.integers(1, MAX_BATCH + 1)), int(rng.integers(1, MAX_SEQ + 1))
    ids = rng.integers(0, VOCAB, (b, s))
    mask = ragged_mask(rng, b, s, left=bool(rng.integers(2)))
    types = rng.integers(0, 2, (b, s))
    if rng.integers(2):
        return torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(types)
    return ids, mask, types


def run(enc, call):
    out = enc(*call)
    h = out.last_hidden_state
    # Touch the outputs as a caller would; nothing of them is kept.
    return float(h[0, 0, 0]) + float(out.pooler_output[0, 0])


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the RSS from /proc")
def test_soak_memory_workspace_and_results_stay_put(tmp_path, rng):
    make_bert(tmp_path, hidden=32, heads=2, layers=2, vocab=VOCAB, seed=3)
    # What one workspace holds after the largest shape (every dimension at its maximum).
    sizer = ftbert.Encoder.from_pretrained(tmp_path, concurrency=1)
    sizer(np.zeros((MAX_BATCH, MAX_SEQ), np.int64))
    one_workspace = sizer.workspace_bytes
    del sizer

    enc = ftbert.Encoder.from_pretrained(tmp_path, concurrency=CONCURRENCY)
    probe = (rng.integers(0, VOCAB, (3, 77)), ragged_mask(rng, 3, 77, left=True), rng.integers(0, 2, (3, 77)))
    before = enc(*probe)

    with ThreadPoolExecutor(THREADS) as ex:
        largest = [(rng.integers(0, VOCAB, (MAX_BATCH, MAX_SEQ)),) for _ in range(THREADS)]
        for f in [ex.submit(run, enc, c) for c in largest] + [
            ex.submit(run, enc, random_call(rng)) for _ in range(WARMUP)
        ]:
            f.result(timeout=120)
        warm_rss = rss_bytes()
        peak_rss = warm_rss
        for _ in range(FORWARDS // 40):
            # 40 at a time, so that inputs made ahead do not pile up in memory.
            for f in [ex.submit(run, enc, random_call(rng)) for _ in range(40)]:
                assert np.isfinite(f.result(timeout=120))
            peak_rss = max(peak_rss, rss_bytes())
        end_rss = rss_bytes()  # with the same threads alive as at the warm RSS

    after = enc(*probe)
    np.testing.assert_array_equal(after.last_hidden_state, before.last_hidden_state)
    np.testing.assert_array_equal(after.pooler_output, before.pooler_output)
    assert one_workspace <= enc.workspace_bytes <= CONCURRENCY * one_workspace, (
        f"workspace {enc.workspace_bytes} B; the largest shape needs {one_workspace} B per session"
    )
    mib = 2**20
    growth = end_rss - warm_rss
    assert growth <= RSS_GROWTH_LIMIT, (
        f"host RSS grew by {growth / mib:.1f} MiB over {FORWARDS} forwards after the warm-up "
        f"(warm {warm_rss / mib:.0f} MiB, peak {peak_rss / mib:.0f} MiB, end {end_rss / mib:.0f} MiB)"
    )
