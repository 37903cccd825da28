"""The ceiling rows of `ftbert bench-serve`: servers that answer /v1/embeddings with a constant unit
vector per input, no model at all, in the same request and response shape as ftbert's.

    python -m ftbert.bench.serve_noop --port 8002 [--dim 384] [--workers 4] [--raw]

By default FastAPI + uvicorn: what the HTTP stack ftbert's fronts are built on reaches with nothing
behind it. `--raw`: a bare asyncio HTTP/1.1 responder (keep-alive, Content-Length bodies, the body
parsed only to count its inputs), one process per worker each on its own SO_REUSEPORT socket, so
the kernel spreads the connections evenly: as little server work per request as Python allows,
to show what the client itself can send on the same cores.
"""

# No `from __future__ import annotations`: FastAPI reads the route's body type from annotations.
import argparse
import os

_ENV = "FTBERT_NOOP_DIM"


def build_app():
    from fastapi import FastAPI
    from pydantic import BaseModel

    dim = int(os.environ.get(_ENV, "384"))
    vector = [dim ** -0.5] * dim
    app = FastAPI(title="no-op embeddings")

    class EmbeddingRequest(BaseModel):
        input: str | list[str]
        model: str | None = None

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest):
        texts = [body.input] if isinstance(body.input, str) else body.input
        tokens = sum(len(t.split()) for t in texts)
        return {"object": "list", "model": "noop",
                "data": [{"object": "embedding", "index": i, "embedding": vector} for i in range(len(texts))],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/info")
    async def info():
        return {"model": "noop", "engine": "no-op", "dim": dim, "pid": os.getpid()}

    return app


# ---- --raw ------------------------------------------------------------------------------------
def _response(status: str, body: bytes) -> bytes:
    return (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
            .encode() + body)


class _RawAnswers:
    """The raw server's answers, by request line."""

    def __init__(self, dim: int):
        import json

        self._json = json
        self._vector = json.dumps([dim ** -0.5] * dim, separators=(",", ":"))
        self.health = _response("200 OK", b'{"status":"ok"}')
        self.info = _response("200 OK", json.dumps({"model": "noop", "engine": "no-op (raw)", "dim": dim,
                                                    "pid": os.getpid()}).encode())
        self.not_found = _response("404 Not Found", b'{"detail":"Not Found"}')
        self.bad = _response("400 Bad Request", b'{"detail":"a JSON body with input, a string or a list of them"}')

    def embeddings(self, body: bytes) -> bytes:
        try:
            given = self._json.loads(body)["input"]
            texts = [given] if isinstance(given, str) else list(given)
            tokens = sum(len(t.split()) for t in texts)
        except (ValueError, KeyError, TypeError, AttributeError):
            return self.bad
        rows = ",".join(f'{{"object":"embedding","index":{i},"embedding":{self._vector}}}' for i in range(len(texts)))
        return _response("200 OK", (f'{{"object":"list","model":"noop","data":[{rows}],'
                                    f'"usage":{{"prompt_tokens":{tokens},"total_tokens":{tokens}}}}}').encode())

    def answer(self, line: bytes, body: bytes) -> bytes:
        method, _, rest = line.partition(b" ")
        path = rest.partition(b" ")[0].partition(b"?")[0]
        if method == b"POST" and path == b"/v1/embeddings":
            return self.embeddings(body)
        if method == b"GET" and path == b"/health":
            return self.health
        if method == b"GET" and path == b"/info":
            return self.info
        return self.not_found


def _raw_worker(sock, dim: int) -> None:
    """One process of the raw server: serves `sock` until SIGTERM."""
    import asyncio
    import signal

    answers = _RawAnswers(dim)

    class Connection(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport, self.buf = transport, bytearray()

        def data_received(self, data):
            buf = self.buf
            buf += data
            out = []
            while True:  # every complete request in what has arrived (pipelined ones too)
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    break
                head = bytes(buf[:end]).lower()
                at = head.find(b"\r\ncontent-length:")
                size = 0
                if at >= 0:
                    stop = head.find(b"\r\n", at + 2)
                    size = int(head[at + 17:stop if stop >= 0 else len(head)])
                if len(buf) < end + 4 + size:
                    break
                line = bytes(buf[:buf.find(b"\r\n")])
                out.append(answers.answer(line, bytes(buf[end + 4:end + 4 + size])))
                del buf[:end + 4 + size]
            if out:
                self.transport.write(b"".join(out))

    async def serve():
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        server = await loop.create_server(Connection, sock=sock)
        async with server:
            await stop.wait()

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the workers
    asyncio.run(serve())


def serve_raw(host: str, port: int, dim: int, workers: int) -> int:
    """The raw server in `workers` processes until SIGTERM or SIGINT."""
    import multiprocessing as mp
    import signal
    import socket
    import threading

    socks = []
    for _ in range(workers):  # bound and listening before any worker runs: no connection is refused
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.bind((host, port))
        s.listen(1024)
        socks.append(s)
    ctx = mp.get_context("fork")  # no CUDA, no threads yet: a fork is safe and starts at once
    procs = [ctx.Process(target=_raw_worker, args=(s, dim), daemon=True) for s in socks]
    for p in procs:
        p.start()
    for s in socks:
        s.close()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(0.5):
        if any(not p.is_alive() for p in procs):
            break
    for p in procs:
        p.terminate()
    for p in procs:
        p.join(10)
    return 0


def main(argv=None) -> int:

    p = argparse.ArgumentParser(prog="python -m ftbert.bench.serve_noop")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8002)
    p.add_argument("--dim", type=int, default=384, help="floats per embedding (default %(default)s)")
    p.add_argument("--workers", type=int, default=1, help="worker processes (default %(default)s)")
    p.add_argument("--raw", action="store_true", help="the bare asyncio responder instead of FastAPI + uvicorn")
    args = p.parse_args(argv)
    if args.dim < 1 or args.workers < 1:
        p.error("--dim and --workers must be at least 1")
    if args.raw:
        return serve_raw(args.host, args.port, args.dim, args.workers)
    import uvicorn
    os.environ[_ENV] = str(args.dim)  # the workers are spawned: they read it from the environment
    from ..serving.server import nodelay_listening_sockets

    # As ftbert serve --workers: without it, uvicorn's shared socket leaves Nagle's algorithm on
    # and every response waits for the client's delayed ACK, which would lower the ceiling.
    with nodelay_listening_sockets(uvicorn.Config):
        uvicorn.run("ftbert.bench.serve_noop:build_app", factory=True, host=args.host, port=args.port,
                    workers=args.workers, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
