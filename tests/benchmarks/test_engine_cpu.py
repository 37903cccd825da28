"""benchmarks/engine_cpu.py: one short round against a real engine process on the CPU answers every
job it sends (with the rows a front would send), gives a rate and the engine's CPU per job, and
bad arguments are refused."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")

_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(_DIR))  # the script imports serve_cpu beside it
_spec = importlib.util.spec_from_file_location("engine_cpu", _DIR / "engine_cpu.py")
engine_cpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(engine_cpu)


def test_one_round_measures_the_engine_alone(tmp_path):
    from tests.serving._helpers import make_embedder

    model = make_embedder(tmp_path / "model")
    out = tmp_path / "r.json"
    assert engine_cpu.main([str(model), "--rounds", "1", "--seconds", "1", "--warmup", "0.5", "--in-flight", "7",
                            "--connections", "3", "--words", "5", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    (row,) = r["rounds"]
    assert row["jobs_per_s"] > 0 and row["engine_us_per_job"] > 0 and row["engine_cores"] > 0
    assert 0 <= row["loop_us_per_job"] <= row["engine_us_per_job"]  # the main thread's share
    # Each answered job's round trip, as the client saw it.
    assert 0 < row["p50_ms"] <= row["p99_ms"] <= row["max_ms"] < 60_000
    assert r["median"] == row and r["tokens"] >= 5


@pytest.mark.parametrize("bad", [["--in-flight", "0"], ["--connections", "5", "--in-flight", "4"], ["--rounds", "0"],
                                 ["--seconds", "0"], ["--warmup", "-1"], ["--words", "0"]])
def test_bad_arguments_are_refused(tmp_path, bad, capsys):
    with pytest.raises(SystemExit):
        engine_cpu.main([str(tmp_path)] + bad)
    assert "--in-flight >= --connections >= 1" in capsys.readouterr().err
