"""benchmarks/fp8_vs_scaled_mm.py: its row quantization as the engine's (CPU), and one draw on a GPU
with FP8, where ftbert's product must equal torch._scaled_mm's on the same codes."""

import importlib.util
import re
from pathlib import Path

import pytest
import torch

import ftbert

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "fp8_vs_scaled_mm.py"
_spec = importlib.util.spec_from_file_location("fp8_vs_scaled_mm", _PATH)
script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(script)


def test_rows_are_scaled_to_448_and_a_zero_row_keeps_a_scale_of_one():
    x = torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0], [3e-3, 1e-3, -7e-3]])
    codes, scales = script.e4m3_rows(x)
    assert codes.dtype == torch.float8_e4m3fn
    back = codes.float() * scales
    assert codes.float().abs().amax(1).tolist() == [448.0, 0.0, 448.0]
    assert scales[1].item() == 1.0
    assert torch.allclose(back, x, rtol=2**-3, atol=0)


@pytest.mark.skipif(not ftbert.cuda_available() or not torch.cuda.is_available()
                    or torch.cuda.get_device_capability() < (9, 0),
                    reason="needs a GPU with FP8 (compute capability 9.0 or later) and a CUDA build")
def test_one_draw_matches_scaled_mm(capsys):
    assert script.main(["--draws", "1", "--shapes", "7x384x64"]) == 0
    line = capsys.readouterr().out.strip()
    apart = float(re.search(r"\|ours-torch\|/\|ref\| (\S+)", line).group(1))
    assert apart == 0.0, line
