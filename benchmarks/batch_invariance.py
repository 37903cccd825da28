"""What batch_invariant=True costs and what it buys, on a GPU.

  python benchmarks/batch_invariance.py [--json FILE] [--reps N]

BERT-base (random weights, ftbert.bench.models) in float16 and bfloat16:
- drift: one 100-token sequence alone against the same sequence inside batches of 2, 8, 33 and 64
  random sequences (padded to 160, the reference at a random row): the largest difference of its
  hidden states, with the setting off and on;
- cost: full batches (1 x 128, 8 x 128, 32 x 128, 32 x 512) and ragged ones (`ftbert bench
  --varlen`'s GPU cases: lengths uniform in a range, fixed seed, right-padded) as CUDA tensors,
  CUDA graphs on, the median of --reps timed blocks of 20 forwards each (CUDA events) after a
  warm-up, off and on alternating block by block in one process, and their ratio.
"""

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

import ftbert
from ftbert.bench.models import make_random_bert_base

# (batch, seq, shortest, longest): full batches, then ragged ones.
CASES = [(1, 128, 128, 128), (8, 128, 128, 128), (32, 128, 128, 128), (32, 512, 512, 512),
         (16, 512, 102, 512), (32, 128, 8, 128), (32, 384, 1, 384)]


def label(case) -> str:
    batch, seq, lo, hi = case
    return f"{batch}x{seq}" if lo == hi == seq else f"{batch}x{seq}:{lo}-{hi}"
BATCHES = [2, 8, 33, 64]


def drift(enc, vocab: int) -> float:
    rng = np.random.default_rng(0)
    ref = rng.integers(1000, vocab, 100)
    alone = enc(ref[None], np.ones((1, 100), np.int32)).last_hidden_state[0].astype(np.float32)
    worst = 0.0
    for batch in BATCHES:
        ids = rng.integers(1000, vocab, (batch, 160))
        mask = np.zeros((batch, 160), np.int32)
        for b in range(batch):
            mask[b, : int(rng.integers(20, 161))] = 1
        place = int(rng.integers(0, batch))
        mask[place] = 0
        mask[place, :100] = 1
        ids[place, :100] = ref
        got = enc(ids, mask).last_hidden_state[place, :100].astype(np.float32)
        worst = max(worst, float(np.abs(got - alone).max()))
    return worst


def block_ms(enc, ids, mask, n: int = 20) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        enc(ids, mask)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json")
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args(argv)
    if not ftbert.cuda_available():
        print("batch_invariance: needs an NVIDIA GPU and a CUDA build", file=sys.stderr)
        return 1
    results = {"gpu": torch.cuda.get_device_name(), "rows": []}
    with tempfile.TemporaryDirectory() as d:
        path = make_random_bert_base(Path(d) / "bert-base")
        for dtype in ("float16", "bfloat16"):
            enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype=dtype, batch_invariant=False)
            vocab = int(enc.config["vocab_size"])
            row = {"dtype": dtype, "drift_off": drift(enc, vocab)}
            enc.batch_invariant = True
            row["drift_on"] = drift(enc, vocab)
            for case in CASES:
                batch, seq, lo, hi = case
                g = torch.Generator().manual_seed(batch * 1000 + seq)
                lengths = torch.randint(lo, hi + 1, (batch,), generator=g)
                mask = (torch.arange(seq)[None, :] < lengths[:, None]).to(torch.int64).cuda()
                ids = torch.randint(1000, vocab, (batch, seq), generator=g).cuda() * mask
                times = {False: [], True: []}
                for on in (False, True):  # warm-up: recordings, GEMM picks
                    enc.batch_invariant = on
                    for _ in range(3):
                        block_ms(enc, ids, mask, 5)
                enc._native.wait_for_tuning()
                for _ in range(args.reps):
                    for on in (False, True):
                        enc.batch_invariant = on
                        block_ms(enc, ids, mask, 3)  # the switch drops the recordings: re-record
                        times[on].append(block_ms(enc, ids, mask))
                off, on = statistics.median(times[False]), statistics.median(times[True])
                row[label(case)] = {"off_ms": off, "on_ms": on, "ratio": on / off,
                                         "off_spread": [min(times[False]), max(times[False])],
                                         "on_spread": [min(times[True]), max(times[True])]}
            results["rows"].append(row)
    print(f"batch invariance, BERT-base, {results['gpu']}; median of {args.reps} blocks of 20 forwards")
    print(f"{'dtype':9} {'max|Δ| off':>11} {'max|Δ| on':>10}")
    for r in results["rows"]:
        print(f"{r['dtype']:9} {r['drift_off']:11.2e} {r['drift_on']:10.2e}")
    print(f"{'dtype':9} {'case':>16} {'off ms':>8} {'on ms':>8} {'ratio':>6}")
    for r in results["rows"]:
        for case in CASES:
            c = r[label(case)]
            print(f"{r['dtype']:9} {label(case):>16} {c['off_ms']:8.3f} {c['on_ms']:8.3f} {c['ratio']:6.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
