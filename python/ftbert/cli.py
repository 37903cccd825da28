"""The `ftbert` command: convert, run, tune, bench, serve, bench-serve."""

from __future__ import annotations

import argparse
import sys
import time

DEFAULT_SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome.",
    "The cat plays in the garden.",
    "A woman is playing the violin.",
]


def _run(args: argparse.Namespace) -> int:
    import numpy as np

    import ftbert

    model = args.model or str(ftbert.default_model_path())
    texts = args.text or DEFAULT_SENTENCES
    t0 = time.perf_counter()
    enc = ftbert.Encoder.from_pretrained(model, device=args.device, dtype=args.dtype, attention=args.attention,
                                         task=args.task)
    load_s = time.perf_counter() - t0
    print(f"model:  {model}")
    print(f"engine: {enc!r} on {enc._native.device_name} (loaded in {load_s:.2f} s)")
    enc.encode(texts[:1])  # warm-up: tokenizer load, workspace allocation
    t0 = time.perf_counter()
    emb = enc.encode(texts, normalize=not args.no_normalize)
    run_ms = (time.perf_counter() - t0) * 1e3
    print(f"embedded {len(texts)} text(s) in {run_ms:.2f} ms (dim {emb.shape[1]})\n")
    width = min(48, max(len(t) for t in texts))
    for t, e in zip(texts, emb):
        label = t if len(t) <= width else t[: width - 1] + "…"
        first = " ".join(f"{v:+.4f}" for v in e[:4])
        print(f"  {label:<{width}}  norm {np.linalg.norm(e):.4f}  [{first} …]")
    if not args.text:
        sims = emb @ emb.T
        print("\ncosine similarity:")
        print("      " + " ".join(f"{j:>6d}" for j in range(len(texts))))
        for i in range(len(texts)):
            print(f"  {i:>3d} " + " ".join(f"{sims[i, j]:6.3f}" for j in range(len(texts))))
    return 0


def _tune(args: argparse.Namespace) -> int:
    import os

    import ftbert

    if args.max_tokens < 512:
        print(f"ftbert: error: --max-tokens must be at least 512 (fewer rows run the fixed rule), "
              f"got {args.max_tokens}", file=sys.stderr)
        return 1
    if os.environ.get("FTBERT_GEMM_CHOICE") == "fixed":
        print("ftbert: error: FTBERT_GEMM_CHOICE=fixed: the fixed rule is not measured; unset it to "
              "tune", file=sys.stderr)
        return 1
    from pathlib import Path

    if not Path(args.model).is_dir():
        print(f"ftbert: error: model {args.model!r} is not a checkpoint directory", file=sys.stderr)
        return 1
    if not args.device.startswith("cuda"):
        print(f"nothing to tune: the measured GEMM choice is for float16/bfloat16 on CUDA "
              f"(got --device {args.device})")
        return 0
    t0 = time.perf_counter()
    # Unwarmed: the tuning below measures every bucket the warm-up would meet.
    enc = ftbert.Encoder.from_pretrained(args.model, device=args.device, dtype=args.dtype, warmup=False,
                                         task=args.task)
    print(f"tuning {args.model} ({enc.dtype}) on {enc._native.device_name}, 512 to "
          f"{args.max_tokens} tokens")

    def progress(done: int, total: int) -> None:
        if done == total or done % 16 == 0:
            print(f"  forwards {done}/{total}", flush=True)

    counters = enc.tune(args.max_tokens, progress)
    print(f"done in {time.perf_counter() - t0:.1f} s: {counters.get('measured', 0)} shapes measured, "
          f"{counters.get('loaded', 0)} found in the cache, {counters.get('cache_writes', 0)} written to "
          f"{os.environ.get('FTBERT_CACHE_DIR') or 'the user cache folder'}")
    return 0


def _convert(argv: list[str]) -> int:
    from .weights_tools import main as convert_main

    return convert_main(argv)


def _bench(argv: list[str]) -> int:
    from .bench import main as bench_main

    return bench_main(argv)


def _serve(argv: list[str]) -> int:
    from .serving.server import main as serve_main

    return serve_main(argv)


def _bench_serve(argv: list[str]) -> int:
    from .bench.serve import main as bench_serve_main

    return bench_serve_main(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # convert, bench, serve and bench-serve own their argument parsing.
    own = {"convert": _convert, "bench": _bench, "serve": _serve, "bench-serve": _bench_serve}
    if argv and argv[0] in own:
        return own[argv[0]](argv[1:])

    parser = argparse.ArgumentParser(prog="ftbert", description="FasterTransformer-style BERT encoder engine")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("convert", help="convert a HuggingFace checkpoint: ftbert convert SRC DST [--dtype ...]")
    sub.add_parser("bench", help="latency (and, with --rerank, cross-encoder pairs/s) benchmark next to "
                   "transformers: ftbert bench --help")
    sub.add_parser("serve", help="HTTP server (OpenAI-compatible embeddings, rerank, classify) with dynamic "
                   "batching: ftbert serve --help")
    sub.add_parser("bench-serve", help="requests/s and latency of `ftbert serve` next to a FastAPI + "
                   "sentence-transformers server: ftbert bench-serve --help")
    run = sub.add_parser("run", help="embed texts and print norms, first values and timing")
    run.add_argument("model", nargs="?", help="HF or converted checkpoint dir (default: bundled all-MiniLM-L6-v2)")
    run.add_argument("text", nargs="*", help="texts to embed (default: a few built-in sentences)")
    run.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    run.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    run.add_argument("--attention", default="auto", choices=["auto", "unfused", "flash"])
    run.add_argument("--no-normalize", action="store_true", help="print raw (unnormalized) embeddings")
    run.add_argument("--task", help="for a checkpoint with per-task LoRA adapters (Jina-embeddings-v3 as the "
                     "hub holds it): the task whose adapters are merged at load (Encoder.from_pretrained's task)")
    tune = sub.add_parser("tune", help="measure the GPU GEMM kernels of a model ahead of time, into the "
                          "cache later processes read (FTBERT_CACHE_DIR)")
    tune.add_argument("model", help="HF or converted checkpoint dir")
    tune.add_argument("--device", default="cuda", help="cuda or cuda:N (default cuda)")
    tune.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    tune.add_argument("--max-tokens", type=int, default=16384,
                      help="the largest batch in tokens to tune for (default 16384, encode's batch budget)")
    tune.add_argument("--task", help="as run's --task")
    args = parser.parse_args(argv)
    if args.command == "tune":
        try:
            return _tune(args)
        except (ValueError, RuntimeError, FileNotFoundError) as e:
            print(f"ftbert: error: {e}", file=sys.stderr)
            return 1
    # `ftbert run "some text"`: a first positional that is not a directory is text, not a model.
    if args.model is not None:
        from pathlib import Path

        if not Path(args.model).is_dir():
            if Path(args.model).exists() or "/" in args.model:
                parser.error(f"model {args.model!r} is not a checkpoint directory")
            args.text = [args.model] + list(args.text)
            args.model = None
    try:
        return _run(args)
    except (ValueError, RuntimeError, FileNotFoundError) as e:
        print(f"ftbert: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
