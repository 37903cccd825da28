"""CPU time per job of `ftbert serve --workers N`'s engine process alone, driven over its socket
with no HTTP front in the way (Linux: reads /proc).

  python benchmarks/engine_cpu.py MODEL [--device cpu] [--dtype float32] [--in-flight 256]
                                  [--connections 4] [--seconds 6] [--warmup 2] [--rounds 3]
                                  [--words 9] [--json F]

The engine starts as the server starts it (EngineSupervisor: its own process, its own socket).
`--connections` client sockets, each a front's, keep `--in-flight` jobs between them outstanding:
one text of `--words` words per job, tokenized here once as a front would (JobTokenizer), its job
frame prebuilt and sent again under a new id as each reply comes back, the frames of a read's
replies sent in one write (as a front's event loop writes a turn's frames). Over the measured
window: jobs answered per second and the engine's CPU seconds (user + system, all its threads)
per job, of which its event loop's (the main thread, which serves every front alone), and each job's round trip as the client sees it (frame sent to reply read: p50, p99 and
the longest). With --device cpu the model's forward is part of that CPU; on a GPU it is the engine's
own Python (frames, the batcher, pooling's launches, replies). Medians over --rounds, each round
on a fresh engine.
"""

import argparse
import json
import os
import socket
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_cpu import TICK, cpu_seconds  # noqa: E402  (CPU seconds of processes, from /proc)

_HEADER = struct.Struct(">I")
WORDS = ("the quick brown fox jumps over a lazy dog while people watch from the river bank and talk about "
         "their work in the city where old buildings stand next to new towers of glass and steel").split()


def loop_cpu_seconds(pid: int) -> float:
    """CPU seconds of the process's main thread: the engine's event loop (frames in and out, the
    jobs' futures), which serves every front alone; on a GPU the forward thread mostly waits."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


class Client:
    """One front's connection: frames out, complete frames counted back."""

    def __init__(self, path: str, job_frame):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self._job_frame = job_frame
        self._buf = bytearray()
        self.next_id = 0
        self.sent: dict[int, float] = {}  # job id -> when its frame left
        self.latencies: list[float] = []  # round trips of the jobs answered while `measuring`
        self.measuring = False

    def send_jobs(self, n: int) -> None:
        frames = []
        for _ in range(n):
            self.next_id += 1
            frames.append(self._job_frame(self.next_id))
        now = time.perf_counter()
        for key in range(self.next_id - n + 1, self.next_id + 1):
            self.sent[key] = now
        self.sock.sendall(b"".join(frames))

    def read_replies(self) -> int:
        """Reads what has arrived; returns the job replies in it (frames of other ops skipped)."""
        data = self.sock.recv(1 << 20)
        if not data:
            raise RuntimeError("the engine closed the connection")
        from ftbert.serving.engine import decode

        now = time.perf_counter()
        buf = self._buf
        buf += data
        at, replies = 0, 0
        while len(buf) - at >= 4:
            (size,) = _HEADER.unpack_from(buf, at)
            if len(buf) - at - 4 < size:
                break
            body = bytes(buf[at + 4:at + 4 + size])
            # Job replies carry "values" or "error"; the connection's first frame (the engine's
            # info, id 0) and flush requests are not replies.
            if b'"values"' in body[:200] or b'"error"' in body[:200]:
                replies += 1
                if b'"error"' in body[:200]:
                    raise RuntimeError(f"a job failed: {body[:300]!r}")
                t_sent = self.sent.pop(decode(body)["id"])
                if self.measuring:
                    self.latencies.append(now - t_sent)
            at += 4 + size
        del buf[:at]
        return replies


def one_round(args, settings, tokenized_rows) -> dict:
    import selectors

    from ftbert.serving.engine import EngineSupervisor, frame

    job_args = {"kind": "embed", "how": "text", "inputs": [args.text], "normalize": True, "truncate": None,
                "truncation_side": "right", "long_texts": None, "top_k": None, "attended": None}

    def job_frame(key: int) -> bytes:
        return b"".join(frame({"op": "job", "id": key, "tokenized": tokenized_rows, "job": job_args}))

    with tempfile.TemporaryDirectory(prefix="ftbert-engine-cpu-") as folder:
        engine = EngineSupervisor(settings, os.path.join(folder, "engine.sock"))
        engine.start()
        try:
            pid = engine.process.pid
            clients = [Client(engine.socket_path, job_frame) for _ in range(args.connections)]
            sel = selectors.DefaultSelector()
            for c in clients:
                sel.register(c.sock, selectors.EVENT_READ, c)
            share = [args.in_flight // len(clients) + (i < args.in_flight % len(clients)) for i in range(len(clients))]
            for c, n in zip(clients, share):
                c.send_jobs(n)
            t_end_warm = time.perf_counter() + args.warmup
            t_stop = t_end_warm + args.seconds
            answered, measuring, cpu0, t0 = 0, False, 0.0, 0.0
            while True:
                now = time.perf_counter()
                if not measuring and now >= t_end_warm:
                    measuring, answered, t0 = True, 0, now
                    cpu0, loop0 = cpu_seconds([pid]), loop_cpu_seconds(pid)
                    for c in clients:
                        c.measuring = True
                if measuring and now >= t_stop:
                    break
                for key, _ in sel.select(timeout=1.0):
                    c = key.data
                    n = c.read_replies()
                    answered += n
                    if n:
                        c.send_jobs(n)
            cpu1, loop1, t1 = cpu_seconds([pid]), loop_cpu_seconds(pid), time.perf_counter()
            sel.close()
            for c in clients:
                c.sock.close()
        finally:
            engine.stop(timeout=30)
    lat = sorted(x for c in clients for x in c.latencies)
    pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1e3 if lat else float("nan")  # noqa: E731
    return {"jobs_per_s": answered / (t1 - t0), "engine_us_per_job": (cpu1 - cpu0) / max(answered, 1) * 1e6,
            "engine_cores": (cpu1 - cpu0) / (t1 - t0),
            "loop_us_per_job": (loop1 - loop0) / max(answered, 1) * 1e6, "p50_ms": pct(0.5), "p99_ms": pct(0.99),
            "max_ms": lat[-1] * 1e3 if lat else float("nan")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--in-flight", type=int, default=256)
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--words", type=int, default=9)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if args.in_flight < 1 or args.connections < 1 or args.in_flight < args.connections or args.rounds < 1 \
            or args.seconds <= 0 or args.warmup < 0 or args.words < 1:
        ap.error("--in-flight >= --connections >= 1, --rounds and --words at least 1, --seconds above 0, "
                 "--warmup not negative")
    from ftbert.serving.batcher import Job
    from ftbert.serving.service import Service
    from ftbert.serving.settings import ServeSettings

    settings = ServeSettings(model=args.model, devices=(args.device,), dtype=args.dtype)
    args.text = " ".join(WORDS[i % len(WORDS)] for i in range(args.words))
    # The rows a front would send: tokenized once here by the batcher's own rules.
    service = Service.load(ServeSettings(model=args.model, devices=("cpu",), dtype="float32"))
    try:
        rows = service.batcher.tokenizer.tokenize(Job("embed", "text", [args.text]))
    finally:
        service.close()
    tokens = sum(len(r[1]) for r in rows)
    results = []
    for r in range(args.rounds):
        res = one_round(args, settings, rows)
        results.append(res)
        print(f"round {r + 1}: {res['jobs_per_s']:,.0f} jobs/s; engine {res['engine_us_per_job']:.0f} us/job "
              f"({res['engine_cores'] * 100:.0f}% of a core; its event loop {res['loop_us_per_job']:.0f}); round trip p50 {res['p50_ms']:.2f} ms, "
              f"p99 {res['p99_ms']:.2f}, max {res['max_ms']:.1f}", flush=True)
    med = {k: statistics.median(x[k] for x in results) for k in results[0]}
    print(f"median: {med['jobs_per_s']:,.0f} jobs/s; engine {med['engine_us_per_job']:.0f} us/job "
          f"(event loop {med['loop_us_per_job']:.0f}); "
          f"round trip p50 {med['p50_ms']:.2f} ms, p99 {med['p99_ms']:.2f}, max {med['max_ms']:.1f} "
          f"({tokens} tokens a job, {args.in_flight} in flight over {args.connections} connections, "
          f"{args.device} {args.dtype})")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": {k: v for k, v in vars(args).items()}, "tokens": tokens,
                                               "rounds": results, "median": med}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
