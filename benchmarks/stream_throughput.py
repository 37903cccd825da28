"""Throughput of K callers of one encoder, each a thread on its own CUDA stream, against one caller.

    python benchmarks/stream_throughput.py [--json FILE] [--shapes 1x128,32x128] [--concurrency 1,4]
                                           [--callers 1,4] [--window 1.0] [--repeats 3]

BERT-base (12 layers, hidden 768, 12 heads; random weights, seed 0, as `ftbert bench --model
bert-base` makes it) in float16 with flash attention and CUDA graphs on. For each shape (batch x
seq, full masks) and each `concurrency` setting of one encoder, K threads (--callers) call it in a
loop, each inside `with torch.cuda.stream(its own stream)`, with torch int64 CUDA inputs of its own,
and consume each output on that stream (a small add into a per-thread sum) as a caller would. As
the upper bound of real overlap, K separate Encoder instances (concurrency 1 each), one per thread,
run the same way.

Measured: after a warm-up (each thread's shape recorded as a CUDA graph), the threads are released
together and run for a fixed wall-clock window; then the GPU is synchronized and the forwards
started in the window are divided by the time from the release to the end of that synchronize
(so work queued in the window is paid for in full). Repeated --repeats times; the median is
reported, with the spread. forwards/s counts calls, sequences/s calls x batch; "vs K=1" divides
by the same configuration's one-caller rate (for the separate instances: one encoder with one
caller). Each thread's last output is compared with a one-at-a-time forward of its input ("ok").

Each call includes the encoder's device input check, whose small read back synchronizes the
calling stream: one caller leaves the GPU idle while it checks and launches, which is what other
callers can fill. --device cpu runs the same loop on the CPU backend (float32, no streams).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

import ftbert
from ftbert.bench.models import make_random_bert_base


def parse_list(text: str, kind=int) -> list:
    return [kind(v) for v in text.split(",") if v]


def parse_shape(text: str) -> tuple[int, int]:
    b, s = text.lower().split("x")
    return int(b), int(s)


class Runner:
    def __init__(self, device: str):
        self.device = device
        self.cuda = device.startswith("cuda")

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def stream(self):
        return torch.cuda.Stream() if self.cuda else None

    def measure(self, encoders: list, inputs: list, window: float, repeats: int, warmup_calls: int):
        """Thread t calls encoders[t] on inputs[t] on a stream of its own. Returns the forwards/s
        of each repeat and each thread's last pooled output."""
        K = len(encoders)
        streams = [self.stream() for _ in range(K)]
        sinks = [torch.zeros((), dtype=torch.float32, device=self.device) for _ in range(K)]
        self.sync()
        rates, last = [], [None] * K
        for rep in range(repeats + 1):  # round 0 is the warm-up: no window, not counted
            release = threading.Barrier(K + 1)
            stop = threading.Event()
            counts = [0] * K
            errors: list[BaseException] = []

            def loop(t: int) -> None:
                try:
                    enc, (ids, mask), sink = encoders[t], inputs[t], sinks[t]
                    with torch.cuda.stream(streams[t]) if self.cuda else contextlib.nullcontext():
                        if rep == 0:
                            for _ in range(warmup_calls):
                                enc(ids, mask)
                        release.wait()
                        n, out = 0, None
                        while not stop.is_set():
                            out = enc(ids, mask)
                            sink += out.pooler_output[0, 0].float()  # read on this stream
                            n += 1
                        if out is not None:
                            last[t] = out.pooler_output.clone()
                    counts[t] = n
                except BaseException as e:  # surfaced below; the barrier must not hang the others
                    errors.append(e)
                    release.abort()

            threads = [threading.Thread(target=loop, args=(t,)) for t in range(K)]
            for th in threads:
                th.start()
            try:
                release.wait()
            except threading.BrokenBarrierError:
                pass
            t0 = time.perf_counter()
            time.sleep(0 if rep == 0 else window)
            stop.set()
            for th in threads:
                th.join()
            self.sync()
            elapsed = time.perf_counter() - t0
            if errors:
                raise errors[0]
            if rep > 0:
                rates.append(sum(counts) / elapsed)
        for s in sinks:
            assert torch.isfinite(s).item()
        return rates, last


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="1x128,32x128")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--callers", default="1,4", help="K: threads calling at once")
    ap.add_argument("--window", type=float, default=1.0, help="seconds per repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup-calls", type=int, default=5, help="per thread, before the first repeat")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="bert-base", help="bert-base, or a checkpoint directory")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    shapes = [parse_shape(s) for s in args.shapes.split(",")]
    concurrencies, callers = parse_list(args.concurrency), parse_list(args.callers)
    if not shapes or not concurrencies or not callers or min(callers) < 1 or args.repeats < 1:
        ap.error("need at least one shape, concurrency and caller count, and --repeats >= 1")
    runner = Runner(args.device)
    if runner.cuda and not ftbert.cuda_available():
        print("stream_throughput: no CUDA GPU or no CUDA build of ftbert (use --device cpu)", file=sys.stderr)
        return 2
    dtype, attention = ("float16", "flash") if runner.cuda else ("float32", "auto")
    kmax = max(callers)

    with contextlib.ExitStack() as stack:
        if args.model == "bert-base":
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ftbert-streams-")))
            path = make_random_bert_base(tmp / "bert-base")
        else:
            path = Path(args.model)

        def load(concurrency: int):
            return ftbert.Encoder.from_pretrained(path, device=args.device, dtype=dtype, attention=attention,
                                                  cuda_graphs=True, concurrency=concurrency)

        shared = {c: load(c) for c in concurrencies}
        # K separate instances: the concurrency=1 one (if measured) and kmax - 1 more.
        separate = [shared[1] if 1 in shared else load(1)]
        separate += [load(1) for _ in range(kmax - 1)]
        one = separate[0]
        vocab = int(one.config["vocab_size"])
        device_name = torch.cuda.get_device_name() if runner.cuda else "cpu"
        print(f"device: {device_name}  model: {args.model}, {dtype}, attention {attention}, CUDA graphs on  "
              f"window {args.window} s x {args.repeats}", flush=True)

        rows = []
        for batch, seq in shapes:
            gen = torch.Generator().manual_seed(batch * 1000 + seq)
            inputs = []
            for _ in range(kmax):
                ids = torch.randint(0, vocab, (batch, seq), generator=gen).to(args.device)
                inputs.append((ids, torch.ones_like(ids)))
            refs = [one(*x).pooler_output for x in inputs]  # one at a time
            runner.sync()
            configs = [(f"1 encoder, concurrency={c}", c, K, [shared[c]] * K) for c in concurrencies for K in callers]
            if kmax > 1:
                configs.append((f"{kmax} encoders, one per caller", 1, kmax, separate))
            for label, c, K, encs in configs:
                rates, last = runner.measure(encs, inputs[:K], args.window, args.repeats, args.warmup_calls)
                ok = all(a is not None and torch.equal(a, b) for a, b in zip(last, refs))
                rate = statistics.median(rates)
                rows.append(dict(config=label, concurrency=c, callers=K, separate=len(set(map(id, encs))) > 1,
                                 batch=batch, seq=seq, forwards_per_s=rate, sequences_per_s=rate * batch,
                                 repeats=[round(r, 1) for r in rates], ok=ok))
                print(f"  {batch}x{seq} {label}, K={K}: {rate:.0f} forwards/s{'' if ok else '  OUTPUT MISMATCH'}",
                      flush=True)

    for r in rows:
        # One caller of one encoder with this concurrency (separate instances: with concurrency 1).
        c = 1 if r["separate"] else r["concurrency"]
        base = [x for x in rows if x["batch"] == r["batch"] and x["seq"] == r["seq"] and not x["separate"]
                and x["callers"] == 1 and x["concurrency"] == c]
        r["vs_k1"] = r["forwards_per_s"] / base[0]["forwards_per_s"] if base else None

    print(f"\n{'shape':>7}  {'config':<30} {'K':>2} {'forwards/s':>11} {'sequences/s':>12} {'vs K=1':>7} "
          f"{'spread':>13} {'ok':>3}")
    for r in rows:
        spread = f"{min(r['repeats']):.0f}-{max(r['repeats']):.0f}"
        vs = "-" if r["vs_k1"] is None else f"{r['vs_k1']:.2f}x"
        print(f"{r['batch']:>3}x{r['seq']:<3}  {r['config']:<30} {r['callers']:>2} {r['forwards_per_s']:>11.0f} "
              f"{r['sequences_per_s']:>12.0f} {vs:>7} {spread:>13} {'yes' if r['ok'] else 'NO':>3}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device_name, "model": args.model, "dtype": dtype, "attention": attention,
                       "cuda_graphs": True, "window_s": args.window, "repeats": args.repeats,
                       "rows": rows}, f, indent=1)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
