"""Reads and checks the header of a safetensors file without touching any tensor data.

A safetensors file is an 8-byte little-endian header length, a JSON header mapping each tensor name
to its dtype, shape and [begin, end) byte range within the data that follows, and the data. The
safetensors library checks most of this itself, but its messages name neither the file nor always
the tensor, and what it checks differs between versions. Parsing the header here first gives one
clear error for every damaged or hostile file, and the shapes and dtypes to hold a config against
before a single tensor is read.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .layout import fmt_shape

# safetensors' own limit: a larger length prefix is damage, or an attempt to exhaust memory.
MAX_HEADER_BYTES = 100_000_000

# Every dtype code of the safetensors format: (bits per element, torch's name where it has one).
DTYPES: dict[str, tuple[int, str]] = {
    "BOOL": (8, "bool"),
    "U8": (8, "uint8"),
    "I8": (8, "int8"),
    "F8_E5M2": (8, "float8_e5m2"),
    "F8_E4M3": (8, "float8_e4m3fn"),
    "F8_E8M0": (8, "float8_e8m0fnu"),
    "F8_E4M3FNUZ": (8, "float8_e4m3fnuz"),
    "F8_E5M2FNUZ": (8, "float8_e5m2fnuz"),
    "I16": (16, "int16"),
    "U16": (16, "uint16"),
    "F16": (16, "float16"),
    "BF16": (16, "bfloat16"),
    "I32": (32, "int32"),
    "U32": (32, "uint32"),
    "F32": (32, "float32"),
    "C64": (64, "complex64"),
    "F64": (64, "float64"),
    "I64": (64, "int64"),
    "U64": (64, "uint64"),
    "F4": (4, "F4"),
    "F6_E2M3": (6, "F6_E2M3"),
    "F6_E3M2": (6, "F6_E3M2"),
}


@dataclass(frozen=True)
class TensorInfo:
    """One header entry. dtype is torch's name ("float32") where torch has the type."""

    dtype: str
    shape: tuple[int, ...]
    begin: int  # byte range within the data section
    end: int


def read_header(path, error: Callable[[str], Exception]) -> dict[str, TensorInfo]:
    """The tensors of the safetensors file `path`, by name in header order, fully checked.

    Raises `error` ("PATH: cannot be read as safetensors: ...", naming the tensor where one is at
    fault) when the file is truncated, its header is not a JSON object of well-formed entries, or
    the entries' byte ranges disagree with their shapes, run past the end of the file, overlap, or
    leave bytes uncovered. Reads at most MAX_HEADER_BYTES, whatever the length prefix claims.
    """
    path = Path(path)

    def fail(detail: str) -> Exception:
        return error(f"{path}: cannot be read as safetensors: {detail}")

    try:
        size = os.stat(path).st_size
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise fail(f"truncated ({size} bytes, less than the 8-byte header length)")
            n = int.from_bytes(prefix, "little")
            if n > MAX_HEADER_BYTES:
                raise fail(f"the header length prefix says {n} bytes, over the limit of "
                           f"{MAX_HEADER_BYTES} (a damaged or foreign file)")
            if 8 + n > size:
                raise fail(f"truncated: the header is {n} bytes long, but only {size - 8} bytes "
                           "follow its length prefix")
            raw = f.read(n)
    except OSError as e:
        raise error(f"{path}: cannot be read ({e.strerror or e})") from e
    header = _parse_json(raw, fail)
    data_size = size - 8 - n
    tensors = {
        name: _entry(name, value, data_size, fail)
        for name, value in header.items()
        if name != "__metadata__"
    }
    _check_coverage(tensors, data_size, fail)
    return tensors


class _DuplicateKey(Exception):
    pass


def _no_duplicates(pairs: list) -> dict:
    # JSON parsers differ on which of two equal keys wins; a reader must not guess.
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen.add(key)
    return dict(pairs)


def _parse_json(raw: bytes, fail) -> dict:
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except _DuplicateKey as e:
        raise fail(f"the header names {e.args[0]!r} twice") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise fail(f"the header is not valid JSON ({e})") from e
    if not isinstance(header, dict):
        raise fail(f"the header is a JSON {type(header).__name__}, not an object")
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise fail("__metadata__ must map names to strings")
    return header


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _entry(name: str, value, data_size: int, fail) -> TensorInfo:
    what = f"tensor {name!r}"
    if not isinstance(value, dict) or not {"dtype", "shape", "data_offsets"} <= value.keys():
        raise fail(f"{what}: a header entry needs dtype, shape and data_offsets")
    code, shape, offsets = value["dtype"], value["shape"], value["data_offsets"]
    if not isinstance(code, str) or code not in DTYPES:
        raise fail(f"{what}: unknown dtype {code!r}")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise fail(f"{what}: shape must be a list of non-negative integers, got {shape!r}")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(o) for o in offsets)
            or offsets[0] > offsets[1]):
        raise fail(f"{what}: data_offsets must be [begin, end] with 0 <= begin <= end, got {offsets!r}")
    begin, end = offsets
    if end > data_size:
        raise fail(f"{what} lies at bytes {begin}..{end} of the data, past its end ({data_size} "
                   "bytes): the file is truncated or its header is damaged")
    bits, dtype = DTYPES[code]
    limit = 8 * data_size // bits  # the most elements the data could hold
    numel = _numel(shape, limit)
    if numel * bits != 8 * (end - begin):
        need = f"more than {data_size}" if numel > limit else f"{numel * bits / 8:g}"
        raise fail(f"{what}: shape {fmt_shape(shape)} of {dtype} needs {need} bytes, but its "
                   f"data_offsets [{begin}, {end}] hold {end - begin}")
    return TensorInfo(dtype, tuple(shape), begin, end)


def _numel(shape: list[int], limit: int) -> int:
    """The product of `shape`, or limit + 1 once it exceeds `limit`: a hostile shape of many huge
    dimensions must not turn into a slow product of enormous integers."""
    if 0 in shape:
        return 0
    n = 1
    for d in shape:
        n *= d
        if n > limit:
            return limit + 1
    return n


def _check_coverage(tensors: dict[str, TensorInfo], data_size: int, fail) -> None:
    """The byte ranges must tile the data exactly, as the format requires: no overlap, no gap."""
    pos, prev = 0, None
    for name, t in sorted(tensors.items(), key=lambda kv: (kv[1].begin, kv[1].end)):
        if t.begin < pos:
            raise fail(f"tensors {prev!r} and {name!r} overlap (bytes {t.begin}..{pos} of the data)")
        if t.begin > pos:
            raise fail(f"bytes {pos}..{t.begin} of the data belong to no tensor (before {name!r}): "
                       "the header is damaged")
        pos, prev = t.end, name
    if pos != data_size:
        raise fail(f"the last {data_size - pos} bytes of the data belong to no tensor: the header "
                   "is damaged, or the file has trailing bytes")
