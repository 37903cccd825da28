"""The CPU's fused attention kernel on its own: full and sliding-window attention at encoder shapes.

  python benchmarks/cpu_attention.py [--seq 128,512,2048] [--window 0,64] [--heads 12] [--head-dim 64]
                                     [--batch 1] [--reps 5] [--json FILE]

Each row runs `OpRunner("cpu").flash_attention` (the op the CPU forward runs for its fused attention)
on one random float32 qkv [B, S, 3H] with every position attended: a call uploads the operands once
and runs the op `repeat` times, so the op's time is (time of 2R runs - time of R runs) / R, without
the upload and the download; the median of --reps such differences. Window 0 is full attention;
w > 0 lets each query see the keys within w positions (ModernBERT's local layers: 64). GFLOP/s
counts the two products of full attention, 4·B·heads·S²·d, whatever the window, so a window's rate
says how much of the full work it saved.
"""

import argparse
import json
import sys

import numpy as np

from ftbert import _ops
from ftbert.bench import cpu_summary
from ftbert.bench.timing import repeated_op_ms

FLAGS = ("avx2", "avx512f", "avx512_bf16")


def ints(text: str, name: str, least: int) -> list[int]:
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise SystemExit(f"cpu_attention: --{name} takes comma-separated integers, got {text!r}") from None
    if any(v < least for v in values):
        raise SystemExit(f"cpu_attention: --{name} values must be at least {least}, got {text!r}")
    return values


def attention_ms(cpu, batch: int, seq: int, heads: int, head_dim: int, window: int, reps: int) -> float:
    rng = np.random.default_rng(0)
    hidden = heads * head_dim
    qkv = rng.standard_normal((batch, seq, 3 * hidden)).astype(np.float32)
    bias = (rng.standard_normal(3 * hidden) * 0.1).astype(np.float32)
    mask = np.ones((batch, seq), np.int32)
    scale = head_dim ** -0.5
    # R runs take ~0.1 s at ~50 GFLOP/s of full attention.
    r = max(2, int(0.1 * 50e9 / (4 * batch * heads * seq * seq * head_dim)))

    def run(runs: int) -> None:
        cpu.flash_attention("float32", qkv, bias, mask, heads, scale, window=window, repeat=runs)

    return repeated_op_ms(run, r, reps)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq", default="128,512,2048")
    ap.add_argument("--window", default="0,64")
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    seqs, windows = ints(args.seq, "seq", 1), ints(args.window, "window", 0)
    for name in ("heads", "head_dim", "batch", "reps"):
        if getattr(args, name) < 1:
            raise SystemExit(f"cpu_attention: --{name.replace('_', '-')} must be at least 1")
    cpu = _ops.OpRunner("cpu")
    res = {"cpu": cpu_summary(FLAGS), "threads": _ops.cpu_num_threads(), "rows": []}
    print(f"CPU: {res['cpu']}; {res['threads']} threads; heads {args.heads}, head dim {args.head_dim}, "
          f"batch {args.batch}")
    print(f"{'seq':>6} {'window':>6} {'ms':>9} {'GFLOP/s':>8}")
    for seq in seqs:
        for window in windows:
            ms = attention_ms(cpu, args.batch, seq, args.heads, args.head_dim, window, args.reps)
            rate = 4 * args.batch * args.heads * seq * seq * args.head_dim / ms / 1e6
            res["rows"].append({"seq": seq, "window": window, "ms": ms, "gflops_full": rate})
            print(f"{seq:>6} {window:>6} {ms:>9.3f} {rate:>8.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
