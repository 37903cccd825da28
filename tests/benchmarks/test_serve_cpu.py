"""benchmarks/serve_cpu.py: one short round against a real `ftbert serve --workers 2` on the CPU
gives a rate and the engine's and fronts' CPU per request, and bad arguments are refused."""

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "serve_cpu.py"
_spec = importlib.util.spec_from_file_location("serve_cpu", _PATH)
serve_cpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(serve_cpu)


def test_one_round_measures_the_engine_and_the_fronts_apart(tmp_path):
    from tests.serving._helpers import make_embedder

    model = make_embedder(tmp_path / "model")
    out = tmp_path / "r.json"
    assert serve_cpu.main([str(model), "--rounds", "1", "--seconds", "1", "--warmup", "0.5",
                           "--connections", "4", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    (row,) = r["rounds"]
    assert row["req_per_s"] > 0 and row["engine_us"] > 0 and row["fronts_us"] > 0
    assert r["median"] == row


@pytest.mark.parametrize("bad", [["--workers", "0"], ["--rounds", "0"], ["--seconds", "0"], ["--warmup", "-1"]])
def test_bad_arguments_are_refused(tmp_path, bad, capsys):
    with pytest.raises(SystemExit):
        serve_cpu.main([str(tmp_path)] + bad)
    assert "must be at least 1" in capsys.readouterr().err
