"""CPU time per request of `ftbert serve --workers N`: the engine process and the front processes
apart, under a closed-loop load (Linux: reads /proc).

  python benchmarks/serve_cpu.py MODEL [--workers 2] [--device cpu] [--connections 32]
                                 [--seconds 8] [--warmup 2] [--rounds 3] [--body-file F] [--json F]

Per round: the server starts on a free port and answers /health; `http_load.run` (one client
process, --connections keep-alive connections, the body of --body-file or one short sentence)
loads /v1/embeddings for --warmup then --seconds; over the measured window the CPU seconds of the
engine and of the fronts (user + system, /proc/PID/stat) are divided by the requests answered
there. The engine is the server's child without FTBERT_SERVE_FRONT in its environment (the main
process sets it before it starts the fronts). Medians over --rounds, each round on a fresh server.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import http_load  # noqa: E402

from ftbert.serving.engine import FRONT_ENV  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICK


def roles(server: int) -> tuple[int, list[int]]:
    """(the engine's pid, the fronts' pids) among the server's children."""
    engine, fronts = None, []
    for pid in children(server):
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"resource_tracker" in cmdline:
            continue
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if any(e.startswith(FRONT_ENV.encode() + b"=") for e in environ):
            fronts.append(pid)
        else:
            engine = pid
    if engine is None or not fronts:
        raise RuntimeError(f"server {server}: no engine and fronts among its children {children(server)}")
    return engine, fronts


def one_round(args, body: str) -> dict:
    port = free_port()
    cmd = [sys.executable, "-m", "ftbert", "serve", args.model, "--port", str(port), "--workers", str(args.workers),
           "--device", args.device, "--log-level", "warning", "--model-name", "m"]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"the server exited ({server.returncode}): {server.stderr.read()[-2000:]!r}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not answer /health within 300 s")
            time.sleep(0.3)
        engine, fronts = roles(server.pid)
        marks = {}

        def sample():  # the CPU counters at the measured window's two ends
            time.sleep(args.warmup)
            marks["start"] = (cpu_seconds([engine]), cpu_seconds(fronts))
            time.sleep(args.seconds)
            marks["end"] = (cpu_seconds([engine]), cpu_seconds(fronts))

        sampler = threading.Thread(target=sample)
        sampler.start()
        load = http_load.run(f"http://127.0.0.1:{port}/v1/embeddings", body, args.connections, 1, args.warmup,
                             args.seconds)
        sampler.join()
        n = load["requests"]
        if n == 0 or load["non_2xx"]:
            raise RuntimeError(f"the load got {n} answers and non-2xx {load['non_2xx']}")
        engine_s = marks["end"][0] - marks["start"][0]
        fronts_s = marks["end"][1] - marks["start"][1]
        return {"req_per_s": load["req_per_s"], "engine_us": engine_s / n * 1e6, "fronts_us": fronts_s / n * 1e6,
                "engine_cpu": engine_s / args.seconds, "fronts_cpu": fronts_s / args.seconds}
    finally:
        server.terminate()
        server.wait(60)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--body-file")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if args.workers < 1 or args.rounds < 1 or args.seconds <= 0 or args.warmup < 0:
        ap.error("--workers and --rounds must be at least 1, --seconds above 0, --warmup not negative")
    body = Path(args.body_file).read_text() if args.body_file else http_load.DEFAULT_BODY
    rows = []
    for i in range(args.rounds):
        r = one_round(args, body)
        rows.append(r)
        print(f"round {i + 1}: {r['req_per_s']:,.0f} req/s; engine {r['engine_us']:.0f} us/request "
              f"({r['engine_cpu']:.0%} of a core); fronts {r['fronts_us']:.0f} us/request "
              f"({r['fronts_cpu']:.0%})", flush=True)
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    print(f"median: {med['req_per_s']:,.0f} req/s; engine {med['engine_us']:.0f} us/request; "
          f"fronts {med['fronts_us']:.0f} us/request")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rounds": rows, "median": med}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
