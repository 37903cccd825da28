"""How fast a float32 forward can be on this CPU: the model's FLOPs at the process's best measured
float32 GEMM rate, next to ftbert and transformers timed in the same process.

  python benchmarks/cpu_flop_floor.py [--models mpnet-base,modernbert-base,bert-base]
                                      [--shapes 1x128,8x128] [--rounds 5] [--json FILE]

Per model (random weights of the real sizes, `ftbert bench`'s presets): the forward's FLOPs counted
by torch.utils.flop_counter over transformers' model (every matmul, attention included at its full
S x S even where a window masks part of it); the GEMM rate as the best of torch.mm at 2048^3 and of
each weight GEMM shape of the model at the shape's token count (the same threads); the floor =
FLOPs / that rate, which no float32 forward at the same FLOPs beats. Then ftbert (numpy int32
inputs) and transformers (sdpa, or eager where the model has no sdpa) are timed in alternated
blocks of 3 forwards after one warm-up each, --rounds times; medians. A speed target of R x
transformers is beyond float32 on this CPU when transformers' time / R is below the floor.
"""

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from ftbert.bench import cpu_summary
from ftbert.bench.args import BenchError
from ftbert.bench.models import hf_attention, load_model, make_ftbert, make_hf, resolve_model

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def best_gflops(shapes: list[tuple[int, int, int]], reps: int = 5) -> tuple[float, str]:
    """The best GFLOP/s torch.mm reaches over (m, n, k) shapes, and which shape gave it."""
    best, which = 0.0, ""
    for m, n, k in shapes:
        a, b = torch.randn(m, k), torch.randn(k, n)
        for _ in range(2):
            a @ b
        t = min(_timed(lambda: a @ b) for _ in range(reps))
        rate = 2 * m * n * k / t / 1e9
        if rate > best:
            best, which = rate, f"{m}x{n}x{k}"
    return best, which


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def weight_gemm_shapes(hf, tokens: int) -> list[tuple[int, int, int]]:
    return sorted({(tokens, m.out_features, m.in_features) for m in hf.modules()
                   if isinstance(m, torch.nn.Linear)})


def forward_flops(hf, ids, mask) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        hf(input_ids=ids, attention_mask=mask)
    return counter.get_total_flops()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mpnet-base,modernbert-base,bert-base")
    ap.add_argument("--shapes", default="1x128,8x128")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    print(f"CPU: {cpu_summary(FLAGS)}; torch {torch.__version__}, {torch.get_num_threads()} threads",
          flush=True)
    rows = []
    with contextlib.ExitStack() as stack:
        for name in args.models.split(","):
            label, path = resolve_model(name, stack)
            model = load_model(label, path)
            try:
                engine = "hf-sdpa" if hf_attention(model, "hf-sdpa") == "sdpa" else "hf-eager"
            except BenchError:  # transformers runs this family with eager attention only (MPNet)
                engine = "hf-eager"
            hf = make_hf(model, "sdpa" if engine == "hf-sdpa" else "eager").float().eval()
            enc = make_ftbert(model, "cpu", "float32", "auto", False, True)
            vocab = int(model.config["vocab_size"])
            for B, S in shapes:
                rng = np.random.default_rng(0)
                ids = rng.integers(3, vocab, (B, S)).astype(np.int32)
                mask = np.ones((B, S), np.int32)
                tids, tmask = torch.from_numpy(ids).long(), torch.from_numpy(mask).long()
                flops = forward_flops(hf, tids, tmask)
                rate, which = best_gflops([(2048, 2048, 2048), *weight_gemm_shapes(hf, B * S)])
                runs = {"ftbert": lambda: enc(ids, mask),
                        engine: lambda: hf(input_ids=tids, attention_mask=tmask)}
                times = {k: [] for k in runs}
                with torch.inference_mode():
                    for fn in runs.values():
                        fn()
                    for _ in range(args.rounds):
                        for k, fn in runs.items():
                            time.sleep(0.3)  # torch's threads spin a while after its forwards
                            times[k].append(_timed(lambda: [fn() for _ in range(3)]) / 3 * 1e3)
                med = {k: statistics.median(v) for k, v in times.items()}
                floor = flops / (rate * 1e9) * 1e3
                row = {"model": name, "batch": B, "seq": S, "gflop": flops / 1e9, "gemm_gflops": rate,
                       "best_gemm_shape": which, "floor_ms": floor, "ftbert_ms": med["ftbert"],
                       "peer": engine, "peer_ms": med[engine], "ftbert_x_peer": med[engine] / med["ftbert"],
                       "peer_over_1_5_ms": med[engine] / 1.5, "samples": times}
                rows.append(row)
                print(f"{name} {B}x{S}: {flops / 1e9:.2f} GFLOP, best GEMM {rate:.1f} GFLOP/s ({which}): "
                      f"floor {floor:.1f} ms; ftbert {med['ftbert']:.1f} ms, {engine} {med[engine]:.1f} ms "
                      f"({med[engine] / med['ftbert']:.2f}x); 1.5x {engine} = {med[engine] / 1.5:.1f} ms"
                      f"{' < floor' if med[engine] / 1.5 < floor else ''}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu_summary(FLAGS), "torch": torch.__version__,
                                               "threads": torch.get_num_threads(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
