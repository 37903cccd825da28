"""The weight GEMMs' measured kernel choice at BERT-base's shapes: for each of the layer's four
GEMMs at a few row counts, the candidate the CUDA backend's "auto" mode picked and every
candidate's kernel time (torch.profiler, the median launch of --reps) and whether it clears part
of its workspace first (a memset, which in a CUDA graph costs a node and its edges: "auto" times
the candidates in graphs, so a memset's cost is in its pick but not in this column), with
model-like data (activations ~N(0, 1), weights ~N(0, 0.02)).

Run on a GPU machine:
    python benchmarks/kernels/bench_gemm_choice.py [--rows 16384 4096 1024] [--dtype float16]
"""

import argparse

import numpy as np

SHAPES = (("qkv", 2304, 768, False), ("attn-out", 768, 768, False), ("ffn-in", 3072, 768, True),
          ("ffn-out", 768, 3072, False))


def kernel_us(fn, reps):
    """Median over reps of one call's summed kernel time (copies and fills left out), in us, and
    how many memsets one call issues."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    times, memsets = [], 0
    for _ in range(reps):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        times.append(sum(
            (getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0))
            for e in prof.key_averages()
            if not any(s in e.key.lower() for s in ("memcpy", "memset", "fill"))))
        memsets = sum(e.count for e in prof.key_averages() if "memset" in e.key.lower())
    return float(np.median(times)), memsets


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[16384, 4096, 1024])
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()

    from ftbert import _ops

    gpu = _ops.OpRunner("cuda")
    rng = np.random.default_rng(0)
    for m in args.rows:
        for name, n, k, gelu in SHAPES:
            a = rng.standard_normal((m, k)).astype(np.float32)
            w = (rng.standard_normal((k, n)) * 0.02).astype(np.float32)
            bias = (rng.standard_normal(n) * 0.02).astype(np.float32) if gelu else None
            act = "gelu" if gelu else "identity"
            gpu.weight_gemm(args.dtype, a, w, bias=bias, act=act)  # "auto" measures and picks
            pick = gpu.weight_gemm_pick(args.dtype, m, n, k, act=act)
            rows = sorted(
                (*kernel_us(lambda c=c: gpu.weight_gemm_candidate(c, args.dtype, a, w, bias=bias,
                                                                  act=act), args.reps), c)
                for c in gpu.weight_gemm_candidates(args.dtype, m, n, k, act=act))
            print(f"{name} {m} x {n} x {k}: auto picked {pick}")
            for t, memsets, c in rows:
                print(f"  {c:26s} {t:8.1f} us{'  + memset' if memsets else '          '}"
                      f"{'  <- picked' if c == pick else ''}", flush=True)


if __name__ == "__main__":
    main()
