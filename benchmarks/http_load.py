"""Closed-loop HTTP/1.1 keep-alive load generator, stdlib only.

    python benchmarks/http_load.py --url http://127.0.0.1:8000/v1/embeddings \
        --procs 2 --concurrency 64 --warmup 2 --duration 10 [--body JSON | --body-file F] \
        [--check-first] [--json out.json]

Each of `--procs` processes holds its share of `--concurrency` connections on one `selectors`
loop of non-blocking sockets; each connection keeps one request outstanding: it sends the same
prebuilt request bytes, reads the response (Content-Length, chunked, or up to the close), records
the latency and sends again. requests/s and the latency percentiles are of the 2xx responses
answered inside the measured window; other statuses are counted by code. A connection that drops
is reopened and counted; a request unanswered after `--timeout` counts as lost.

Why selectors rather than asyncio Protocols: measured against the same server, the same client as
an asyncio Protocol did less than half the requests per CPU-second. Its transports read with a
recv() size above glibc's mmap threshold, so every read maps and unmaps memory; with that private
size patched down it matched this loop. Here the read size is ours to choose (RECV).
"""

from __future__ import annotations

import argparse
import errno
import http.client
import json
import multiprocessing as mp
import selectors
import socket
import sys
import time
from array import array
from collections import Counter
from urllib.parse import urlsplit

DEFAULT_BODY = '{"input": "The quick brown fox jumps over the lazy dog.", "model": "x"}'
RECV = 65536  # below malloc's mmap threshold: see the docstring
_TICK_NS = 100_000_000  # how often failed connects are retried and timeouts looked for


class Conn:
    __slots__ = ("sock", "buf", "t0", "busy", "out", "end", "chunk", "close", "status")

    def __init__(self):
        self.sock, self.busy = None, False


def _chunked_end(buf: bytes, pos: int) -> tuple[int, int]:
    """(where the chunked body that goes on at chunk line `pos` ends, or -1; where to resume)."""
    while True:
        e = buf.find(b"\r\n", pos)
        if e < 0:
            return -1, pos
        size = int(buf[pos:e].split(b";", 1)[0], 16)  # a ValueError is the caller's protocol error
        if size == 0:  # trailer lines, if any, then an empty line
            t = buf.find(b"\r\n\r\n", e)
            return (t + 4 if t >= 0 else -1), pos
        if len(buf) < e + 4 + size:
            return -1, pos
        pos = e + 4 + size


def _worker(host, port, request, n_conns, warmup_s, duration_s, timeout_s, barrier=None, pipe=None):
    sel = selectors.DefaultSelector()
    conns = [Conn() for _ in range(n_conns)]
    lat = array("q")
    window, total, errs = Counter(), Counter(), Counter()
    family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    now_ns = time.perf_counter_ns

    def open_(c):
        s = c.sock = socket.socket(family, socket.SOCK_STREAM)
        s.setblocking(False)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        c.out, c.busy = None, False  # out None: connecting
        if s.connect_ex(addr) in (0, errno.EINPROGRESS):
            sel.register(s, selectors.EVENT_WRITE, c)
        else:
            failed_connect(c)

    def failed_connect(c):  # tried again at the next tick
        c.sock.close()
        c.sock = None
        errs["connect"] += 1

    def drop(c, kind):
        if c.busy or kind != "closed":  # a close between two requests is no error
            errs[kind] += 1
        total["lost"] += int(c.busy)
        total["reconnects"] += 1
        sel.unregister(c.sock)
        c.sock.close()
        c.sock, c.busy = None, False
        if not stopping:
            open_(c)

    def send(c, now):
        c.t0, c.busy, c.buf, c.end = now, True, b"", -1
        total["sent"] += 1
        try:
            n = c.sock.send(request)
        except OSError:
            return drop(c, "send")
        if n < len(request):  # the kernel took part of it: the rest once writable
            c.out = request[n:]
            sel.modify(c.sock, selectors.EVENT_WRITE, c)

    def answered(c, now):
        total["responses"] += 1
        c.busy = False
        ok = 200 <= c.status < 300
        if not ok:
            total[c.status] += 1
        if t_meas <= now <= t_end:
            if ok:
                lat.append(now - c.t0)
            else:
                window[c.status] += 1
        if c.close:
            drop(c, "closed")
        elif now < t_end:
            send(c, now)

    def on_write(c, s):
        if c.out is None:  # the connect finished, or failed
            if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                sel.unregister(s)
                return failed_connect(c)
            c.out = b""
            sel.modify(s, selectors.EVENT_READ, c)
            if (now := now_ns()) < t_end:
                send(c, now)
            return
        try:
            c.out = c.out[s.send(c.out):]
        except OSError:
            return drop(c, "send")
        if not c.out:
            sel.modify(s, selectors.EVENT_READ, c)

    def on_read(c, s):
        try:
            data = s.recv(RECV)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return drop(c, "reset")
        if not data:
            if c.busy and c.end == -2:  # a body that runs to the close is complete
                return answered(c, now_ns())
            return drop(c, "closed")
        if not c.busy:  # bytes nobody asked for
            return drop(c, "protocol")
        buf = c.buf + data if c.buf else data
        try:
            while c.end == -1:  # headers; loops past interim 1xx responses
                h = buf.find(b"\r\n\r\n")
                if h < 0:
                    break
                c.status = status = int(buf[9:12])
                head = buf[:h].lower()
                if 100 <= status < 200:
                    buf = buf[h + 4:]
                    continue
                c.close = b"\r\nconnection: close" in head or (
                    buf[5:8] == b"1.0" and b"\r\nconnection: keep-alive" not in head)
                i = head.find(b"\r\ncontent-length:")
                if i >= 0:
                    c.end = h + 4 + int(head[i + 17:].split(b"\r\n", 1)[0])
                elif status in (204, 304):
                    c.end = h + 4
                elif b"\r\ntransfer-encoding:" in head and b"chunked" in head:
                    c.end, c.chunk = -3, h + 4
                else:
                    c.end, c.close = -2, True
            if c.end == -3:
                end, c.chunk = _chunked_end(buf, c.chunk)
                if end >= 0:
                    c.end = end
            if c.end >= 0 and len(buf) >= c.end:
                if len(buf) > c.end:  # one request outstanding: nothing may follow the body
                    raise ValueError("bytes after the response")
                return answered(c, now_ns())
        except ValueError:
            return drop(c, "protocol")
        c.buf = buf

    if barrier is not None:  # the processes start their clocks together
        barrier.wait(timeout=60)
    stopping = False
    t_start = now_ns()
    t_meas = t_start + int(warmup_s * 1e9)
    t_end = t_meas + int(duration_s * 1e9)
    cpu0 = time.process_time()
    for c in conns:
        open_(c)
    tick = t_start + _TICK_NS
    while True:
        for key, mask in sel.select(0.05):
            c = key.data
            if c.sock is key.fileobj:  # not closed earlier in this batch
                (on_write if mask & selectors.EVENT_WRITE else on_read)(c, c.sock)
        now = now_ns()
        if now >= tick:
            tick = now + _TICK_NS
            for c in conns:
                if c.sock is None and not stopping:
                    open_(c)
                elif c.busy and now - c.t0 > timeout_s * 1e9:
                    drop(c, "timeout")
        if now >= t_end:
            stopping = True  # no new requests nor connections; wait for those in flight
            if not any(c.busy for c in conns):
                break
    for c in conns:
        if c.sock is not None:
            c.sock.close()
    out = {"lat": lat.tobytes(), "window": window, "total": total, "errors": errs,
           "cpu_s": time.process_time() - cpu0}
    if pipe is None:
        return out
    pipe.send(out)
    pipe.close()


def parse_target(url: str, body: str) -> tuple[str, int, str, bytes]:
    """(host, port, path, the whole request) or a ValueError naming what is wrong."""
    u = urlsplit(url)
    if u.scheme != "http" or not u.hostname:
        raise ValueError(f"--url {url!r}: expected http://host[:port]/path (plain HTTP, no TLS)")
    try:
        port = u.port or 80
    except ValueError:
        raise ValueError(f"--url {url!r}: the port is not a number from 0 to 65535") from None
    try:
        json.loads(body)
    except json.JSONDecodeError as e:
        raise ValueError(f"the request body is not valid JSON: {e}") from None
    path, payload = (u.path or "/") + (f"?{u.query}" if u.query else ""), body.encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n")
    return u.hostname, port, path, head.encode() + payload


def check_first(url: str, body: str = DEFAULT_BODY, send: bool = True, timeout: float = 10.0):
    """Connect, or a ConnectionError naming the address; then, with `send`, one request through
    http.client: (status, the first 200 bytes of the body)."""
    host, port, path, _ = parse_target(url, body)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.connect()
    except OSError as e:
        raise ConnectionError(f"cannot connect to {host}:{port}: {e.strerror or e}") from None
    try:
        if send:
            conn.request("POST", path, body.encode(), {"Content-Type": "application/json"})
            r = conn.getresponse()
            return r.status, r.read(200)
    except (OSError, http.client.HTTPException) as e:
        raise ConnectionError(f"{host}:{port} gave no HTTP response to the first request: {e!r}") from None
    finally:
        conn.close()


def _pct(v, q: float) -> float:
    return v[min(len(v) - 1, round((len(v) - 1) * q / 100))] / 1e6 if v else float("nan")


def run(url: str, body: str = DEFAULT_BODY, concurrency: int = 64, procs: int = 1, warmup: float = 1.0,
        duration: float = 5.0, timeout: float = 30.0) -> dict:
    host, port, _, request = parse_target(url, body)
    check_first(url, body, send=False)  # refused at the start is an error, not a count
    procs = max(1, min(procs, concurrency))
    shares = [concurrency // procs + (i < concurrency % procs) for i in range(procs)]
    if procs == 1:
        parts = [_worker(host, port, request, concurrency, warmup, duration, timeout)]
    else:  # spawn: a forked child would inherit the caller's threads and locks
        ctx = mp.get_context("spawn")
        barrier, pipes = ctx.Barrier(procs), [ctx.Pipe(duplex=False) for _ in shares]
        children = [ctx.Process(target=_worker, daemon=True,
                                args=(host, port, request, n, warmup, duration, timeout, barrier, w))
                    for n, (_, w) in zip(shares, pipes)]
        for ch in children:
            ch.start()
        parts = []
        for (r, w), ch in zip(pipes, children):
            w.close()
            try:
                parts.append(r.recv())  # before join: a child blocks sending a large result
            except EOFError:
                raise RuntimeError(f"a client process died (exit code {ch.join() or ch.exitcode})") from None
        for ch in children:
            ch.join()
    lat = sorted(x for p in parts for x in array("q", p["lat"]))
    window, total, errors = (sum((p[k] for p in parts), Counter()) for k in ("window", "total", "errors"))
    return {"url": url, "procs": procs, "concurrency": concurrency, "warmup_s": warmup, "duration_s": duration,
            "requests": len(lat), "req_per_s": len(lat) / duration,
            "p50_ms": _pct(lat, 50), "p90_ms": _pct(lat, 90), "p99_ms": _pct(lat, 99), "max_ms": _pct(lat, 100),
            "non_2xx": {str(k): v for k, v in sorted(window.items())},
            "conn_errors": sum(errors.values()), "errors_by_kind": dict(errors),
            "total": {str(k): v for k, v in total.items()},
            "client_cpu_s": [round(p["cpu_s"], 3) for p in parts]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000/v1/embeddings")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--body", default=DEFAULT_BODY, help="request body, JSON (default: one short text)")
    g.add_argument("--body-file", help="read the JSON body from this file")
    p.add_argument("--procs", type=int, default=1, help="client processes (default %(default)s)")
    p.add_argument("--concurrency", type=int, default=64, help="connections in all (default %(default)s)")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds not counted (default %(default)s)")
    p.add_argument("--duration", type=float, default=5.0, help="seconds measured (default %(default)s)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds before a request counts as lost")
    p.add_argument("--check-first", action="store_true", help="send one request and show its answer first")
    p.add_argument("--json", help="write the results to this file")
    a = p.parse_args(argv)
    if a.procs < 1 or a.concurrency < 1 or a.duration <= 0 or a.warmup < 0 or a.timeout <= 0:
        p.error("--procs and --concurrency must be at least 1, --duration and --timeout above 0, "
                "--warmup not negative")
    try:
        if a.body_file:
            with open(a.body_file) as f:
                a.body = f.read()
        if a.check_first:
            status, start = check_first(a.url, a.body)
            print(f"check-first: HTTP {status}, body starts {start!r}", flush=True)
        r = run(a.url, a.body, a.concurrency, a.procs, a.warmup, a.duration, a.timeout)
    except (OSError, ValueError, RuntimeError) as e:  # ConnectionError is an OSError
        print(f"http_load: error: {e}", file=sys.stderr)
        return 2
    if a.json:
        with open(a.json, "w") as f:  # no 2xx: null percentiles rather than NaN, which JSON lacks
            json.dump({k: None if v != v else v for k, v in r.items()}, f, indent=1)
    print(f"2xx: {r['requests']:,} in {r['duration_s']:g} s, latency ms p50 {r['p50_ms']:.3f} p90 "
          f"{r['p90_ms']:.3f} p99 {r['p99_ms']:.3f} max {r['max_ms']:.3f}; non-2xx by status "
          f"{r['non_2xx']}; connection errors {r['errors_by_kind']}; client CPU s {r['client_cpu_s']}")
    print(f"{r['req_per_s']:,.0f} req/s  p50 {r['p50_ms']:.2f} ms  p99 {r['p99_ms']:.2f} ms  "
          f"non-2xx {sum(r['non_2xx'].values())}  conn errors {r['conn_errors']}  "
          f"({r['procs']} procs, {r['concurrency']} conns)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
