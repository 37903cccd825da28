"""Writes a converted ftbert directory: weights in the engine layout, its config, the tokenizer files."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from .errors import ConversionError
from .fp8 import SCALE_SUFFIX, fp8_names, quantize_columns
from .hf import finite_after_cast, read_hf_checkpoint
from .layout import CHECKPOINT_QUANTIZATION, CONFIG_FILE, DTYPES, FP8, QUANTIZATIONS, WEIGHTS_FILE, sha256_file

# Files a tokenizer or a sentence-transformers pipeline reads next to the weights.
COPIED_FILES = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",  # BERT's WordPiece
    "vocab.json",  # RoBERTa's byte-level BPE, with merges.txt
    "merges.txt",
    "sentencepiece.bpe.model",  # XLM-RoBERTa's and CamemBERT's SentencePiece
    "special_tokens_map.json",
    "added_tokens.json",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
)
COPIED_DIRS = ("1_Pooling", "2_Normalize")


def load_hf_checkpoint(src, progress: bool = False, task: str | None = None) -> tuple[dict, dict[str, torch.Tensor]]:
    """Converts a HuggingFace checkpoint directory in memory: (engine config, float32 engine tensors).

    The config has dtype "float32" and weights_file / weights_sha256 set to None (nothing is written).
    task: the task whose LoRA adapters are merged, for a checkpoint that has per-task adapters
    (Jina-embeddings-v3's original code); required there, refused elsewhere.
    """
    return read_hf_checkpoint(src, _logger(progress), task=task)


def convert_checkpoint(src, dst, dtype: str = "float32", progress: bool = True, task: str | None = None,
                       quantization: str | None = None) -> Path:
    """Converts the HuggingFace checkpoint directory `src` (of a family in families.py) into the
    ftbert directory `dst`; returns dst.

    dtype: the stored dtype, "float32", "float16" or "bfloat16". dst is created if needed; files of
    an earlier conversion there are replaced. task: as load_hf_checkpoint's; the converted weights
    are that task's, merged before the cast. quantization: None, or "fp8": each layer weight whose
    sides are multiples of 16 (fp8.is_fp8, the engine's rule) stored as float8 e4m3 with a
    float32 scale per output channel, quantized from the float32 weights as the engine would; every
    other tensor in `dtype`.
    """
    log = _logger(progress)
    if dtype not in DTYPES:
        raise ConversionError(f"unknown dtype {dtype!r} (expected one of {', '.join(DTYPES)})")
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ConversionError(f"unknown quantization {quantization!r} (expected None or one of "
                              f"{', '.join(map(repr, QUANTIZATIONS))})")
    src, dst = Path(src), Path(dst)
    if src.exists() and dst.exists() and src.resolve() == dst.resolve():
        raise ConversionError(
            f"{dst}: refusing to write into the source directory (give another output directory)"
        )
    if dst.exists() and not dst.is_dir():
        raise ConversionError(f"{dst}: exists and is not a directory")

    config, tensors = read_hf_checkpoint(src, log, task=task)
    if config[CHECKPOINT_QUANTIZATION] == FP8 and quantization != FP8:
        log("the source's FP8 weights are written dequantized (keep them FP8 with --quantization fp8)")
    stored: dict[str, torch.Tensor] = {}
    quantized = 0
    if dtype != "float32":
        log(f"casting to {dtype}")
    target = DTYPES[dtype]
    quantize = fp8_names(config) if quantization == FP8 else set()
    for name, t in tensors.items():
        if name in quantize:
            stored[name], stored[name + SCALE_SUFFIX] = quantize_columns(t)
            quantized += 1
            continue
        cast = t.to(target).contiguous()
        finite_after_cast(name, t, cast, dtype)
        stored[name] = cast
    if quantization == FP8:
        log(f"quantized {quantized} layer weight(s) to float8 e4m3 with a float32 scale per output channel"
            + ("" if quantized else " (none has both sides a multiple of 16)"))
    tensors = stored

    dst.mkdir(parents=True, exist_ok=True)
    config_path = dst / CONFIG_FILE
    # Without its config the directory is not "converted", so a run stopped past this point leaves
    # nothing that a loader could mistake for a finished conversion.
    config_path.unlink(missing_ok=True)

    weights_path = dst / WEIGHTS_FILE
    log(f"writing {weights_path} ({len(tensors)} tensors, {dtype})")
    _write_atomic(dst, WEIGHTS_FILE, lambda tmp: save_file(tensors, str(tmp), metadata={"format": "pt"}))
    sha = sha256_file(weights_path)

    copied = _copy_side_files(src, dst)
    if copied:
        log(f"copied {', '.join(copied)}")

    config.update({"dtype": dtype, CHECKPOINT_QUANTIZATION: quantization, "weights_file": WEIGHTS_FILE,
                   "weights_sha256": sha})
    if quantization is None:  # an optional key: a file without FP8 tensors keeps the keys it always had
        del config[CHECKPOINT_QUANTIZATION]
    text = json.dumps(config, indent=2) + "\n"
    _write_atomic(dst, CONFIG_FILE, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    log(f"wrote {config_path}")
    return dst


def _logger(progress: bool):
    if not progress:
        return lambda _msg: None
    return lambda msg: print(msg, flush=True)


def _write_atomic(dst: Path, name: str, write) -> None:
    """Writes dst/name through a temporary file and a rename, so no half-written file ever has the name."""
    tmp = dst / f".{name}.tmp-{os.getpid()}"
    try:
        write(tmp)
        os.replace(tmp, dst / name)
    finally:
        # Only left behind when write() or the rename failed (including Ctrl-C).
        tmp.unlink(missing_ok=True)


def _copy_side_files(src: Path, dst: Path) -> list[str]:
    copied = []
    for name in COPIED_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
            copied.append(name)
    for name in COPIED_DIRS:
        if (src / name).is_dir():
            shutil.copytree(src / name, dst / name, dirs_exist_ok=True)
            copied.append(name + "/")
    return copied

