"""Reads a converted ftbert directory back, checking everything before the engine sees it."""

from __future__ import annotations

from pathlib import Path

import torch

from .errors import FormatError
from .jsonfile import read_json_object
from .layout import (
    CONFIG_FILE,
    DTYPES,
    FORMAT_NAME,
    FORMAT_VERSION,
    check_engine_config,
    expected_tensors,
    fmt_shape,
    sha256_file,
)


def is_converted(directory) -> bool:
    """Whether `directory` holds an ftbert conversion (has ftbert_config.json).

    Only the file's presence is tested, so a damaged conversion is still routed to read_converted,
    which says what is wrong, instead of being mistaken for a HuggingFace directory.
    """
    return (Path(directory) / CONFIG_FILE).is_file()


def read_config(directory) -> dict:
    """ftbert_config.json, checked (format, version, keys, value ranges)."""
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
    if version != FORMAT_VERSION or isinstance(version, bool):
        raise FormatError(
            f"{path}: format_version {version!r} is not supported (this ftbert reads version "
            f"{FORMAT_VERSION}; convert the HuggingFace checkpoint again)"
        )
    check_engine_config(config, str(path), FormatError)
    return config


def read_converted(directory) -> tuple[dict, dict[str, torch.Tensor]]:
    """(engine config, tensors in the stored dtype) of a converted directory, all checked.

    Raises FormatError for a missing or malformed config, a missing, truncated or altered weights
    file, and any tensor that is missing, unexpected, or of the wrong shape or dtype.
    """
    d = Path(directory)
    config = read_config(d)
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
    try:
        from safetensors.torch import load_file

        tensors = load_file(str(wpath), device="cpu")
    except Exception as e:  # safetensors raises its own error types, and others for odd files
        raise FormatError(f"{wpath}: cannot be read as safetensors ({e})") from e

    want_dtype = DTYPES[config["dtype"]]
    ordered: dict[str, torch.Tensor] = {}
    for name, shape in expected_tensors(config):
        t = tensors.pop(name, None)
        if t is None:
            raise FormatError(f"{wpath}: missing tensor {name!r}")
        if tuple(t.shape) != shape:
            raise FormatError(
                f"{wpath}: tensor {name!r} has shape {fmt_shape(t.shape)}, expected {fmt_shape(shape)}"
            )
        if t.dtype != want_dtype:
            raise FormatError(
                f"{wpath}: tensor {name!r} is {str(t.dtype).replace('torch.', '')}, but "
                f"{CONFIG_FILE} declares dtype {config['dtype']}"
            )
        ordered[name] = t
    if tensors:
        raise FormatError(f"{wpath}: unexpected tensor(s) {', '.join(sorted(tensors))}")
    return config, ordered
