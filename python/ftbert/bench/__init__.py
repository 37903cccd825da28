"""`ftbert bench`: latency of ftbert next to transformers, swept over a grid, in one process.

    ftbert bench                                   # bundled MiniLM, default grid, GPU if there is one
    ftbert bench --model bert-base --dtype float16 --batch 1,8,32 --seq 128,512
    ftbert bench --preset serving                  # ftbert/bench/presets/serving.json
    ftbert bench --model bert-base --breakdown --dtype float16 --batch 32 --seq 128
    ftbert bench --rerank                          # cross-encoder pairs/s: random BERT-base, batch 32
    ftbert bench --varlen                          # ragged batches: padded vs padding-free, encode()

Modules: args (options, presets), models (checkpoint, ftbert and the transformers peers), timing,
sweep (the grid loop, errors per configuration), report (table, JSON, CSV, PNG), breakdown (per-op
profile of one configuration), rerank (cross-encoder pairs/s next to transformers and
sentence-transformers), varlen (ragged batches padded, padding-free and full, and Encoder.encode of
mixed-length texts next to sentence-transformers). The results' layout is described in
benchmarks/README.md.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import platform
import re
import sys

from .args import BenchError, Options, parse_options

__all__ = ["main", "BenchError"]


def cpu_summary(flags: tuple[str, ...]) -> str:
    """This CPU for a results file: its model name, core count and which of `flags` (names as
    /proc/cpuinfo spells them) it has."""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return "unknown"
    lines = text.splitlines()
    model = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "?")
    have = next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), [])
    return f"{model}; {os.cpu_count()} CPUs; " + " ".join(f for f in flags if f in have)


def _check_devices(opts: Options) -> None:
    import torch

    import ftbert

    for d in opts.devices:
        if not d.startswith("cuda"):
            continue
        if not ftbert._C.cuda_backend_built():
            raise BenchError(f"device {d!r} is not available: this build of ftbert has no CUDA backend "
                             "(built without nvcc/cuBLAS); use --device cpu or reinstall with CUDA")
        if not ftbert.cuda_available():
            raise BenchError(f"device {d!r} is not available: no CUDA GPU is visible; use --device cpu")
        index = int(d.split(":")[1])
        if index >= torch.cuda.device_count():
            raise BenchError(f"device {d!r} is not available: {torch.cuda.device_count()} GPU(s) visible")


def _environment(opts: Options) -> dict:
    import torch
    import transformers

    import ftbert

    env = {
        "ftbert": ftbert.__version__, "torch": torch.__version__,
        "transformers": transformers.__version__, "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(), "torch_threads": torch.get_num_threads(),
    }
    if "cpu" in opts.devices:
        from .. import _ops

        env["cpu_isa"] = _ops.cpu_isa()  # what the CPU kernels run with (FTBERT_CPU_ISA caps it)
        env["cpu_threads"] = os.cpu_count()
        with contextlib.suppress(OSError):
            with open("/proc/cpuinfo") as f:
                env["cpu_model"] = next((ln.split(":", 1)[1].strip() for ln in f
                                         if ln.startswith("model name")), None)
    if any(e.startswith("onnxruntime") for e in opts.engines):
        try:
            import onnxruntime

            env["onnxruntime"] = onnxruntime.__version__
        except ImportError:  # its rows then fail, saying what to install
            env["onnxruntime"] = None
    if opts.rerank or (opts.varlen and "encode" in opts.parts):
        try:
            import sentence_transformers

            env["sentence_transformers"] = sentence_transformers.__version__
        except ImportError:  # its rows then fail one by one, saying why
            env["sentence_transformers"] = None
    gpus = {d: torch.cuda.get_device_name(torch.device(d)) for d in opts.devices if d.startswith("cuda")}
    if gpus:
        env["gpus"] = gpus
        env["cuda"] = torch.version.cuda
        # Which weight-GEMM kernels ran: measured per shape ("auto") or the fixed rule.
        env["gemm_choice"] = os.environ.get("FTBERT_GEMM_CHOICE") or "auto"
    return env


def _stem(opts: Options, label: str) -> str:
    if opts.name:
        return opts.name
    model = re.sub(r"[^A-Za-z0-9._-]+", "_", label.rstrip("/").rsplit("/", 1)[-1]) or "model"
    devices = "+".join(d.replace(":", "") for d in opts.devices)
    return f"{model}-{devices}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"


def _run(argv: list[str]) -> int:
    from rich.console import Console

    import ftbert

    from .models import load_model, resolve_model

    opts = parse_options(argv, ftbert.cuda_available())
    _check_devices(opts)
    if opts.breakdown and not any(d.startswith("cuda") for d in opts.devices):
        raise BenchError("--breakdown needs a CUDA device: it profiles the engine's GPU kernels; on the "
                         "CPU a forward is one C++ call that torch.profiler cannot see into")
    console = Console(quiet=opts.quiet, highlight=False)
    if not console.is_terminal:
        # Piped to a file or captured: rich would assume 80 columns and squeeze the table.
        console = Console(quiet=opts.quiet, highlight=False, width=200)

    with contextlib.ExitStack() as stack:
        if opts.rerank:
            return _rerank(opts, stack, console)
        if opts.varlen:
            return _varlen(opts, stack, console)
        label, path = resolve_model(opts.model, stack)
        model = load_model(label, path)
        opts.out.mkdir(parents=True, exist_ok=True)
        stem = _stem(opts, label)
        meta = _meta(opts, model=model.describe())
        if opts.breakdown:
            return _breakdown(opts, model, meta, stem, console)
        return _sweep(opts, model, meta, stem, console)


def _meta(opts: Options, **fields) -> dict:
    """The head every results file opens with, then the mode's own fields."""
    return {
        "ftbert_bench_version": 1,
        "created": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "description": opts.description,
        "options": opts.as_dict(),
        "environment": _environment(opts),
        **fields,
    }


def _close(console, opts: Options, rows: list[dict], unit: str, mismatch=None, interrupted=False) -> int:
    """How every mode ends: its notes, the count of failed rows, and the exit status (1 when the
    engines' results disagreed, 130 when interrupted, else 0). unit: what a row is called."""
    for note in opts.notes:
        console.print(f"note: {note}", soft_wrap=True)
    failed = sum(r["status"] == "failed" for r in rows)
    if failed:
        console.print(f"{failed} {unit}(s) failed: status 'failed' and the error in the results")
    if mismatch is not None:
        print(f"ftbert bench: error: {mismatch}", file=sys.stderr)
        return 1
    if interrupted:
        print(f"ftbert bench: interrupted; the files hold the {unit}s done so far", file=sys.stderr)
        return 130
    return 0


def _write_results(opts: Options, stem: str, meta: dict, rows: list[dict], fields) -> dict:
    """OUT/stem.json and OUT/stem.csv; returns {"json": path, "csv": path}."""
    from .report import write_csv, write_json

    files = {"json": opts.out / f"{stem}.json", "csv": opts.out / f"{stem}.csv"}
    write_json(files["json"], meta, rows, fields)
    write_csv(files["csv"], rows, fields)
    return files


def _progress(opts: Options, console, stack=None):
    """The bar of a run (transient, off with --quiet); with `stack`, transformers' own bars
    (loading and writing weights), which would cut into it, are off until the stack closes."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if stack is not None:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        stack.callback(hf_logging.enable_progress_bar)
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, disable=opts.quiet, transient=True,
    )


def _sweep(opts, model, meta, stem, console) -> int:
    from .report import FIELDS, plot_png, print_table
    from .sweep import Sweep

    console.print(f"model {model.label}: {model.n_params / 1e6:.1f}M parameters, "
                  f"{model.config['num_hidden_layers']} layers, hidden {model.config['hidden_size']}")
    progress = _progress(opts, console)
    sweep = Sweep(opts, model, progress)
    with progress:
        rows = sweep.run()
    meta["notes"] = opts.notes
    meta["interrupted"] = sweep.interrupted
    files = _write_results(opts, stem, meta, rows, FIELDS)
    png = opts.out / f"{stem}.png"
    title = f"{model.label} ({model.n_params / 1e6:.1f}M params), median latency"
    if opts.min_len:
        title += f", lengths uniform in [{opts.min_len}, seq]"
    if plot_png(png, rows, title):
        files["png"] = png
    print_table(console, rows)
    console.print("wrote " + ", ".join(str(p) for p in files.values()))
    return _close(console, opts, rows, "configuration", interrupted=sweep.interrupted)


def _rerank(opts, stack, console) -> int:
    from .rerank import (DOCS_PER_QUERY, FIELDS, Rerank, ScoreMismatch, describe, print_table,
                         resolve_checkpoint)

    progress = _progress(opts, console, stack)
    mismatch = None
    with progress:
        what = "building a random BERT-base cross-encoder" if opts.model == "bert-base" else "loading"
        task = progress.add_task(what, total=None)
        ck = resolve_checkpoint(opts, stack)
        progress.update(task, description=f"making pairs of {opts.query_len} + {opts.doc_len} tokens")
        run = Rerank(opts, ck, progress)
        progress.remove_task(task)
        try:
            rows = run.run()
        except ScoreMismatch as e:
            rows, mismatch = run.rows, e
    opts.out.mkdir(parents=True, exist_ok=True)
    stem = _stem(opts, "rerank-" + re.sub(r".*/", "", ck.label.rstrip("/")))
    meta = _meta(
        opts,
        mode="rerank",
        model=describe(ck, run.n_params, opts.seed),
        pairs= {"query_tokens": opts.query_len, "doc_tokens": opts.doc_len,
                  "pair_tokens": run.pair_tokens, "max_length": ck.max_length,
                  "docs_per_query": DOCS_PER_QUERY, "seed": opts.seed},
        checks=run.checks,
        notes=opts.notes,
        interrupted=run.interrupted,
    )
    files = _write_results(opts, stem, meta, rows, FIELDS)
    params = f"{run.n_params / 1e6:.1f}M parameters, " if run.n_params else ""
    console.print(f"model {ck.label}: {params}{ck.config.get('num_hidden_layers')} layers, hidden "
                  f"{ck.config.get('hidden_size')}; {len(run.pairs)} pairs of {opts.query_len} + "
                  f"{opts.doc_len} tokens ({run.pair_tokens} with special tokens)")
    print_table(console, rows, run.checks)
    console.print("wrote " + ", ".join(str(p) for p in files.values()))
    return _close(console, opts, rows, "row", mismatch, run.interrupted)


def _varlen(opts, stack, console) -> int:
    from .models import RANDOM_MODELS, load_model, resolve_model
    from .varlen import (FIELDS, Mismatch, Varlen, load_tokenizer, plot_png, print_tables,
                         resolve_encode_model)

    # Settle the encode part's checkpoint before building anything: a bad path is exit 2 at once.
    encode_src = resolve_encode_model(opts) if "encode" in opts.parts else (None, None, None)
    if encode_src[1] is not None:
        load_tokenizer(encode_src[1])
    progress = _progress(opts, console, stack)
    model, mismatch = None, None
    with progress:
        if "model" in opts.parts:
            what = f"building a random {opts.model}" if opts.model in RANDOM_MODELS else "loading"
            task = progress.add_task(what, total=None)
            model = load_model(*resolve_model(opts.model, stack))
            progress.remove_task(task)
        run = Varlen(opts, model, encode_src, progress)
        try:
            rows = run.run()
        except Mismatch as e:
            rows, mismatch = run.rows, e
    opts.out.mkdir(parents=True, exist_ok=True)
    label = model.label if model is not None else (encode_src[0] or "encode")
    stem = _stem(opts, "varlen-" + re.sub(r".*/", "", label.rstrip("/")))
    meta = _meta(
        opts,
        mode="varlen",
        model=model.describe() if model is not None else None,
        cases=run.cases,
        encode=run.encode or None,
        checks=run.checks,
        targets=run.targets,
        notes=opts.notes,
        interrupted=run.interrupted,
    )
    files = _write_results(opts, stem, meta, rows, FIELDS)
    png = opts.out / f"{stem}.png"
    title = (f"{label}: ragged batches (median ms)" if model is not None else "")
    if encode_src[1] is not None and "encode" in opts.parts:
        title += ("; " if title else "") + f"{encode_src[0]}: Encoder.encode vs sentence-transformers"
    if plot_png(png, rows, title):
        files["png"] = png
    if model is not None:
        console.print(f"model {model.label}: {model.n_params / 1e6:.1f}M parameters, "
                      f"{model.config['num_hidden_layers']} layers, hidden {model.config['hidden_size']}")
    if run.encode:
        e = run.encode
        t = e["tokens"]
        console.print(f"encode {e['model']}: {e['sentences']} sentences, {t['total']:,} tokens (median "
                      f"{t['median']:.0f}, p90 {t['p90']:.0f}, p99 {t['p99']:.0f}, max {t['max']}; "
                      f"limit {e['max_length']})")
    console.print("wrote " + ", ".join(str(p) for p in files.values()))
    print_tables(console, rows, run.checks, run.targets)
    return _close(console, opts, rows, "row", mismatch, run.interrupted)


def _breakdown(opts, model, meta, stem, console) -> int:
    from .breakdown import print_breakdown, run_breakdown
    from .report import _clean

    varying = [n for n, v in (("dtype", opts.dtypes), ("batch", opts.batches), ("seq", opts.seqs),
                              ("attention", opts.attentions)) if len(v) > 1]
    if varying:
        console.print(f"note: --breakdown runs one configuration: the first {', '.join(varying)} given")
    result = run_breakdown(opts, model)
    print_breakdown(console, result)
    path = opts.out / f"{stem}-breakdown.json"
    path.write_text(json.dumps(_clean({**meta, "breakdown": result}), indent=2, allow_nan=False) + "\n")
    console.print(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `ftbert bench ...` (argv without the "bench"). Returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _run(argv)
    except BenchError as e:
        print(f"ftbert bench: error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:  # argparse: --help (0) or a malformed command line (2)
        return e.code if isinstance(e.code, int) else 2
