"""`ftbert serve`'s start-up: the time from starting its process to the first `/health` 200, then
whether the first requests after that pay for anything the warm-up should have done (a GEMM
tuning, a CUDA graph recording, a kernel load): each request shape below is sent several times in
a row and its first latency is printed beside the median of the others.

    python benchmarks/serve_startup.py MODEL [--device cuda] [--dtype float16] [--workers 1] \
        [--runs 3] [--json out.json]

Shapes: one short text, one long text (~256 tokens), a batch of 32 short texts, a batch of 32 long
ones; the server forms the batches it will form under load from such requests. Each run starts a
fresh server (a cold process; files the OS has cached stay cached).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request

SHORT = "a short sentence of a dozen words or so, as a search query would be"
LONG = " ".join(["the engine batches requests by a token budget and runs each batch as one forward"] * 17)
SHAPES = {"1 short": [SHORT], "1 long": [LONG], "32 short": [SHORT] * 32, "32 long": [LONG] * 32}
REPEATS = 6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, texts: list[str]) -> float:
    """Seconds one /v1/embeddings request took; raises on a non-200 answer."""
    body = json.dumps({"input": texts, "model": "x"}).encode()
    req = urllib.request.Request(url + "/v1/embeddings", body, {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=300) as r:
        r.read()
        if r.status != 200:
            raise RuntimeError(f"/v1/embeddings answered {r.status}")
    return time.perf_counter() - t0


def one_run(args) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "ftbert.cli", "serve", args.model, "--device", args.device, "--dtype", args.dtype,
            "--workers", str(args.workers), "--port", str(port), "--log-level", "warning"]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() - t0 > args.timeout:
                raise RuntimeError(f"no /health 200 within {args.timeout} s")
            time.sleep(0.05)
        ready_s = time.monotonic() - t0
        shapes = {}
        for name, texts in SHAPES.items():
            times = [post(url, texts) * 1e3 for _ in range(REPEATS)]
            shapes[name] = {"first_ms": times[0], "rest_median_ms": statistics.median(times[1:])}
        return {"ready_s": ready_s, "shapes": shapes}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="float16")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if not os.path.isdir(args.model):
        p.error(f"{args.model} is not a checkpoint directory")
    runs = [one_run(args) for _ in range(args.runs)]
    name = os.path.basename(os.path.normpath(args.model))
    print(f"{name} {args.device} {args.dtype} --workers {args.workers}: ready after "
          + ", ".join(f"{r['ready_s']:.2f}" for r in runs) + " s")
    for shape in SHAPES:
        firsts = ", ".join(f"{r['shapes'][shape]['first_ms']:.1f}" for r in runs)
        rests = ", ".join(f"{r['shapes'][shape]['rest_median_ms']:.1f}" for r in runs)
        print(f"  {shape:9s} first request {firsts} ms; median of the next {REPEATS - 1}: {rests} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "options": vars(args), "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
