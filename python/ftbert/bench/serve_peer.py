"""The peer of `ftbert bench-serve`: a plain FastAPI + sentence-transformers embedding server, as
one would write it by hand. Same request and response shape as ftbert's /v1/embeddings (float
only); each request runs `SentenceTransformer.encode` on its own inputs in FastAPI's thread pool
(no batching across requests).

    python -m ftbert.bench.serve_peer MODEL --port 8001 [--device cuda --dtype float16]
"""

# No `from __future__ import annotations` here: FastAPI reads the route's body type from the
# annotations of a class defined inside build_app, which a string annotation could not resolve.
import argparse


def build_app(model_path: str, device: str, dtype: str):
    import torch
    from fastapi import FastAPI
    from pydantic import BaseModel
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(model_path, device=device, local_files_only=True)
    if dtype != "float32":
        model = model.to(getattr(torch, dtype))
    model.eval()
    name = model_path.rstrip("/").rsplit("/", 1)[-1]
    app = FastAPI(title="sentence-transformers peer")

    class EmbeddingRequest(BaseModel):
        input: str | list[str]
        model: str | None = None

    @app.post("/v1/embeddings")
    def embeddings(body: EmbeddingRequest):  # a sync route: FastAPI runs it in its thread pool
        texts = [body.input] if isinstance(body.input, str) else body.input
        emb = model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
        tokens = sum(len(ids) for ids in model.tokenizer(texts, truncation=True,
                                                         max_length=model.max_seq_length)["input_ids"])
        return {"object": "list", "model": name,
                "data": [{"object": "embedding", "index": i, "embedding": e.tolist()} for i, e in enumerate(emb)],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    @app.get("/health")
    def health():
        return {"status": "ok"}

    @app.get("/info")
    def info():
        return {"model": name, "engine": "sentence-transformers", "device": device, "dtype": dtype,
                "max_input_length": model.max_seq_length}

    return app


def main(argv=None) -> int:
    import uvicorn

    p = argparse.ArgumentParser(prog="python -m ftbert.bench.serve_peer")
    p.add_argument("model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8001)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    args = p.parse_args(argv)
    uvicorn.run(build_app(args.model, args.device, args.dtype), host=args.host, port=args.port,
                log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
