"""Reading the JSON files of checkpoints, with the error type of the caller's side."""

from __future__ import annotations

import json
from pathlib import Path

# Far above any real config, tokenizer config or shard index; no more than this is read into memory.
MAX_JSON_BYTES = 64 << 20


def read_json(path: Path, error: type[Exception]):
    """Parsed JSON of `path`; an unreadable, oversized or malformed file raises `error` naming it."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_JSON_BYTES + 1)
    except OSError as e:
        raise error(f"{path}: cannot be read as JSON ({e})") from e
    if len(raw) > MAX_JSON_BYTES:
        raise error(f"{path}: too large for a JSON file of a checkpoint (over {MAX_JSON_BYTES} bytes)")
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise error(f"{path}: cannot be read as JSON ({e})") from e


def read_json_object(path: Path, error: type[Exception]) -> dict:
    """Like read_json, for files whose top level must be an object."""
    value = read_json(path, error)
    if not isinstance(value, dict):
        raise error(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value
