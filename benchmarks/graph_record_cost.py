"""What a lone request's forward costs on a GPU by what it does with its shape's CUDA graph: run
op by op (the shape's first forward), record (its second: the recording is made, then replayed),
or replay a held recording. The first two are what `Encoder.warm_up_batches` (`ftbert serve`,
before it answers ready) takes off the request path for single-input batches.

    python benchmarks/graph_record_cost.py MODEL_DIR [--dtype float16] [--lengths 16,128,512]

Host wall time of each call to the forward the server's batcher runs (ids from pinned memory,
then a wait for the device), in ms: the first two once each for a shape new to a warmed-up
encoder (a fresh one per length), the replay as the median of about 50."""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--lengths", default="16,64,128,256,512")
    args = p.parse_args()

    import torch

    import ftbert
    from ftbert.text import forward_packed_batch, pack_sequences

    gpu = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()}, {args.model}, {args.dtype}")
    print(f"{'tokens':>6} {'op by op':>9} {'record':>9} {'replay':>9}   ms (host wall, lone input)")
    for n in (int(x) for x in args.lengths.split(",")):
        # A fresh encoder per length, warmed up as a server's is (kernels loaded, GEMM picks made),
        # so that what is timed is the shape's own cost.
        enc = ftbert.Encoder.from_pretrained(args.model, device="cuda", dtype=args.dtype, warmup=True)
        enc.wait_for_tuning()
        batch = pack_sequences([np.full(n, 1000, np.int32)], [None])
        kinds: dict[str, list[float]] = {"op_by_op": [], "recorded": [], "replayed": []}
        for _ in range(52):
            before = enc.graph_counts
            t0 = time.perf_counter()
            out, _ = forward_packed_batch(enc, batch, gpu)
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t0) * 1e3
            del out
            after = enc.graph_counts
            kinds[next(k for k in kinds if after[k] > before[k])].append(ms)
        first = lambda k: f"{kinds[k][0]:9.3f}" if kinds[k] else f"{'-':>9}"  # noqa: E731
        print(f"{n:>6} {first('op_by_op')} {first('recorded')} {statistics.median(kinds['replayed']):>9.3f}"
              + ("   (op by op: met at warm-up)" if not kinds["op_by_op"] else ""))
        del enc
        torch.cuda.empty_cache()

if __name__ == "__main__":
    main()
