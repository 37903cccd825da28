"""`ftbert bench-serve`: requests/s and latency of `ftbert serve` next to a plain FastAPI +
sentence-transformers server (`ftbert.bench.serve_peer`) doing the same work.

    ftbert bench-serve                                   # bundled all-MiniLM-L6-v2, CPU, small run
    ftbert bench-serve --device cuda --dtype float16 --concurrency 1,16,64 --duration 20
    ftbert bench-serve --device cuda --devices cuda:0,cuda:1 ...   # ftbert on two GPUs
    ftbert bench-serve --device cuda --dtype float16 --serve-args "--workers 8" \
        --engines ftbert,sentence-transformers,noop   # 8 front processes; the no-op ceiling too

Both servers run in subprocesses on the loopback address, each started, checked and measured
alone (one at a time, so they never compete for the device or the cores). A request embeds one
text: "short" ~16 tokens, "long" ~256 tokens or "ragged" 16-256 (each text's length drawn from the
range, as `A-B` does for any range; texts of words from a fixed list, each request a different
text; the token counts are the model tokenizer's, with its special tokens). For each
(length, concurrency) the clients -- `--client-procs` processes of asyncio + httpx, `concurrency`
connections in all, each sending its next request when the last is answered -- warm up, then run
for `--duration` seconds; requests/s is the requests answered within that time, latencies are
theirs as the client sees them (sent to answered). `--client wrk` runs the C load generator wrk
instead (`--client-procs` threads, whole seconds; a Lua script cycles through the same request
bodies), for rates past what Python clients on the same cores can send. Before timing, both servers' embeddings of the same texts are
compared (cosine), so the two do the same work. The engine "noop" (`ftbert.bench.serve_noop`, in
`--noop-workers` processes) answers a constant vector with no model: the ceiling of the client and
the HTTP stack, measured in the same run.

Writes OUT/NAME.json (options, environment, both servers' /info, every row), OUT/NAME.png
(requests/s against concurrency) and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import json
import math
import multiprocessing as mp
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

WORDS = (
    "the quick brown fox jumps over a lazy dog while people watch from the river bank and talk about "
    "their work in the city where old buildings stand next to new towers of glass and steel many years "
    "after the war the market opened again with fresh bread fish fruit and flowers every morning before "
    "sunrise children walk to school through narrow streets full of music light and the smell of coffee"
).split()
LENGTHS = {"short": 16, "long": 256, "ragged": (16, 256)}


def _texts(tok, target: int | tuple[int, int], n: int, seed: int) -> list[str]:
    """n different texts of about `target` tokens each (with the tokenizer's special tokens); for a
    (low, high) target, each text's own target drawn uniformly from that range (ragged traffic)."""
    import random

    r = random.Random(seed)
    # Each word's own token count guesses where a text reaches its target; the whole text is
    # tokenized only from there on (once or twice a text, not once a word: 512 texts of 256
    # tokens took a minute the other way).
    pieces = {w: len(tok(w, add_special_tokens=False)["input_ids"]) for w in WORDS}
    specials = len(tok("")["input_ids"])
    out = []
    for _ in range(n):
        want = r.randint(*target) if isinstance(target, tuple) else target
        words, guess = [], specials
        while True:
            words.append(r.choice(WORDS))
            guess += pieces[words[-1]]
            if guess >= want and len(tok(" ".join(words))["input_ids"]) >= want:
                break
        out.append(" ".join(words))
    return out


def parse_length(name: str) -> int | tuple[int, int]:
    """A --lengths entry: a named length, N tokens, or A-B (each text's length drawn from A..B)."""
    if name in LENGTHS:
        return LENGTHS[name]
    low, dash, high = name.partition("-")
    try:
        value = (int(low), int(high)) if dash else int(name)
    except ValueError:
        value = None
    ok = (isinstance(value, int) and value >= 1) or (isinstance(value, tuple) and 1 <= value[0] <= value[1])
    if not ok:
        raise ValueError(f"--lengths: {name!r} is not a length; use {', '.join(LENGTHS)}, a number of tokens "
                         "(e.g. 64) or a range A-B (e.g. 16-256)")
    return value


def _describe(target: int | tuple[int, int]) -> str:
    return f"{target[0]}-{target[1]} tokens" if isinstance(target, tuple) else f"~{target} tokens"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Server:
    """A server subprocess; waits for /health (ready_s: from starting the process to the first
    200, polled every 50 ms), stops with SIGTERM."""

    def __init__(self, name: str, argv: list[str], port: int, log: Path):
        self.name, self.argv, self.port = name, argv, port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log

    def __enter__(self):
        import httpx

        self.log = open(self.log_path, "w")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT, env=os.environ.copy())
        deadline = time.monotonic() + 600
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} server exited with {self.proc.returncode}; see {self.log_path}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} server did not start in 600 s; see {self.log_path}")
            time.sleep(0.05)
        self.ready_s = time.monotonic() - t0
        self.info = httpx.get(self.url + "/info", timeout=30).json()
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


# ---- the load generator ------------------------------------------------------------------------
async def _load(url: str, texts: list[str], connections: int, warmup_s: float, duration_s: float, offset: int):
    import httpx

    t_start = time.perf_counter()
    t_measure, t_end = t_start + warmup_s, t_start + warmup_s + duration_s
    latencies: list[float] = []
    errors = [0]

    async def conn(c: int):
        async with httpx.AsyncClient(base_url=url, timeout=300,
                                     limits=httpx.Limits(max_connections=1)) as client:
            k = offset + c
            while True:
                t0 = time.perf_counter()
                if t0 >= t_end:
                    return
                body = {"input": texts[k % len(texts)], "model": "bench", "encoding_format": "float"}
                k += connections
                try:
                    r = await client.post("/v1/embeddings", json=body)
                    ok = r.status_code == 200
                except httpx.HTTPError:
                    ok = False
                t1 = time.perf_counter()
                # Counted by when it was answered: requests/s is answers within the window
                # (latencies longer than the warm-up would otherwise leave nothing to count).
                if t_measure <= t1 <= t_end:
                    if ok:
                        latencies.append(t1 - t0)
                    else:
                        errors[0] += 1

    await asyncio.gather(*(conn(c) for c in range(connections)))
    return latencies, errors[0]


def _client_proc(args):
    url, texts, connections, warmup_s, duration_s, offset = args
    return asyncio.run(_load(url, texts, connections, warmup_s, duration_s, offset))


def measure(url: str, texts: list[str], concurrency: int, procs: int, warmup_s: float, duration_s: float) -> dict:
    procs = max(1, min(procs, concurrency))
    shares = [concurrency // procs + (1 if i < concurrency % procs else 0) for i in range(procs)]
    jobs = [(url, texts, n, warmup_s, duration_s, sum(shares[:i]) * 7919) for i, n in enumerate(shares)]
    if procs == 1:
        results = [_client_proc(jobs[0])]
    else:
        with mp.get_context("spawn").Pool(procs) as pool:
            results = pool.map(_client_proc, jobs)
    lat = sorted(x for r in results for x in r[0])
    errors = sum(r[1] for r in results)
    if not lat:
        return {"requests": 0, "errors": errors, "req_per_s": 0.0}
    return {
        "requests": len(lat), "errors": errors, "req_per_s": len(lat) / duration_s,
        "p50_ms": _pct(lat, 50) * 1e3, "p99_ms": _pct(lat, 99) * 1e3, "mean_ms": sum(lat) / len(lat) * 1e3,
    }


# ---- wrk as the load generator -------------------------------------------------------------------
# Each thread starts at another text and sends the next one with every request; done() prints one
# line of the run's figures (microseconds), which _wrk_figures reads.
_WRK_SCRIPT = r"""
local bodies = {
%(bodies)s
}
local headers = {["Content-Type"] = "application/json"}
local threads_made = 0

function setup(thread)
  thread:set("first", threads_made * 7919)
  threads_made = threads_made + 1
end

function init(args)
  next_body = first or 0
end

function request()
  next_body = next_body + 1
  return wrk.format("POST", "/v1/embeddings", headers, bodies[next_body %% #bodies + 1])
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("FTBERT_WRK %%d %%d %%d %%d %%.1f %%d %%d\n", summary.requests,
    summary.duration, latency:percentile(50), latency:percentile(99), latency.mean,
    e.connect + e.read + e.write + e.timeout, e.status))
end
"""


def wrk_script(texts: list[str]) -> str:
    """wrk's Lua script sending one text per request, in the Python client's request body."""
    bodies = []
    for t in texts:
        body = json.dumps({"input": t, "model": "bench", "encoding_format": "float"})
        level = 0
        while f"]{'=' * level}]" in body:  # a long bracket the body does not close
            level += 1
        bodies.append(f"  [{'=' * level}[{body}]{'=' * level}],")
    return _WRK_SCRIPT % {"bodies": "\n".join(bodies)}


def _wrk_figures(output: str) -> dict:
    """The row of a wrk run from its done() line."""
    line = next((ln for ln in output.splitlines() if ln.startswith("FTBERT_WRK ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no figures:\n{output[-2000:]}")
    answered, duration_us, p50_us, p99_us, mean_us, socket_errors, status_errors = line.split()[1:]
    ok = int(answered) - int(status_errors)
    res = {"requests": ok, "errors": int(socket_errors) + int(status_errors),
           "req_per_s": ok / (int(duration_us) / 1e6)}
    if ok > 0:
        res.update(p50_ms=int(p50_us) / 1e3, p99_ms=int(p99_us) / 1e3, mean_ms=float(mean_us) / 1e3)
    return res


def measure_wrk(wrk: str, url: str, texts: list[str], concurrency: int, threads: int, warmup_s: float,
                duration_s: float) -> dict:
    """`measure` with wrk: a warm-up run, then the timed one (wrk takes whole seconds)."""
    import tempfile

    threads = max(1, min(threads, concurrency))
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(wrk_script(texts))
    try:
        def run(seconds: float) -> str:
            cmd = [wrk, "-t", str(threads), "-c", str(concurrency), "-d", f"{max(1, round(seconds))}s",
                   "--timeout", "300s", "-s", f.name, url + "/v1/embeddings"]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=max(1, round(seconds)) + 330)
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-2000:]}")
            return done.stdout + done.stderr  # a script error shows in stderr

        if warmup_s > 0:
            run(warmup_s)
        return _wrk_figures(run(duration_s))
    finally:
        os.unlink(f.name)


def measure_encode(model: str, device: str, dtype: str, texts: list[str], warmup_s: float, duration_s: float) -> dict:
    """Sentences/s of `Encoder.encode(texts)` in this process, called over and over: warmed up (at
    least once) for `warmup_s`, then counted over whole calls for at least `duration_s`."""
    import ftbert

    enc = ftbert.Encoder.from_pretrained(model, device=device, dtype=dtype)
    t_end = time.perf_counter() + warmup_s
    while True:
        enc.encode(texts)
        if time.perf_counter() >= t_end:
            break
    calls, t0 = 0, time.perf_counter()
    while True:
        enc.encode(texts)
        calls += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= duration_s:
            break
    return {"sentences_per_s": calls * len(texts) / elapsed, "calls": calls, "texts": len(texts),
            "seconds": elapsed}


_COUNTERS = ("ftbert_batch_size_count", "ftbert_batch_size_sum", "ftbert_forward_duration_seconds_sum",
             "ftbert_queue_wait_seconds_sum")
_GRAPHS = "ftbert_cuda_graph_forwards_total{how="


def _engine_counters(url: str) -> dict[str, float] | None:
    """The batcher's running totals from ftbert's /metrics (None where it does not answer)."""
    import httpx

    try:
        text = httpx.get(url + "/metrics", timeout=30).text
    except httpx.HTTPError:
        return None
    return _read_counters(text)


def _read_counters(text: str) -> dict[str, float] | None:
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in _COUNTERS:
            out[name] = float(value)
        elif name.startswith(_GRAPHS):  # a GPU server's ftbert_cuda_graph_forwards_total{how="..."}
            out["graphs:" + name[len(_GRAPHS):].split('"')[1]] = float(value)
    return out if all(k in out for k in _COUNTERS) else None


def _batch_figures(before: dict | None, after: dict | None, seconds: float) -> dict | None:
    """What the batcher did over a row (its warm-up included): forwards per second, inputs per
    forward, a forward's mean time with its pooling, the share of the time spent in forwards (one
    forward thread per device: near 100% is a busy GPU side), a batch's oldest input's mean
    wait before its forward, and on a GPU how many forwards replayed, recorded or ran without a
    CUDA graph."""
    if before is None or after is None:
        return None
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    n = d["ftbert_batch_size_count"]
    if n <= 0:
        return None
    out = {"per_s": n / seconds, "mean_size": d["ftbert_batch_size_sum"] / n,
           "mean_forward_ms": d["ftbert_forward_duration_seconds_sum"] / n * 1e3,
           "forward_busy": d["ftbert_forward_duration_seconds_sum"] / seconds,
           "mean_wait_ms": d["ftbert_queue_wait_seconds_sum"] / n * 1e3}
    graphs = {k.partition(":")[2]: int(v) for k, v in d.items() if k.startswith("graphs:")}
    if graphs:
        out["graphs"] = graphs
    return out


def _pct(sorted_values: list[float], q: float) -> float:
    k = (len(sorted_values) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def _embeddings(url: str, texts: list[str]):
    import httpx
    import numpy as np

    r = httpx.post(url + "/v1/embeddings", json={"input": texts, "encoding_format": "float"}, timeout=300)
    r.raise_for_status()
    return np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float64)


# ---- the run -----------------------------------------------------------------------------------
def _hidden_size(model: str) -> int:
    """The checkpoint's embedding width (the no-op server answers vectors of it)."""
    config = json.loads((Path(model) / "config.json").read_text())
    return int(config.get("hidden_size") or config.get("dim") or 384)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ftbert bench-serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="checkpoint dir (default: bundled all-MiniLM-L6-v2)")
    p.add_argument("--device", default="cpu", help="the peer's device, and ftbert's unless --devices")
    p.add_argument("--devices", help="ftbert's devices, comma-separated (e.g. cuda:0,cuda:1)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--concurrency", default="1,16,64", help="comma-separated (default %(default)s)")
    p.add_argument("--lengths", default="short,long",
                   help="short (~16 tokens), long (~256), ragged (16-256, each text its own), N tokens, or A-B")
    p.add_argument("--engines", default="ftbert,sentence-transformers",
                   help="comma-separated: ftbert, sentence-transformers, noop, noop-raw (default %(default)s)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds measured per row (default %(default)s)")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of load before measuring (default %(default)s)")
    p.add_argument("--client-procs", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2)),
                   help="client processes sharing the connections (default %(default)s)")
    p.add_argument("--client", choices=["python", "wrk"], default="python",
                   help="the load generator: python (processes of asyncio + httpx) or wrk (the C tool, "
                        "--client-procs threads; durations in whole seconds) (default %(default)s)")
    p.add_argument("--wrk", default=os.environ.get("FTBERT_WRK", "wrk"),
                   help="the wrk binary for --client wrk (default $FTBERT_WRK, else wrk on PATH)")
    p.add_argument("--texts", type=int, default=512, help="distinct texts per length (default %(default)s)")
    p.add_argument("--serve-args", default="", help="extra arguments for `ftbert serve` (quoted)")
    p.add_argument("--noop-workers", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                   help="worker processes of the no-op server (engine 'noop': the ceiling of the client "
                        "and HTTP stack; default %(default)s)")
    p.add_argument("--encode", action="store_true",
                   help="also time Encoder.encode on the same texts in this process (ftbert's first device): "
                        "the sentences/s each ftbert row is a share of")
    p.add_argument("--out", default="benchmarks/results", help="output directory (default %(default)s)")
    p.add_argument("--name", help="file stem (default serve-<model>-<device>-<time>)")
    return p


def main(argv: list[str] | None = None) -> int:
    import shlex

    import numpy as np
    from rich.console import Console
    from rich.table import Table

    import ftbert

    args = _parser().parse_args(argv)
    from ftbert.serving import missing_serve_extra

    if missing_serve_extra():
        print(f"ftbert bench-serve: {missing_serve_extra()}", file=sys.stderr)
        return 2
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = set(engines) - {"ftbert", "sentence-transformers", "noop", "noop-raw"}
    if unknown:
        print(f"ftbert bench-serve: unknown engine(s) {sorted(unknown)}", file=sys.stderr)
        return 2
    if args.client == "wrk" and shutil.which(args.wrk) is None:
        print(f"ftbert bench-serve: --client wrk: no wrk binary at {args.wrk!r} (install wrk, or name it "
              "with --wrk or $FTBERT_WRK)", file=sys.stderr)
        return 2
    concurrency = [int(c) for c in args.concurrency.split(",")]
    lengths = {}
    try:
        for name in args.lengths.split(","):
            lengths[name.strip()] = parse_length(name.strip())
    except ValueError as e:
        print(f"ftbert bench-serve: {e}", file=sys.stderr)
        return 2
    model = args.model or str(ftbert.default_model_path())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = args.name or (f"serve-{Path(model).name}-{(args.devices or args.device).replace(':', '')}-"
                         f"{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}")
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model, local_files_only=True)
    pools = {name: _texts(tok, n, args.texts, seed=i) for i, (name, n) in enumerate(lengths.items())}
    token_counts = {name: float(np.mean([len(tok(t)["input_ids"]) for t in pool])) for name, pool in pools.items()}

    commands = {
        "ftbert": [sys.executable, "-m", "ftbert", "serve", model, "--devices", args.devices or args.device,
                   "--dtype", args.dtype, "--log-level", "warning", *shlex.split(args.serve_args)],
        "sentence-transformers": [sys.executable, "-m", "ftbert.bench.serve_peer", model, "--device", args.device,
                                  "--dtype", args.dtype],
        "noop": [sys.executable, "-m", "ftbert.bench.serve_noop", "--workers", str(args.noop_workers),
                 "--dim", str(_hidden_size(model))],
    }
    commands["noop-raw"] = commands["noop"] + ["--raw"]
    rows, infos, check_texts, reference = [], {}, pools[next(iter(pools))][:8], None
    checks, ready = {}, {}
    for engine in engines:
        port = _free_port()
        with _Server(engine, commands[engine] + ["--port", str(port)], port, out / f"{stem}-{engine}.log") as srv:
            infos[engine] = srv.info
            ready[engine] = srv.ready_s
            console.print(f"  {engine}: ready (/health 200) {srv.ready_s:.2f} s after its process started")
            emb = _embeddings(srv.url, check_texts)
            if engine.startswith("noop"):  # a constant vector: nothing to check
                pass
            elif reference is None:
                reference = emb
            else:
                cos = (emb * reference).sum(1) / (np.linalg.norm(emb, axis=1) * np.linalg.norm(reference, axis=1))
                checks[engine] = float(cos.min())
            for name, pool in pools.items():
                for c in concurrency:
                    before = _engine_counters(srv.url) if engine == "ftbert" else None
                    t_row = time.monotonic()
                    if args.client == "wrk":
                        res = measure_wrk(args.wrk, srv.url, pool, c, args.client_procs, args.warmup,
                                          args.duration)
                    else:
                        res = measure(srv.url, pool, c, args.client_procs, args.warmup, args.duration)
                    row = {"engine": engine, "length": name, "tokens": token_counts[name], "concurrency": c, **res}
                    if before is not None:
                        row["batches"] = _batch_figures(before, _engine_counters(srv.url), time.monotonic() - t_row)
                    rows.append(row)
                    if res["requests"] == 0:
                        console.print(f"  {engine:<22} {name:<6} c={c:<3} no request answered within the row's "
                                      f"{args.duration:g} s  errors {res['errors']}")
                    else:
                        console.print(f"  {engine:<22} {name:<6} c={c:<3} {res['req_per_s']:9.1f} req/s  "
                                      f"p50 {res.get('p50_ms', float('nan')):8.2f} ms  "
                                      f"p99 {res.get('p99_ms', float('nan')):8.2f} ms  errors {res['errors']}")
                    if row.get("batches"):
                        b = row["batches"]
                        console.print(f"  {'':<22} {'':<6} {'':<5} batches: {b['per_s']:,.0f}/s of {b['mean_size']:.1f} "
                                      f"inputs, forward {b['mean_forward_ms']:.2f} ms (busy {b['forward_busy']:.0%}), "
                                      f"oldest input's wait {b['mean_wait_ms']:.2f} ms")
                        if b.get("graphs"):
                            g = b["graphs"]
                            console.print(f"  {'':<22} {'':<6} {'':<5} CUDA graphs: {g.get('replayed', 0):,} replayed, "
                                          f"{g.get('recorded', 0):,} recorded, {g.get('op_by_op', 0):,} op by op")

    encode = {}
    if args.encode:
        device = (args.devices or args.device).split(",")[0].strip()
        for name, pool in pools.items():
            encode[name] = measure_encode(model, device, args.dtype, pool, args.warmup, args.duration)
            console.print(f"  Encoder.encode {name:<6} ({device} {args.dtype}, in process) "
                          f"{encode[name]['sentences_per_s']:11,.1f} sentences/s")

    peer = {(r["length"], r["concurrency"]): r["req_per_s"] for r in rows if r["engine"] == "sentence-transformers"}
    for r in rows:
        base = peer.get((r["length"], r["concurrency"]))
        r["vs_peer"] = r["req_per_s"] / base if base else None
        if r["engine"] == "ftbert" and r["length"] in encode:
            r["vs_encode"] = r["req_per_s"] / encode[r["length"]]["sentences_per_s"]

    label = infos.get("ftbert", {}).get("model") or Path(model).name
    t = Table(title=f"{label}  {args.devices or args.device}  {args.dtype}: one text per request",
              title_justify="left", header_style="bold")
    cols = ["length", "tokens", "concurrency", "engine", "req/s", "p50 ms", "p99 ms", "errors", "× peer"]
    for col in cols + (["÷ encode"] if encode else []):
        t.add_column(col, justify="left" if col in ("length", "engine") else "right")
    for r in sorted(rows, key=lambda r: (list(lengths).index(r["length"]), r["concurrency"], engines.index(r["engine"]))):
        t.add_row(r["length"], f"{r['tokens']:.0f}", str(r["concurrency"]), r["engine"], f"{r['req_per_s']:,.1f}" if r["requests"] else f"none in {args.duration:g} s",
                  f"{r.get('p50_ms', float('nan')):.2f}", f"{r.get('p99_ms', float('nan')):.2f}", str(r["errors"]),
                  "-" if r["vs_peer"] is None else f"{r['vs_peer']:.2f}×",
                  *([f"{r['vs_encode']:.0%}" if "vs_encode" in r else "-"] if encode else []))
    console.print(t)
    if checks:
        console.print("embedding cosine against ftbert's (min over the check texts): " +
                      ", ".join(f"{k} {v:.6f}" for k, v in checks.items()))

    meta = {
        "ftbert_bench_serve_version": 1,
        "created": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "options": vars(args), "model": model, "servers": infos, "ready_s": ready, "check_cosine_min": checks,
        "encode": encode,
        "environment": {"ftbert": ftbert.__version__, "python": platform.python_version(),
                        "cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count()},
        "results": rows,
    }
    (out / f"{stem}.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    _plot(out / f"{stem}.png", rows, lengths, engines, t.title)
    console.print(f"wrote {out / (stem + '.json')} and {out / (stem + '.png')}")
    return 0


def _plot(path: Path, rows: list[dict], lengths: dict, engines: list[str], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, axes = plt.subplots(1, len(lengths), figsize=(4.5 * len(lengths), 3.6), squeeze=False, layout="constrained")
    for ax, name in zip(axes[0], lengths):
        for e in engines:
            pts = sorted((r["concurrency"], r["req_per_s"]) for r in rows if r["engine"] == e and r["length"] == name)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=e)
        ax.set_title(f"{name} ({_describe(lengths[name])})", fontsize=9)
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel("requests/s")
        ax.set_xscale("log", base=2)
        levels = sorted({r["concurrency"] for r in rows if r["length"] == name})
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.minorticks_off()
        ax.set_ylim(bottom=0)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)
