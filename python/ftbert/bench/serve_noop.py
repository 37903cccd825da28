"""The ceiling row of `ftbert bench-serve`: a FastAPI + uvicorn server that answers /v1/embeddings
with a constant unit vector per input, no model at all, in the same request and response shape as
ftbert's. What the client and HTTP stack reach with nothing behind them; several workers show
what the client itself can send.

    python -m ftbert.bench.serve_noop --port 8002 [--dim 384] [--workers 4]
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


def main(argv=None) -> int:
    import uvicorn

    p = argparse.ArgumentParser(prog="python -m ftbert.bench.serve_noop")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8002)
    p.add_argument("--dim", type=int, default=384, help="floats per embedding (default %(default)s)")
    p.add_argument("--workers", type=int, default=1, help="uvicorn worker processes (default %(default)s)")
    args = p.parse_args(argv)
    if args.dim < 1 or args.workers < 1:
        p.error("--dim and --workers must be at least 1")
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
