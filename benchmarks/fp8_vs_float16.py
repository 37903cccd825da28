"""BERT-base (random weights) with float16 activations on a GPU: ftbert's default against
quantization="fp8", each with batch invariance on and off, in bursts; then, with --kernels, the
GPU time per forward by kernel (torch.profiler, no CUDA graphs) for float16 and fp8 at 32 x 512 and
1 x 128. Each shape runs once and is timed after Encoder.wait_for_tuning(), so the tuner's picks are
in use; CUDA events, 20 warm-ups, the median of 60 forwards. Needs a Hopper GPU for fp8.

    python benchmarks/fp8_vs_float16.py [--kernels]
"""

import argparse
import collections
import pathlib
import tempfile

import numpy as np
import torch

import ftbert
from ftbert.bench.models import make_random_bert_base

SHAPES = [(1, 128), (32, 128), (32, 512), (128, 128)]


def median_ms(enc, ids) -> float:
    enc(ids)
    enc.wait_for_tuning()
    for _ in range(20):
        enc(ids)
    times = []
    for _ in range(60):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        enc(ids)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times))


def kernel_table(enc, ids, top=12) -> tuple[float, list]:
    enc(ids)
    enc.wait_for_tuning()
    for _ in range(5):
        enc(ids)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            enc(ids)
        torch.cuda.synchronize()
    per_kernel = collections.defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            entry = per_kernel[e.name[:110]]
            entry[0] += e.device_time_total / 10
            entry[1] += 1
    total = sum(t for t, _ in per_kernel.values())
    return total, sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:top]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", action="store_true", help="also the per-kernel GPU time")
    args = ap.parse_args()
    path = make_random_bert_base(pathlib.Path(tempfile.mkdtemp()))
    rng = np.random.default_rng(0)
    inputs = {shape: torch.from_numpy(rng.integers(1000, 30000, shape)).cuda() for shape in SHAPES}
    print(torch.cuda.get_device_name(), "| ms per forward, medians")
    print(f"{'engine':>28} " + " ".join(f"{b:>4}x{s:<4}" for b, s in SHAPES))
    for q in (None, "fp8"):
        for invariant in (True, False):
            enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype="float16", quantization=q,
                                                 batch_invariant=invariant)
            row = [median_ms(enc, inputs[shape]) for shape in SHAPES]
            label = f"{q or 'float16'} {'invariant' if invariant else 'not invariant'}"
            print(f"{label:>28} " + " ".join(f"{t:9.3f}" for t in row), flush=True)
            del enc
            torch.cuda.empty_cache()
    if not args.kernels:
        return
    for shape in ((32, 512), (1, 128)):
        ids = torch.from_numpy(rng.integers(1000, 30000, shape)).cuda()
        for q, invariant in ((None, True), ("fp8", True), ("fp8", False)):
            enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype="float16", quantization=q,
                                                 batch_invariant=invariant, cuda_graphs=False)
            total, rows = kernel_table(enc, ids)
            print(f"== {shape[0]}x{shape[1]} {q or 'float16'} invariant={invariant}: "
                  f"kernel time per forward {total / 1000:.3f} ms")
            for name, (t, count) in rows:
                print(f"  {t / 1000:7.3f} ms {count // 10:4d}x  {name}")
            del enc
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
