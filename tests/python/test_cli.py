"""The `ftbert` command line: run (default model, given texts) and its errors."""

import subprocess
import sys

import pytest

from ftbert.cli import main


def test_run_default_model_prints_similarity_matrix(capsys):
    assert main(["run"]) == 0
    out = capsys.readouterr().out
    assert "all-minilm" in out.lower() or "model:" in out
    assert "cosine similarity" in out
    assert "norm 1.0000" in out
    assert "ms" in out


def test_run_given_texts(capsys):
    assert main(["run", "hello world", "another text"]) == 0
    out = capsys.readouterr().out
    assert "embedded 2 text(s)" in out
    assert "cosine similarity" not in out


def test_run_bad_model_dir_fails_cleanly(tmp_path, capsys):
    assert main(["run", str(tmp_path), "hi"]) == 1
    assert "neither an ftbert-converted directory" in capsys.readouterr().err


def test_module_entry_point_runs():
    r = subprocess.run([sys.executable, "-m", "ftbert", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "convert" in r.stdout and "run" in r.stdout


def test_unknown_command_exits_with_usage():
    with pytest.raises(SystemExit) as e:
        main(["frobnicate"])
    assert e.value.code == 2
