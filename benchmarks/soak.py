"""GPU soak, run by hand: many forwards of random shapes on one encoder, watching memory.

    python benchmarks/soak.py [--forwards 10000] [--threads 1] [--concurrency N] [--json FILE]

A random-initialised model (4 layers, hidden 256, 4 heads by default; --layers/--hidden/--heads) in
float16 with CUDA graphs on runs --forwards forwards (10^4) of shapes batch 1..32 x seq 1..256: 80%
drawn from a fixed pool of 64 shapes, twice the 32 recordings an encoder session keeps, so that
shapes are recorded as CUDA graphs, evicted and recorded again all along; 20% drawn afresh (mostly
seen once, run op by op). Masks are ragged, padded left or right; one call in ten passes numpy
arrays (the host path: copies in and out), the rest torch CUDA tensors on the calling thread's
stream (--threads N: N threads, each on a stream of its own, calling the same encoder).

Every --every forwards (500) it records: device memory in use (torch.cuda.mem_get_info), torch's
own cache (torch.cuda.memory_reserved), the engine's workspace (enc.workspace_bytes), what is left
(the "engine other": weights, CUDA context, cuBLAS workspaces, recorded graphs, and any leak),
enc.recorded_shapes and the host RSS. At the end a probe input, run first before anything else,
runs again and must give the same bits.

The checks (exit status 1 if one fails; the table and --json say which):
- probe: the probe's outputs are unchanged, bit for bit.
- device: "engine other" grows by at most --max-device-growth-mib (64) from the end of the warm-up
  to the end. Once warmed up (the largest shape has run, each session's graph cache is full) the
  engine allocates nothing that stays: recordings replace recordings, the workspace is sized
  already and is counted apart. The slack is for the driver's pools behind graph instantiation;
  keeping one recorded graph per recording would add far more (thousands of recordings).
- workspace: enc.workspace_bytes is at most concurrency x what the largest shape needs (measured on
  a fresh encoder that ran only that shape, with unfused attention: the most scratch).
- host: the RSS grows by at most --max-host-growth-mib (128) after the warm-up: a leak of a
  recording's host-side graph or of a host output per forward would exceed it.

With --threads N > 1 the engine opens its sessions (up to `concurrency`, each with a stream, a
cuBLAS handle and workspace) as calls overlap; the warm-up (the largest shape from every thread at
once, then 500 forwards) opens them in practice, but one opened later shows as a step in "engine
other" of about one cuBLAS workspace (32 MiB on Hopper). Kernels loaded lazily by CUDA the first
time a shape picks them also add a little there. The time of the forwards after the warm-up is
printed: on an H100 the defaults ran 10^4 forwards in about 8 s, after a 1 s warm-up.

--device cpu runs the same loop on the CPU backend (float32, no streams, no device memory).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

import ftbert

MIB = 2**20
MAX_BATCH, MAX_SEQ = 32, 256
POOL_SHAPES = 64  # the shapes that come back: twice the 32 recordings a session keeps
POOL_FRACTION = 0.8
NUMPY_FRACTION = 0.1


def make_model(directory: Path, layers: int, hidden: int, heads: int, vocab: int, seed: int) -> Path:
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                     num_attention_heads=heads, intermediate_size=4 * hidden,
                     max_position_embeddings=512)
    BertModel(cfg).save_pretrained(directory)
    return directory


def rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return None


class Soak:
    def __init__(self, args, path: Path):
        self.args = args
        self.cuda = args.device.startswith("cuda")
        kwargs = dict(device=args.device, dtype=args.dtype, attention=args.attention, cuda_graphs=True)
        if args.concurrency is not None:
            kwargs["concurrency"] = args.concurrency
        self.enc = ftbert.Encoder.from_pretrained(path, **kwargs)
        self.vocab = int(self.enc.config["vocab_size"])
        rng = np.random.default_rng(args.seed)
        pool = set()
        while len(pool) < POOL_SHAPES:
            pool.add((int(rng.integers(1, MAX_BATCH + 1)), int(rng.integers(1, MAX_SEQ + 1))))
        self.pool = sorted(pool)
        self.samples: list[dict] = []
        self.done = 0
        # One stream and one thread per caller for the whole run: torch's allocator caches freed
        # blocks per stream, so fresh streams would grow its cache (not the engine's memory).
        self.streams = [torch.cuda.Stream() if self.cuda else None for _ in range(args.threads)]
        self.executor = ThreadPoolExecutor(args.threads) if args.threads > 1 else None
        self.t0 = time.perf_counter()

    # ---- inputs --------------------------------------------------------------------------------
    def shape(self, rng) -> tuple[int, int]:
        if rng.random() < POOL_FRACTION:
            return self.pool[int(rng.integers(len(self.pool)))]
        return int(rng.integers(1, MAX_BATCH + 1)), int(rng.integers(1, MAX_SEQ + 1))

    def call(self, rng, batch: int, seq: int, host: bool):
        """Arguments of one call; torch ones are made on the current stream."""
        lengths = rng.integers(1, seq + 1, batch)
        lengths[0] = seq
        pos = np.arange(seq)
        mask = (pos[None, :] < lengths[:, None]) if rng.random() < 0.5 else (pos[None, :] >= seq - lengths[:, None])
        if host or not self.cuda:
            ids = rng.integers(0, self.vocab, (batch, seq))
            types = rng.integers(0, 2, (batch, seq))
            return ids, mask.astype(np.int64), types
        dev = self.args.device
        ids = torch.randint(0, self.vocab, (batch, seq), device=dev)
        types = torch.randint(0, 2, (batch, seq), device=dev)
        return ids, torch.from_numpy(mask).to(dev), types

    # ---- running -------------------------------------------------------------------------------
    def run_many(self, n: int, seed: int, shapes=None) -> None:
        """n forwards split over the threads (each on its own stream), then wait for the GPU."""
        threads = self.args.threads

        def work(t: int) -> int:
            rng = np.random.default_rng([self.args.seed, seed, t])
            mine = len(range(t, n, threads))
            stream = self.streams[t]
            with torch.cuda.stream(stream):  # None: a no-op
                for k in range(mine):
                    b, s = shapes[k % len(shapes)] if shapes else self.shape(rng)
                    out = self.enc(*self.call(rng, b, s, host=rng.random() < NUMPY_FRACTION))
                    del out  # nothing is kept: a leak shows as growth
            if stream is not None:
                stream.synchronize()
            return mine

        if self.executor is None:
            counts = [work(0)]
        else:
            counts = [f.result() for f in [self.executor.submit(work, t) for t in range(threads)]]
        if self.cuda:
            torch.cuda.synchronize()
        self.done += sum(counts)

    def sample(self, label: str) -> dict:
        s = {"label": label, "forwards": self.done, "seconds": round(time.perf_counter() - self.t0, 2),
             "workspace_mib": self.enc.workspace_bytes / MIB, "recorded_shapes": self.enc.recorded_shapes}
        rss = rss_bytes()
        s["host_rss_mib"] = None if rss is None else rss / MIB
        if self.cuda:
            free, total = torch.cuda.mem_get_info()
            s["device_used_mib"] = (total - free) / MIB
            s["device_total_mib"] = total / MIB
            s["torch_reserved_mib"] = torch.cuda.memory_reserved() / MIB
            s["engine_other_mib"] = s["device_used_mib"] - s["torch_reserved_mib"] - s["workspace_mib"]
        self.samples.append(s)
        return s


def largest_workspace(path: Path, args) -> int:
    """What one session's workspace holds after the largest shape (every dimension at its maximum),
    with unfused attention, whose scratch grows with batch x seq^2 (flash needs none): an upper
    bound whatever kernel "auto" picks for each shape."""
    enc = ftbert.Encoder.from_pretrained(path, device=args.device, dtype=args.dtype, attention="unfused",
                                         concurrency=1)
    ids = np.zeros((MAX_BATCH, MAX_SEQ), np.int64)
    enc(ids)
    n = enc.workspace_bytes
    del enc
    return n


def fmt(v, width=10, digits=1):
    if v is None:
        return f"{'-':>{width}}"
    if isinstance(v, float):
        return f"{v:>{width}.{digits}f}"
    return f"{v:>{width}}"


def print_table(rows: list[dict], cuda: bool) -> None:
    cols = [("label", "", 12), ("forwards", "forwards", 9), ("seconds", "s", 7)]
    if cuda:
        cols += [("device_used_mib", "device MiB", 11), ("torch_reserved_mib", "torch MiB", 10),
                 ("workspace_mib", "workspace", 10), ("engine_other_mib", "engine other", 13)]
    else:
        cols += [("workspace_mib", "workspace", 10)]
    cols += [("recorded_shapes", "graphs", 7), ("host_rss_mib", "host RSS MiB", 13)]
    print("  ".join(f"{h:>{w}}" if k != "label" else f"{h:<{w}}" for k, h, w in cols))
    for r in rows:
        print("  ".join(f"{r[k]:<{w}}" if k == "label" else fmt(r.get(k), w) for k, _, w in cols))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--forwards", type=int, default=10_000)
    ap.add_argument("--warmup", type=int, default=None, help="forwards before the baseline (default: 500 or 5%%)")
    ap.add_argument("--every", type=int, default=500, help="forwards between samples")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=None, help="the encoder's (default: its default)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default=None, help="default float16 on the GPU, float32 on the CPU")
    ap.add_argument("--attention", default="auto", choices=["auto", "unfused", "flash"])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-device-growth-mib", type=float, default=64.0)
    ap.add_argument("--max-host-growth-mib", type=float, default=128.0)
    ap.add_argument("--json", help="write the samples and checks here")
    args = ap.parse_args(argv)
    if args.forwards < 1 or args.every < 1 or args.threads < 1:
        ap.error("--forwards, --every and --threads must be at least 1")
    cuda = args.device.startswith("cuda")
    args.dtype = args.dtype or ("float16" if cuda else "float32")
    if cuda and not ftbert.cuda_available():
        print("soak: no CUDA GPU or no CUDA build of ftbert (use --device cpu)", file=sys.stderr)
        return 2
    warmup = args.warmup if args.warmup is not None else max(500, args.forwards // 20)

    with tempfile.TemporaryDirectory(prefix="ftbert-soak-") as d:
        path = make_model(Path(d), args.layers, args.hidden, args.heads, args.vocab, args.seed)
        need = largest_workspace(path, args)
        soak = Soak(args, path)
        enc = soak.enc
        print(f"device: {torch.cuda.get_device_name() if cuda else 'cpu'}  model: {args.layers} layers, "
              f"hidden {args.hidden}, {args.heads} heads, {args.dtype}  concurrency {enc.concurrency}  "
              f"threads {args.threads}  forwards {args.forwards} (+{warmup} warm-up)", flush=True)

        rng = np.random.default_rng([args.seed, 1])
        probe = soak.call(rng, 5, 77, host=False)
        first = enc(*probe)
        first = (first.last_hidden_state.clone(), first.pooler_output.clone()) if cuda else (
            first.last_hidden_state.copy(), first.pooler_output.copy())
        start = soak.sample("start")

        # Warm-up: the largest shape first (every session's workspace at its final size, as far as
        # the threads reach them all), then random shapes until the graph caches are full.
        soak.run_many(4 * args.threads, seed=2, shapes=[(MAX_BATCH, MAX_SEQ)])
        soak.run_many(warmup, seed=3)
        warm = soak.sample("warm")
        print(f"warmed up in {warm['seconds']:.1f} s; {enc.recorded_shapes} shapes recorded", flush=True)
        chunk = 0
        while soak.done - warm["forwards"] < args.forwards:
            n = min(args.every, args.forwards - (soak.done - warm["forwards"]))
            chunk += 1
            soak.run_many(n, seed=10 + chunk)
            s = soak.sample(f"{soak.done - warm['forwards']}")
            if chunk % 4 == 0:
                print(f"  {s['forwards'] - warm['forwards']} forwards, {s['seconds']:.1f} s", flush=True)
        end = soak.samples[-1]
        end["label"] = "end"
        seconds = end["seconds"] - warm["seconds"]

        if soak.executor is not None:
            soak.executor.shutdown()
        last = enc(*probe)
        last = (last.last_hidden_state, last.pooler_output)
        if cuda:
            torch.cuda.synchronize()
            probe_diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(first, last))
        else:
            probe_diff = float(max(np.abs(a - b).max() for a, b in zip(first, last)))

    after = [s for s in soak.samples if s["forwards"] >= warm["forwards"]]
    peak = {"label": "peak"}
    for k in ("device_used_mib", "torch_reserved_mib", "workspace_mib", "engine_other_mib",
              "recorded_shapes", "host_rss_mib"):
        vals = [s[k] for s in after if s.get(k) is not None]
        peak[k] = max(vals) if vals else None
    print()
    print_table([start, warm, peak, end], cuda)

    checks = {"probe_unchanged": {"ok": probe_diff == 0, "max_abs_diff": probe_diff}}
    limit = enc.concurrency * need
    checks["workspace"] = {"ok": enc.workspace_bytes <= limit, "bytes": enc.workspace_bytes,
                           "limit_bytes": limit, "largest_shape_bytes": need}
    if warm["host_rss_mib"] is not None:
        growth = end["host_rss_mib"] - warm["host_rss_mib"]
        checks["host_rss"] = {"ok": growth <= args.max_host_growth_mib, "growth_mib": growth,
                              "limit_mib": args.max_host_growth_mib}
    if cuda:
        growth = end["engine_other_mib"] - warm["engine_other_mib"]
        checks["device_engine_other"] = {"ok": growth <= args.max_device_growth_mib, "growth_mib": growth,
                                         "limit_mib": args.max_device_growth_mib}
    ok = all(c["ok"] for c in checks.values())
    print()
    print(f"{args.forwards} forwards in {seconds:.1f} s after the warm-up ({args.forwards / seconds:.0f}/s)")
    for name, c in checks.items():
        detail = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in c.items() if k != "ok")
        print(f"  {'ok  ' if c['ok'] else 'FAIL'} {name}: {detail}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name() if cuda else "cpu",
                       "options": vars(args), "warmup_forwards": warmup,
                       "pool_shapes": [f"{b}x{q}" for b, q in soak.pool], "seconds_after_warmup": seconds,
                       "samples": soak.samples, "checks": checks, "ok": ok}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
