"""benchmarks/cpu_attention.py: a row per sequence length and window with its time, the JSON the
same rows, and arguments it cannot run named."""

import importlib.util
import json
from pathlib import Path

import pytest

_SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "cpu_attention.py"


@pytest.fixture(scope="module")
def cpu_attention():
    spec = importlib.util.spec_from_file_location("cpu_attention", _SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rows_for_each_length_and_window(cpu_attention, tmp_path, capsys):
    out = tmp_path / "rows.json"
    assert cpu_attention.main(["--seq", "33,70", "--window", "0,3", "--heads", "2", "--head-dim", "8",
                               "--reps", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["seq"], r["window"]) for r in rows] == [(33, 0), (33, 3), (70, 0), (70, 3)]
    assert all(r["ms"] > 0 and r["gflops_full"] > 0 for r in rows)
    printed = capsys.readouterr().out
    assert "heads 2, head dim 8" in printed and len(printed.strip().splitlines()) == 6


@pytest.mark.parametrize("argv, message", [
    (["--seq", "128,x"], "--seq takes comma-separated integers, got '128,x'"),
    (["--window", "-1"], "--window values must be at least 0"),
    (["--seq", "0"], "--seq values must be at least 1"),
    (["--heads", "0"], "--heads must be at least 1"),
])
def test_arguments_it_cannot_run_are_named(cpu_attention, argv, message):
    with pytest.raises(SystemExit, match=message):
        cpu_attention.main(argv)
