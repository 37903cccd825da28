"""Copies a HF checkpoint directory, upcasting its safetensors weights to float32.

Used to ship a half-size (float16) copy of a checkpoint to a machine without a package index and
restore a float32 checkpoint there: `python benchmarks/upcast_checkpoint.py SRC DST`.
"""

import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def main(src: str, dst: str) -> None:
    src_p, dst_p = Path(src), Path(dst)
    if dst_p.exists():
        shutil.rmtree(dst_p)
    shutil.copytree(src_p, dst_p, ignore=shutil.ignore_patterns("*.safetensors"))
    for f in src_p.glob("*.safetensors"):
        tensors = {k: v.to(torch.float32).contiguous() for k, v in load_file(f).items()}
        save_file(tensors, dst_p / f.name, metadata={"format": "pt"})
    print(f"upcast {src_p} -> {dst_p}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
