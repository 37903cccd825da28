"""Reads a converted ftbert directory back, checking everything before the engine sees it."""

from __future__ import annotations

from pathlib import Path

import torch

from .errors import FormatError
from .families import check_engine_config
from .fp8 import FP8_DTYPE, SCALE_SUFFIX, bad_scale_count, dequantize, is_fp8
from .jsonfile import read_json_object
from .layout import (
    ABSOLUTE,
    CHECKPOINT_QUANTIZATION,
    FP8,
    CONFIG_FILE,
    CONFIG_KEYS,
    DTYPES,
    EMBEDDING_SIZE,
    DISENTANGLED,
    LAYER,
    RELATIVE_BUCKETS,
    FORMAT_NAME,
    HEAD,
    HEAD_KEYS,
    FORMAT_VERSION,
    READABLE_VERSIONS,
    check_finite,
    fmt_shape,
    sha256_file,
)
from .safetensors_header import read_header
from .schema import check_fits, iter_tensors


def is_converted(directory) -> bool:
    """Whether `directory` holds an ftbert conversion (has ftbert_config.json).

    Only the file's presence is tested, so a damaged conversion is still routed to read_converted,
    which says what is wrong, instead of being mistaken for a HuggingFace directory.
    """
    return (Path(directory) / CONFIG_FILE).is_file()


# What a version-1 file leaves unsaid: it holds a BERT, whose positions are absolute; the pad id is
# unused by those, and BertConfig's default is written.
_VERSION_1_IMPLIED = {"position_ids": ABSOLUTE, "pad_token_id": 0}


def _upgrade_version_1(config: dict, path: Path) -> dict:
    """A version-1 config as version 2 writes it: the keys version 2 added filled in, in CONFIG_KEYS
    order, format_version left at 1 (what the file is). Version 1 allowed model_type "bert" only,
    which check_engine_config sees to. A version-1 file that spells one of the added keys with
    another value contradicts its own version: refused."""
    for key, implied in _VERSION_1_IMPLIED.items():
        if key in config and (config[key] != implied or type(config[key]) is not type(implied)):
            raise FormatError(
                f"{path}: format_version 1 implies {key} {implied!r}, but the file says "
                f"{config[key]!r} (convert the HuggingFace checkpoint again)"
            )
    if "model_type" in config and config["model_type"] != "bert":
        raise FormatError(
            f"{path}: model_type {config['model_type']!r} is not supported in format_version 1 "
            "(expected 'bert'; convert the HuggingFace checkpoint again)"
        )
    merged = {**config, **_VERSION_1_IMPLIED}
    return {**{k: merged[k] for k in CONFIG_KEYS if k in merged}, **merged}


def _fill_embedding_size(config: dict) -> dict:
    """A config written before "embedding_size" existed (version 1, and version 2 until ELECTRA):
    its embeddings are hidden_size wide, so the key comes back as hidden_size, in its place in the
    CONFIG_KEYS order. Without a hidden_size the config is left as it is, for check_engine_config
    to name the key that is missing."""
    if EMBEDDING_SIZE in config or "hidden_size" not in config:
        return config
    merged = {**config, EMBEDDING_SIZE: config["hidden_size"]}
    return {**{k: merged[k] for k in CONFIG_KEYS if k in merged}, **merged}


def _fill_layer(config: dict) -> dict:
    """A config written before ModernBERT's layer existed holds BERT's: "layer" comes back null; a
    layer written before gated_mlp existed is ModernBERT's, gated, and one before rotary_scale or
    rotary_dynamic_factor is unscaled."""
    layer = config.get(LAYER)
    filled = {"gated_mlp": True, "rotary_scale": 1.0, "rotary_dynamic_factor": 0.0, "rotary_original_positions": 0}
    if isinstance(layer, dict) and not set(filled) <= set(layer):
        return {**config, LAYER: {**filled, **layer}}
    if LAYER in config:
        return config
    merged = {**config, LAYER: None}
    return {**{k: merged[k] for k in CONFIG_KEYS if k in merged}, **merged}


def _fill_disentangled(config: dict) -> dict:
    """A config written before DeBERTa existed has no disentangled attention: the key comes back
    null, in its place."""
    if DISENTANGLED in config:
        return config
    merged = {**config, DISENTANGLED: None}
    return {**{k: merged[k] for k in CONFIG_KEYS if k in merged}, **merged}


def _fill_relative_buckets(config: dict) -> dict:
    """A config written before relative position biases (MPNet) existed has none: the key comes back
    as 0, in its place."""
    if RELATIVE_BUCKETS in config:
        return config
    merged = {**config, RELATIVE_BUCKETS: 0}
    return {**{k: merged[k] for k in CONFIG_KEYS if k in merged}, **merged}


def _fill_head(config: dict) -> dict:
    """A config written before heads existed holds none: "head" comes back as null, in its place; a
    head written before "norm" existed has none (false, in its place)."""
    head = config.get(HEAD)
    if isinstance(head, dict) and "norm" not in head:
        merged = {**head, "norm": False}
        return {**config, HEAD: {**{k: merged[k] for k in HEAD_KEYS if k in merged}, **merged}}
    if HEAD in config:
        return config
    merged = {**config, HEAD: None}
    return {**{k: merged[k] for k in CONFIG_KEYS if k in merged}, **merged}


def _fill_checkpoint_quantization(config: dict) -> dict:
    """A config without the key (every one but an FP8 conversion's) stores no tensor as FP8: it
    comes back null, after "dtype" (where an FP8 conversion writes it)."""
    if CHECKPOINT_QUANTIZATION in config or "dtype" not in config:
        return config
    out = {}
    for k, v in config.items():
        out[k] = v
        if k == "dtype":
            out[CHECKPOINT_QUANTIZATION] = None
    return out


def expected_stored(config: dict):
    """(name, shape, dtype) of every tensor the weights file holds, in file order: the engine's
    tensors in the config's dtype; under checkpoint_quantization "fp8" each weight fp8.is_fp8
    picks in float8_e4m3fn, followed by its float32 scale per output channel, `<name>_scale` [out]."""
    fp8 = config.get(CHECKPOINT_QUANTIZATION) == FP8
    for t in iter_tensors(config):
        if fp8 and is_fp8(t):
            yield t.name, t.shape, FP8_DTYPE
            yield t.name + SCALE_SUFFIX, (t.shape[1],), "float32"
        else:
            yield t.name, t.shape, config["dtype"]


def read_config(directory) -> dict:
    """ftbert_config.json, checked (format, version, keys, value ranges); a version-1 config comes
    back with the keys version 2 added (position_ids "absolute", pad_token_id 0), and a config
    without "embedding_size" (version 1, or version 2 written before the key) with hidden_size
    there, and one without "head" (written before heads) with a null head."""
    d = Path(directory)
    path = d / CONFIG_FILE
    if not path.is_file():
        raise FormatError(
            f"{d}: no {CONFIG_FILE}, so this is not an ftbert-converted directory "
            "(create one with `ftbert convert SRC DST`)"
        )
    config = read_json_object(path, FormatError)
    if config.get("format") != FORMAT_NAME:
        raise FormatError(f"{path}: format is {config.get('format')!r}, expected {FORMAT_NAME!r}")
    version = config.get("format_version")
    if version not in READABLE_VERSIONS or isinstance(version, bool) or not isinstance(version, int):
        readable = " and ".join(map(str, READABLE_VERSIONS))
        raise FormatError(
            f"{path}: format_version {version!r} is not supported (this ftbert reads versions "
            f"{readable} and writes {FORMAT_VERSION}; convert the HuggingFace checkpoint again)"
        )
    if version == 1:
        config = _upgrade_version_1(config, path)
    config = _fill_head(_fill_disentangled(_fill_layer(_fill_relative_buckets(_fill_embedding_size(config)))))
    config = _fill_checkpoint_quantization(config)
    check_engine_config(config, str(path), FormatError)
    return config


def read_converted(directory) -> tuple[dict, dict[str, torch.Tensor]]:
    """(engine config, tensors in the stored dtype) of a converted directory, all checked; FP8
    weights (checkpoint_quantization "fp8") come back as float32 q * scale, their scales consumed.

    Raises FormatError for a missing or malformed config, a missing, truncated or altered weights
    file, sizes the weights file cannot hold, any tensor that is missing, unexpected, or of the wrong
    shape or dtype, a scale that is not a finite positive number, and any NaN or infinite weight.
    Everything but the last two is checked from the config and the safetensors header, before any
    tensor data is read.
    """
    d = Path(directory)
    config = read_config(d)
    cpath = d / CONFIG_FILE
    wpath = d / config["weights_file"]
    if not wpath.is_file():
        raise FormatError(f"{wpath}: weights file missing (named by {CONFIG_FILE})")
    # Checked before parsing: a damaged file gets one clear message, whatever the damage hit.
    actual = sha256_file(wpath)
    if actual != config["weights_sha256"]:
        raise FormatError(
            f"{wpath} is corrupted or truncated (sha256 mismatch: {CONFIG_FILE} says "
            f"{config['weights_sha256'][:16]}..., the file hashes to {actual[:16]}...)"
        )
    # The checksum covers the weights, not the config: its sizes are checked against the file.
    fp8 = config[CHECKPOINT_QUANTIZATION] == FP8
    # An FP8 weight takes 1 byte an element; the others the declared dtype's.
    itemsize = 1 if fp8 else DTYPES[config["dtype"]].itemsize
    check_fits(config, wpath.stat().st_size, itemsize, str(cpath), wpath.name, FormatError)
    header = read_header(wpath, FormatError)
    names, scales = [], {}
    for name, shape, dtype in expected_stored(config):
        info = header.pop(name, None)
        if info is None:
            raise FormatError(f"{wpath}: missing tensor {name!r}")
        if info.shape != shape:
            raise FormatError(
                f"{wpath}: tensor {name!r} has shape {fmt_shape(info.shape)}, expected {fmt_shape(shape)}"
            )
        if info.dtype != dtype:  # DTYPES and the header both use torch's names
            scale = fp8 and name.endswith(SCALE_SUFFIX)
            declared = (f"declares dtype {config['dtype']}" if dtype == config["dtype"] and not scale else
                        f"declares {CHECKPOINT_QUANTIZATION} {config[CHECKPOINT_QUANTIZATION]!r}, which stores "
                        f"it as {dtype}")
            if info.dtype == FP8_DTYPE and not fp8:
                declared += f" ({CHECKPOINT_QUANTIZATION} is {config[CHECKPOINT_QUANTIZATION]!r})"
            raise FormatError(f"{wpath}: tensor {name!r} is {info.dtype}, but {CONFIG_FILE} {declared}")
        if dtype == FP8_DTYPE:
            scales[name] = name + SCALE_SUFFIX
        if not (fp8 and name.endswith(SCALE_SUFFIX) and name[: -len(SCALE_SUFFIX)] in scales):
            names.append(name)
    if header:
        raise FormatError(f"{wpath}: unexpected tensor(s) {', '.join(sorted(header))}")

    try:
        from safetensors.torch import load_file

        tensors = load_file(str(wpath), device="cpu")
    except Exception as e:  # safetensors raises its own error types, and others for odd files
        raise FormatError(f"{wpath}: cannot be read as safetensors ({e})") from e
    for name, scale in scales.items():
        bad = bad_scale_count(tensors[scale])
        if bad:
            raise FormatError(f"{wpath}: tensor {scale!r} holds {bad} scale(s) that are not finite positive "
                              f"numbers (of {tensors[scale].numel()})")
        tensors[name] = dequantize(tensors[name], tensors[scale])
    for name in names:
        check_finite(name, tensors[name], str(wpath), FormatError)
    return config, {name: tensors[name] for name in names}
