"""benchmarks/save_test_models.py: the checkpoints it saves load as the family they name, and an
unknown family or no output folder is refused."""

import importlib.util
from pathlib import Path

import pytest

import ftbert

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "save_test_models.py"
_spec = importlib.util.spec_from_file_location("save_test_models", _PATH)
save_test_models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(save_test_models)


def test_a_saved_checkpoint_loads_as_its_family(tmp_path):
    from tests._models import _require_class

    _require_class("GteModel")
    assert save_test_models.main([str(tmp_path), "gte"]) == 0
    enc = ftbert.Encoder.from_pretrained(tmp_path / "gte")
    assert enc.config["model_type"] == "gte"
    assert enc.config["hidden_size"] == save_test_models.FAMILIES["gte"]["hidden"]


def test_an_unknown_family_and_no_folder_are_refused(tmp_path, capsys):
    assert save_test_models.main([str(tmp_path), "gte", "bogus"]) == 2
    assert "unknown families ['bogus']" in capsys.readouterr().err
    assert not (tmp_path / "gte").exists()
    assert save_test_models.main([]) == 2
    assert "OUTDIR" in capsys.readouterr().out
