"""bfloat16 on the CPU against torch's bfloat16, with numpy arrays and with torch CPU tensors as
ftbert's inputs.

  python benchmarks/cpu_bf16.py [--model DIR] [--shapes 1x32,1x128,8x32,8x128] [--rounds N] [--json FILE]

The real all-MiniLM-L6-v2 (default: the bundled copy) in bfloat16, one process: per shape, random
ids (a fixed seed), ftbert given numpy int64 arrays, ftbert given torch int64 CPU tensors, and
transformers' AutoModel in bfloat16 with sdpa attention under torch.inference_mode, each timed in
blocks of 5 forwards after 3 warm-up forwards, the three alternated --rounds times (default 7)
with 0.3 s before each block (torch's intra-op threads spin for a while after its forwards, which
would slow whatever runs next);
the median block's ms per forward, ftbert's speed-up over torch for each input kind, and the
largest difference of ftbert's last_hidden_state from torch's (float32 copies). The shapes are
`ftbert bench --preset cpu`'s. The CPU's flags and the thread counts are printed with them.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

import ftbert
from ftbert import _C
from ftbert.bench import cpu_summary

FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16")


def cpu_flags() -> str:
    return cpu_summary(FLAGS)


def block_ms(run, n: int = 5) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        run()
    return (time.perf_counter() - t0) / n * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--shapes", default="1x32,1x128,8x32,8x128")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if reason := _C.cpu_dtype_unsupported_reason("bfloat16"):
        print(f"cpu_bf16: {reason}", file=sys.stderr)
        return 1
    from transformers import AutoModel

    path = args.model or str(ftbert.default_model_path())
    enc = ftbert.Encoder.from_pretrained(path, dtype="bfloat16")
    hf = AutoModel.from_pretrained(path, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
    vocab = int(enc.config["vocab_size"])
    res = {"cpu": cpu_flags(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
           "rounds": args.rounds, "rows": []}
    print(f"CPU: {res['cpu']}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'shape':>8} {'ftbert numpy':>13} {'ftbert torch':>13} {'torch bf16':>11} "
          f"{'x torch (numpy)':>16} {'x torch (torch)':>16} {'max|Δ|':>9}")
    rng = np.random.default_rng(0)
    for shape in args.shapes.split(","):
        b, s = (int(x) for x in shape.split("x"))
        ids = rng.integers(1000, vocab, (b, s))
        mask = np.ones_like(ids)
        ids_t, mask_t = torch.from_numpy(ids), torch.from_numpy(mask)
        runs = {
            "numpy": lambda: enc(ids, mask),
            "torch": lambda: enc(ids_t, mask_t),
            "hf": lambda: hf(input_ids=ids_t, attention_mask=mask_t),
        }
        times = {k: [] for k in runs}
        with torch.inference_mode():
            for run in runs.values():
                for _ in range(3):
                    run()
            for _ in range(args.rounds):
                for k, run in runs.items():
                    time.sleep(0.3)  # torch's idle threads stop spinning before the next block
                    times[k].append(block_ms(run))
            want = hf(input_ids=ids_t, attention_mask=mask_t).last_hidden_state.float()
            got = enc(ids_t, mask_t).last_hidden_state.float()
        med = {k: statistics.median(v) for k, v in times.items()}
        row = {"shape": shape, **{f"{k}_ms": v for k, v in med.items()},
               "spread": {k: [min(v), max(v)] for k, v in times.items()},
               "speedup_numpy": med["hf"] / med["numpy"], "speedup_torch": med["hf"] / med["torch"],
               "max_abs_diff": float((got - want).abs().max())}
        res["rows"].append(row)
        print(f"{shape:>8} {med['numpy']:13.2f} {med['torch']:13.2f} {med['hf']:11.2f} "
              f"{row['speedup_numpy']:16.2f} {row['speedup_torch']:16.2f} {row['max_abs_diff']:9.2e}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
