"""`ftbert serve` on the command line: its help, argument errors, the message without the `serve`
extra, and that `import ftbert` (and ftbert.serving) pulls in none of the server's packages."""

from __future__ import annotations

import subprocess
import sys

import pytest

import ftbert.serving
from ftbert.cli import main


def test_import_needs_no_server_packages():
    code = ("import sys, ftbert, ftbert.serving; "
            "print(sorted(m for m in ('fastapi', 'uvicorn', 'prometheus_client', 'ray') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"


def test_missing_extra_names_the_install_command(monkeypatch, capsys):
    real = ftbert.serving.importlib.util.find_spec
    monkeypatch.setattr(ftbert.serving.importlib.util, "find_spec",
                        lambda name, *a: None if name == "fastapi" else real(name, *a))
    message = ftbert.serving.missing_serve_extra()
    assert "fastapi" in message and "pip install 'ftbert[serve]'" in message
    assert main(["serve"]) == 2
    assert "pip install 'ftbert[serve]'" in capsys.readouterr().err


def test_serve_help_lists_the_settings(capsys):
    with pytest.raises(SystemExit) as e:
        main(["serve", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--max-batch-tokens", "--max-wait-ms", "--max-queue", "--no-truncate", "--devices", "--ray",
                 "--replicas", "--gpus-per-replica"):
        assert flag in out


@pytest.mark.parametrize("argv, words", [
    (["--max-batch-tokens", "0"], "max_batch_tokens must be a positive integer"),
    (["--max-client-batch", "100", "--max-queue", "10"], "must not exceed max_queue"),
    (["--max-wait-ms", "-1"], "max_wait_ms must be >= 0"),
])
def test_bad_settings_are_usage_errors(argv, words, capsys):
    pytest.importorskip("fastapi")
    with pytest.raises(SystemExit) as e:
        main(["serve", *argv])
    assert e.value.code == 2
    assert words in capsys.readouterr().err


def test_top_level_help_names_serve_and_bench_serve():
    r = subprocess.run([sys.executable, "-m", "ftbert", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "serve" in r.stdout and "bench-serve" in r.stdout


def test_bad_model_path_is_one_line(tmp_path, capsys):
    pytest.importorskip("fastapi")
    assert main(["serve", str(tmp_path / "missing"), "--port", "1"]) == 1
    err = capsys.readouterr().err
    assert "ftbert serve: error: model path" in err and "does not exist" in err and "Traceback" not in err


def test_batch_invariant_flag_reaches_the_settings():
    from ftbert.serving.server import build_parser, settings_from_args
    from ftbert.serving.settings import ServeSettings

    def setting(*argv):
        return settings_from_args(build_parser().parse_args(list(argv))).batch_invariant

    assert setting() == "auto" and setting("--batch-invariant", "off") is False
    assert setting("--batch-invariant") is True and setting("--batch-invariant", "on") is True
    assert setting("--batch-invariant", "auto") == "auto"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--batch-invariant", "always"])
    for bad in ("yes", "Auto", 1, None):
        with pytest.raises(ValueError, match='batch_invariant must be "auto", True or False'):
            ServeSettings(batch_invariant=bad)


def test_quantization_flag_reaches_the_settings():
    from ftbert.serving.server import build_parser, settings_from_args
    from ftbert.serving.settings import ServeSettings

    assert settings_from_args(build_parser().parse_args(["--quantization", "int8"])).quantization == "int8"
    assert settings_from_args(build_parser().parse_args([])).quantization is None
    assert settings_from_args(build_parser().parse_args(["--quantization", "fp8"])).quantization == "fp8"
    with pytest.raises(ValueError, match="quantization must be None, 'int8' or 'fp8'"):
        ServeSettings(quantization="int4")


def test_task_flag_reaches_the_settings_and_the_encoder(tmp_path):
    # --task goes to Encoder.from_pretrained: a checkpoint without per-task adapters refuses it.
    from ftbert.serving.server import build_parser, settings_from_args
    from ftbert.serving.service import Service
    from ftbert.serving.settings import ServeSettings
    from ftbert.weights_tools import ConversionError
    from tests._models import make_model

    assert settings_from_args(build_parser().parse_args(["--task", "retrieval.query"])).task == "retrieval.query"
    assert settings_from_args(build_parser().parse_args([])).task is None
    with pytest.raises(ValueError, match="task must be None or a task name"):
        ServeSettings(task="")
    make_model(tmp_path, "bert", hidden=32, heads=2)
    with pytest.raises(ConversionError, match="task 'retrieval.query' given, but model_type 'bert' has no"):
        Service.load(ServeSettings(model=str(tmp_path), task="retrieval.query"))


def test_default_workers_are_half_the_cores_on_gpus_and_one_on_the_cpu():
    from ftbert.serving.server import FRONTS_PER_GPU, default_workers

    assert default_workers("cpu", cores=64) == 1
    assert default_workers("cuda", cores=16) == 8
    assert default_workers("cuda", cores=7) == 3
    assert default_workers("cuda:0", cores=1) == 1
    assert default_workers("cuda", cores=64) == FRONTS_PER_GPU
    assert default_workers("cuda:0, cuda:1", cores=64) == 2 * FRONTS_PER_GPU
    assert default_workers("cuda:0,cuda:1", cores=20) == 10
    assert 1 <= default_workers("cuda") <= FRONTS_PER_GPU  # this machine's own cores


@pytest.mark.parametrize("argv,workers", [([], 1), (["--device", "cuda"], 5), (["--device", "cuda", "--workers", "3"], 3),
                                          (["--device", "cuda", "--ray"], 1)])
def test_serve_without_workers_takes_the_default(monkeypatch, capsys, argv, workers):
    from ftbert.serving import ray, server

    seen = []
    monkeypatch.setattr(server, "default_workers", lambda devices: 1 if devices == "cpu" else 5)
    monkeypatch.setattr(server, "serve_workers", lambda settings, n, *rest: seen.append(n) or 0)
    monkeypatch.setattr(server, "serve", lambda settings, *rest: seen.append(1) or 0)
    monkeypatch.setattr(ray, "run_ray", lambda settings, args: seen.append(args.workers) or 0)
    assert server.main(argv) == 0
    assert seen == [workers]
    said = "ftbert serve: 5 front processes before one engine (the default for cuda; --workers sets it)"
    assert (said in capsys.readouterr().err) == (argv == ["--device", "cuda"])


def test_usable_cores_count_a_cgroup_cpu_quota(tmp_path):
    import os

    from ftbert.serving.server import cgroup_cpu_quota, usable_cores

    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("150000 100000\n")  # 1.5 CPUs: two cores to run on
    assert cgroup_cpu_quota(v2) == 2
    (v2 / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_quota(v2) is None
    (v2 / "cpu.max").write_text("garbage")
    assert cgroup_cpu_quota(v2) is None
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("400000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_quota(v1) == 4
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu_quota(v1) is None
    assert cgroup_cpu_quota(tmp_path / "none") is None
    (v2 / "cpu.max").write_text("100000 100000\n")
    assert usable_cores(v2) == 1
    assert usable_cores(tmp_path / "none") == len(os.sched_getaffinity(0))
