"""Forward time per shape in bursts, run by hand on a GPU machine, in the order the shapes are given.

    python benchmarks/forward_bursts.py 48x128 56x128 64x128 [--bursts 12] [--dtype float16]

BERT-base (random weights), CUDA graphs, flash attention. Per shape, in one process: the first
forward's wall time, 30 warm-up forwards, 3 s idle, then --bursts bursts of 40 forwards back to
back, each timed with CUDA events; one line per shape with the first forward's ms and the ms per
forward of every burst. The order matters: a shape's first forward measures the GEMM picks
(gemm_tuner.h) of any row bucket the process has not measured yet (loading each candidate's
kernel the first time), and later shapes of that bucket reuse them; the bursts show the clock
settling under load.
"""

import argparse
import pathlib
import tempfile
import time

import torch

from ftbert.bench.models import load_model, make_ftbert, make_random_bert_base
from ftbert.bench.sweep import make_inputs, on_device_stream


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shapes", nargs="+", help="batch x seq, e.g. 64x128")
    ap.add_argument("--bursts", type=int, default=12)
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    args = ap.parse_args()
    model = load_model("bert-base", make_random_bert_base(pathlib.Path(tempfile.mkdtemp()) / "m"))
    for spec in args.shapes:
        b, s = (int(x) for x in spec.split("x"))
        inputs = make_inputs(model.config, b, s, None, 0)
        with on_device_stream("cuda:0"), torch.inference_mode():
            enc = make_ftbert(model, "cuda:0", args.dtype, "flash", False, True)
            ids, mask, types = (inputs[k].to(device="cuda:0", dtype=torch.int32)
                                for k in ("input_ids", "attention_mask", "token_type_ids"))
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            enc(ids, mask, types)
            torch.cuda.synchronize()
            first_ms = (time.perf_counter() - t0) * 1e3
            for _ in range(30):
                enc(ids, mask, types)
            torch.cuda.synchronize()
            time.sleep(3)
            ms = []
            for _ in range(args.bursts):
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(40):
                    enc(ids, mask, types)
                stop.record()
                torch.cuda.synchronize()
                ms.append(start.elapsed_time(stop) / 40)
        print(f"{spec} first {first_ms:.1f} | " + " ".join(f"{x:.3f}" for x in ms), flush=True)


if __name__ == "__main__":
    main()
