"""Programmatic dependent launch (cpp/cuda/launch.cuh): ftbert's kernels may be scheduled while
the kernel before them finishes, each waiting for it before touching memory. Results must be the
very bits of ordinary launches (FTBERT_CUDA_PDL=0), for every kernel a forward runs: both
attention paths, packed and padded batches, graphs and op by op, the FFN-in GEMM's fused kernels
at few and many rows (GPU only)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import ftbert
from tests._models import make_bert
from tests._util import ragged_mask

pytestmark = pytest.mark.skipif(not ftbert.cuda_available(), reason="needs an NVIDIA GPU and a CUDA build")

# (batch, seq): 60 rows (the FFN-in's small-tile fused kernel on Hopper), 4,160 rows (its large
# tiles) and a ragged middle size (cuBLAS + add_bias_activation).
SHAPES = [(2, 30), (65, 64), (7, 77)]
# Settings a forward's kernels depend on: attention path, padding_free, CUDA graphs.
SETTINGS = [("flash", False, True), ("flash", True, True), ("unfused", False, False),
            ("flash", True, False), ("unfused", True, True)]


def inputs(batch, seq):
    rng = np.random.default_rng(batch * 1000 + seq)
    ids = rng.integers(0, 211, (batch, seq)).astype(np.int64)
    mask = ragged_mask(rng, batch, seq).astype(np.int64)
    types = rng.integers(0, 2, (batch, seq)).astype(np.int64)
    return ids, mask, types


def run_all(path, out_dir):
    """Every (setting, shape)'s last hidden state and pooler output, float16, saved as .npy
    files in out_dir (also run in a subprocess: see RUNNER)."""
    for attention, padding_free, graphs in SETTINGS:
        enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype="float16",
                                             attention=attention, padding_free=padding_free,
                                             cuda_graphs=graphs)
        for batch, seq in SHAPES:
            ids, mask, types = (torch.from_numpy(x).cuda() for x in inputs(batch, seq))
            for rep in range(2):  # the second forward replays the recording
                out = enc(ids, mask, types)
                tag = f"{attention}-{int(padding_free)}-{int(graphs)}-{batch}x{seq}-{rep}"
                np.save(os.path.join(out_dir, f"{tag}-hidden.npy"),
                        out.last_hidden_state.float().cpu().numpy())
                np.save(os.path.join(out_dir, f"{tag}-pooled.npy"),
                        out.pooler_output.float().cpu().numpy())


RUNNER = """
import sys
sys.path.insert(0, {root!r})
from tests.cuda.test_dependent_launch import run_all
run_all({path!r}, {out!r})
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("bert-pdl")
    # head dim 64 (the Hopper flash kernels), an intermediate size the fused FFN-in takes (a
    # multiple of 8)
    make_bert(path, hidden=128, heads=2, layers=2, intermediate=264, seed=7)
    return path


def test_results_equal_ordinary_launches_bit_for_bit(model_dir, tmp_path, monkeypatch):
    # The fixed GEMM rule in both processes: "auto" measures per process, and two processes may
    # pick different kernels where candidates time alike.
    monkeypatch.setenv("FTBERT_GEMM_CHOICE", "fixed")
    monkeypatch.delenv("FTBERT_CUDA_PDL", raising=False)
    here = tmp_path / "pdl"
    there = tmp_path / "ordinary"
    here.mkdir()
    there.mkdir()
    run_all(str(model_dir), str(here))

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, FTBERT_CUDA_PDL="0", FTBERT_GEMM_CHOICE="fixed")
    code = RUNNER.format(root=root, path=str(model_dir), out=str(there))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    names = sorted(os.listdir(here))
    assert names == sorted(os.listdir(there)) and len(names) == 4 * len(SETTINGS) * len(SHAPES)
    differ = {}
    for name in names:
        a, b = np.load(here / name), np.load(there / name)
        assert np.isfinite(a).all(), name
        if not np.array_equal(a, b):
            differ[name] = float(np.abs(a - b).max())
    assert not differ, json.dumps(differ, indent=1)
