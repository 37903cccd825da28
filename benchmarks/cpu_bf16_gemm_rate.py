"""The CPU bfloat16 weight GEMM against its ceiling, the bfloat16 dot product's peak.

  python benchmarks/cpu_bf16_gemm_rate.py [--model minilm|bert-base] [--rows 32,128,1024,4096]
                                          [--reps N] [--json FILE]

The peak: `_ops.cpu_bf16_dot_peak`, 12 independent 512-bit vdpbf16ps chains on registers, on one
thread and on as many threads as the CPU pool has. Then each weight GEMM of the model (QKV, the
attention output, FFN-in with its erf-GELU and without it, FFN-out) in bfloat16 through
`OpRunner.weight_gemm` at each row count: a call uploads the operands once and runs the GEMM
`repeat` times, so a GEMM's time is (time of 2R runs - time of R runs) / R, which leaves the upload
and the download out; the median of --reps such differences. Its rate (2·m·n·k / time) is printed
with its share of the all-threads peak. Needs AVX512-BF16.
"""

import argparse
import json
import sys

import numpy as np

from ftbert import _C, _ops
from ftbert.bench import cpu_summary
from ftbert.bench.timing import repeated_op_ms

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
MODELS = {"minilm": (384, 1536), "bert-base": (768, 3072)}  # hidden, intermediate


def gemm_ms(cpu, m, n, k, act, reps):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32) if act != "identity" else None
    # R runs take ~0.1 s at ~200 GFLOP/s.
    r = max(2, int(0.1 * 200e9 / (2 * m * n * k)))
    return repeated_op_ms(lambda runs: cpu.weight_gemm("bfloat16", a, w, repeat=runs, bias=bias, act=act),
                          r, reps)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="minilm")
    ap.add_argument("--rows", default="32,128,1024,4096")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if reason := _C.cpu_dtype_unsupported_reason("bfloat16"):
        print(f"cpu_bf16_gemm_rate: {reason}", file=sys.stderr)
        return 1
    threads = _ops.cpu_num_threads()
    peak_one = max(_ops.cpu_bf16_dot_peak(1, 20_000_000) for _ in range(3))
    peak_all = max(_ops.cpu_bf16_dot_peak(threads, 20_000_000) for _ in range(3))
    print(f"CPU: {cpu_summary(FLAGS)}")
    print(f"vdpbf16ps peak: {peak_one:.1f} GFLOP/s on 1 thread, {peak_all:.1f} on {threads}")
    hidden, inner = MODELS[args.model]
    shapes = [("QKV", 3 * hidden, hidden, "identity"), ("attention output", hidden, hidden, "identity"),
              ("FFN-in + GELU", inner, hidden, "gelu"), ("FFN-in alone", inner, hidden, "identity"),
              ("FFN-out", hidden, inner, "identity")]
    cpu = _ops.OpRunner("cpu")
    res = {"cpu": cpu_summary(FLAGS), "model": args.model, "threads": threads, "peak_1": peak_one,
           "peak_all": peak_all, "rows": []}
    print(f"{'GEMM':>17} {'m':>6} {'n':>5} {'k':>5} {'ms':>8} {'GFLOP/s':>8} {'of peak':>8}")
    for m in (int(x) for x in args.rows.split(",")):
        for name, n, k, act in shapes:
            ms = gemm_ms(cpu, m, n, k, act, args.reps)
            rate = 2 * m * n * k / ms / 1e6
            res["rows"].append({"gemm": name, "m": m, "n": n, "k": k, "ms": ms, "gflops": rate,
                                "of_peak": rate / peak_all})
            print(f"{name:>17} {m:>6} {n:>5} {k:>5} {ms:>8.3f} {rate:>8.1f} {rate / peak_all:>8.0%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
