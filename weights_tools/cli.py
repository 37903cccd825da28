"""`ftbert convert SRC DST [--dtype ...]`: the command line of the converter."""

from __future__ import annotations

import argparse
import sys

from .convert import convert_checkpoint
from .errors import ConversionError
from .layout import DTYPES, QUANTIZATIONS, WEIGHTS_FILE, human_size


def build_parser(prog: str = "ftbert convert") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Convert a HuggingFace BERT, RoBERTa, XLM-RoBERTa or CamemBERT checkpoint "
        "directory into the ftbert format "
        "(fused QKV, [in, out] matrices, one safetensors file, tokenizer files copied).",
    )
    p.add_argument("src", metavar="SRC", help="HuggingFace checkpoint directory (config.json + weights)")
    p.add_argument("dst", metavar="DST", help="output directory (created if needed)")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="float32",
                   help="stored dtype (default float32); with --quantization fp8, of the tensors left unquantized")
    p.add_argument("--quantization", choices=QUANTIZATIONS, default=None,
                   help="fp8: store each layer weight matrix whose two sides are multiples of 16 (the ones the "
                   "engine's quantization='fp8' runs in FP8) as float8 e4m3 with a float32 scale per output "
                   "channel (max |w| / 448), about a quarter of float32's size; every other tensor (embeddings, "
                   "norms, biases, pooler, head, other weights) takes --dtype. Loading reads them back as "
                   "weight * scale")
    p.add_argument("--task", metavar="TASK", default=None,
                   help="for a checkpoint with per-task LoRA adapters (Jina-embeddings-v3 as the hub holds it: "
                   "retrieval.query, retrieval.passage, separation, classification, text-matching): the task "
                   "whose adapters are merged into the converted weights; required for such a checkpoint, "
                   "refused for any other")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the final line")
    return p


def main(argv: list[str] | None = None) -> int:
    """Runs the converter; returns the exit code (0, or 1 with a one-line message on stderr)."""
    args = build_parser().parse_args(argv)
    try:
        out = convert_checkpoint(args.src, args.dst, dtype=args.dtype, progress=not args.quiet, task=args.task,
                                 quantization=args.quantization)
    except ConversionError as e:
        return _fail(str(e))
    except OSError as e:  # disk full, no permission, ...: a message, not a traceback
        return _fail(f"{e.strerror or e}: {e.filename}" if e.filename else str(e))
    total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    weights = (out / WEIGHTS_FILE).stat().st_size
    task = f", task {args.task}" if args.task else ""
    fp8 = ", fp8 layer weights" if args.quantization else ""
    print(f"converted to {out.resolve()} ({human_size(total)}; weights {human_size(weights)}, {args.dtype}{fp8}{task})")
    return 0


def _fail(message: str) -> int:
    print("ftbert convert: error: " + " ".join(message.split()), file=sys.stderr)
    return 1

