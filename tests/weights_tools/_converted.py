"""Edits of a converted directory for the readers' tests: its config and its weights, with the
recorded checksum kept true, so that the check under test is the one that fires."""

from __future__ import annotations

import hashlib
import json

from safetensors.torch import load_file, save_file


def read_config(out) -> dict:
    return json.loads((out / "ftbert_config.json").read_text())


def write_config(out, cfg: dict) -> None:
    (out / "ftbert_config.json").write_text(json.dumps(cfg))


def rewrite_config(out, **changes) -> None:
    """Sets keys; a value of ... removes the key."""
    cfg = read_config(out)
    for k, v in changes.items():
        if v is ...:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    write_config(out, cfg)


def rewrite_weights(out, edit) -> None:
    """Edits the tensors (edit(dict) in place) and re-records the checksum."""
    path = out / "ftbert_weights.safetensors"
    sd = load_file(str(path))
    edit(sd)
    save_file(sd, str(path))
    rewrite_config(out, weights_sha256=hashlib.sha256(path.read_bytes()).hexdigest())
