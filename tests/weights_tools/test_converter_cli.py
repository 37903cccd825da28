"""`ftbert convert` as main(argv): exit codes, the final line, and one-line errors."""

from __future__ import annotations

import json

import pytest
import torch


def test_cli_converts_and_ends_with_the_output_path_and_size(wt, make_checkpoint, tmp_path, capsys):
    src, _ = make_checkpoint("mlm", "sharded")
    dst = tmp_path / "nested" / "out"
    assert wt.main([str(src), str(dst), "--dtype", "float16"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert any("layer 2/2" in line for line in out)
    last = out[-1]
    assert str(dst.resolve()) in last and "KiB" in last and "float16" in last
    config, tensors = wt.read_converted(dst)
    assert config["dtype"] == "float16" and all(t.dtype == torch.float16 for t in tensors.values())


def test_cli_quiet_prints_only_the_final_line(wt, make_checkpoint, tmp_path, capsys):
    src, _ = make_checkpoint("model")
    capsys.readouterr()  # drop what saving the checkpoint printed
    assert wt.main([str(src), str(tmp_path / "out"), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.strip().splitlines()) == 1 and captured.err == ""


def test_cli_error_exits_1_with_one_line_message(wt, make_checkpoint, tmp_path, capsys):
    src, _ = make_checkpoint("model")
    cfg = json.loads((src / "config.json").read_text())
    cfg["model_type"] = "albert"
    (src / "config.json").write_text(json.dumps(cfg))
    capsys.readouterr()
    assert wt.main([str(src), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ftbert convert: error:") and "'albert'" in err
    assert not (tmp_path / "out").exists()


def test_cli_missing_source_exits_1(wt, tmp_path, capsys):
    assert wt.main([str(tmp_path / "absent"), str(tmp_path / "out")]) == 1
    assert "no such directory" in capsys.readouterr().err


def test_cli_rejects_unknown_dtype_as_usage_error(wt, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        wt.main([str(tmp_path), str(tmp_path / "out"), "--dtype", "fp8"])
    assert e.value.code == 2
    assert "--dtype" in capsys.readouterr().err
