"""Reading the JSON files of checkpoints, with the error type of the caller's side."""

from __future__ import annotations

import json
from pathlib import Path


def read_json(path: Path, error: type[Exception]):
    """Parsed JSON of `path`; an unreadable or malformed file raises `error` naming the file."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise error(f"{path}: cannot be read as JSON ({e})") from e


def read_json_object(path: Path, error: type[Exception]) -> dict:
    """Like read_json, for files whose top level must be an object."""
    value = read_json(path, error)
    if not isinstance(value, dict):
        raise error(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value
