"""FP8 checkpoints in the compressed-tensors format (weights_tools/compressed_tensors.py, read by
hf.py): read as float32 weight * weight_scale, their scales consumed; every scheme ftbert does not
read exactly is refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file


def _fp8(hf, tmp_path, kind="cls", name="ct", **kwargs):
    """(directory, model holding the values it means) of a tiny compressed-tensors FP8 checkpoint."""
    model = hf.build_model(kind)
    return hf.save_fp8_checkpoint(model, tmp_path / name, **kwargs)


def _edit_weights(src, edit):
    path = src / "model.safetensors"
    sd = load_file(str(path))
    edit(sd)
    save_file(sd, str(path), metadata={"format": "pt"})


def _edit_quantization_config(src, edit):
    path = src / "config.json"
    raw = json.loads(path.read_text())
    edit(raw["quantization_config"])
    path.write_text(json.dumps(raw))


def _group(raw):
    return raw["config_groups"]["group_0"]


@pytest.mark.parametrize("strategy", ["channel", "tensor"])
@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_fp8_checkpoint_reads_as_weight_times_scale(wt, hf, tmp_path, capsys, strategy, scale_dtype):
    src, ref = _fp8(hf, tmp_path, strategy=strategy, scale_dtype=scale_dtype)
    config, tensors = wt.load_hf_checkpoint(src, progress=True)
    out = capsys.readouterr().out
    want = hf.reference_tensors(ref)
    assert list(tensors) == list(want)
    for name, t in tensors.items():
        assert t.dtype == torch.float32 and torch.equal(t, want[name]), name
    assert config["checkpoint_quantization"] == "fp8"
    # 4 Linears a layer (Q, K, V, attention out, FFN in, FFN out: 6) and the pooler; the ignored
    # classifier stays as it was.
    assert f"{2 * 6 + 1} FP8 weight(s) read as weight * weight_scale" in out
    # The scales are consumed, not reported as tensors left out or unrecognised.
    assert ".weight_scale" not in out and "left out" not in out and "unrecognised" not in out
    # The quantized weights are not what the float model held: the test sees the dequantization.
    assert not torch.equal(tensors["layers.0.qkv_weight"], hf.reference_tensors(hf.build_model("cls"))["layers.0.qkv_weight"])


def test_fp8_checkpoint_from_a_bin_file(wt, hf, tmp_path):
    src, ref = _fp8(hf, tmp_path, layout="bin")
    _, tensors = wt.load_hf_checkpoint(src)
    want = hf.reference_tensors(ref)
    assert all(torch.equal(t, want[n]) for n, t in tensors.items())


def test_fp8_checkpoint_with_16_bit_rest_fits_its_file(wt, hf, tmp_path):
    # One byte an FP8 weight: the size check against the file must not assume two for every element.
    src, ref = _fp8(hf, tmp_path, rest_dtype=torch.bfloat16)
    config, tensors = wt.load_hf_checkpoint(src)
    want = hf.reference_tensors(ref)
    assert all(torch.equal(t, want[n]) for n, t in tensors.items())
    n_params = sum(int(np.prod(s)) for _, s in wt.expected_tensors(config))
    assert (src / "model.safetensors").stat().st_size < 2 * n_params


def test_float_checkpoint_records_no_quantization(wt, make_checkpoint):
    src, _ = make_checkpoint()
    config, _ = wt.load_hf_checkpoint(src)
    assert config["checkpoint_quantization"] is None


def test_symmetric_zero_points_are_consumed(wt, hf, tmp_path, capsys):
    # Older compressed-tensors versions stored the (zero) zero points of symmetric schemes too.
    src, ref = _fp8(hf, tmp_path)
    _edit_weights(src, lambda sd: sd.update({k[: -len("scale")] + "zero_point": torch.zeros_like(v)
                                             for k, v in list(sd.items()) if k.endswith("weight_scale")}))
    _, tensors = wt.load_hf_checkpoint(src, progress=True)
    assert ".weight_zero_point" not in capsys.readouterr().out
    want = hf.reference_tensors(ref)
    assert all(torch.equal(t, want[n]) for n, t in tensors.items())


def test_dequantized_checkpoint_runs_as_its_float_twin(wt, hf, tmp_path, rng):
    """The engine on the CPU (quantization None) gives the same bits for the FP8 checkpoint as for a
    float32 checkpoint holding its dequantized values."""
    ftbert = pytest.importorskip("ftbert")
    src, ref = _fp8(hf, tmp_path, kind="model")
    twin = hf.save_checkpoint(ref, tmp_path / "twin")
    ids = rng.integers(0, hf.TINY["vocab_size"], size=(3, 11)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[1, 7:] = 0
    fp8 = ftbert.Encoder.from_pretrained(src, device="cpu")
    flt = ftbert.Encoder.from_pretrained(twin, device="cpu")
    assert fp8.config["checkpoint_quantization"] == "fp8" and flt.config["checkpoint_quantization"] is None
    a, b = fp8(ids, mask), flt(ids, mask)
    assert np.array_equal(a.last_hidden_state, b.last_hidden_state)
    assert np.array_equal(a.pooler_output, b.pooler_output)
    # ... and not those of the unquantized model: the FP8 values are what ran.
    orig = ftbert.Encoder.from_pretrained(hf.save_checkpoint(hf.build_model("model"), tmp_path / "orig"), device="cpu")
    assert not np.array_equal(orig(ids, mask).last_hidden_state, a.last_hidden_state)


# ---- refused: each with a message that names what is wrong --------------------------------------

QKV0 = "bert.encoder.layer.0.attention.self.query"


@pytest.mark.parametrize(
    "edit, pattern",
    [
        (lambda sd: sd.pop(QKV0 + ".weight_scale"),
         (f"tensor '{QKV0}.weight' has dtype float8_e4m3fn, which the engine does not take without a scale: "
         f"'{QKV0}.weight_scale' is not in model.safetensors")),
        (lambda sd: sd.__setitem__(QKV0 + ".weight_scale", sd[QKV0 + ".weight_scale"].reshape(-1)),
         (f"tensor '{QKV0}.weight_scale' has shape \\[48\\], but '{QKV0}.weight' of \\[48, 48\\] under strategy "
         "'channel' needs \\[48, 1\\] \\(channel\\)")),
        (lambda sd: sd.__setitem__(QKV0 + ".weight_scale", torch.ones(48, 1, dtype=torch.int32)),
         f"tensor '{QKV0}.weight_scale' has dtype int32; a weight scale must be one of float16, bfloat16, float32"),
        (lambda sd: sd.__setitem__(QKV0 + ".weight_scale", torch.zeros(48, 1)),
         f"tensor '{QKV0}.weight_scale' holds 48 scale\\(s\\) that are not finite positive numbers \\(of 48\\)"),
        (lambda sd: sd[QKV0 + ".weight_scale"].__setitem__((5, 0), float("nan")),
         f"tensor '{QKV0}.weight_scale' holds 1 scale\\(s\\) that are not finite positive numbers"),
        (lambda sd: sd.__setitem__(QKV0 + ".weight", sd[QKV0 + ".weight"].float().to(torch.float8_e5m2)),
         (f"tensor '{QKV0}.weight' has dtype float8_e5m2, which the engine does not take \\(float8 weights are "
         "read only as float8_e4m3fn")),
        (lambda sd: sd[QKV0 + ".weight"].view(torch.uint8).__setitem__((3, 4), 0x7F),  # e4m3fn's NaN
         f"tensor '{QKV0}.weight' holds 1 NaN or infinite value\\(s\\)"),
        (lambda sd: sd.__setitem__(QKV0 + ".weight_zero_point", torch.ones(48, 1)),
         f"tensor '{QKV0}.weight_zero_point' is not all zeros, but the scheme is symmetric"),
        (lambda sd: sd.__setitem__(QKV0 + ".weight_zero_point", torch.zeros(48)),
         (f"tensor '{QKV0}.weight_zero_point' is float32 \\[48\\]; a symmetric scheme's zero point must be zeros "
         "shaped as its scale \\[48, 1\\]")),
        (lambda sd: sd.update({"bert.embeddings.LayerNorm.weight": torch.ones(48).to(torch.float8_e4m3fn),
                               "bert.embeddings.LayerNorm.weight_scale": torch.ones(1)}),
         "tensor 'bert.embeddings.LayerNorm.weight' is FP8 of shape \\[48\\]; an FP8 weight must be a matrix"),
    ],
    ids=["no-scale", "scale-shape", "scale-dtype", "zero-scale", "nan-scale", "e5m2", "nan-code",
         "zero-point", "zero-point-shape", "fp8-vector"],
)
def test_damaged_fp8_tensors_are_named(wt, hf, tmp_path, edit, pattern):
    src, _ = _fp8(hf, tmp_path)
    _edit_weights(src, edit)
    with pytest.raises(wt.ConversionError, match=pattern):
        wt.load_hf_checkpoint(src)


def test_fp8_weights_without_a_quantization_config_are_refused(wt, hf, tmp_path):
    src, _ = _fp8(hf, tmp_path)
    raw = json.loads((src / "config.json").read_text())
    del raw["quantization_config"]
    (src / "config.json").write_text(json.dumps(raw))
    with pytest.raises(wt.ConversionError, match="has dtype float8_e4m3fn, which the engine does not take without a "
                       "scale: config.json has no quantization_config"):
        wt.load_hf_checkpoint(src)


def test_tensor_scales_need_a_tensor_strategy(wt, hf, tmp_path):
    src, _ = _fp8(hf, tmp_path, strategy="tensor")
    _edit_quantization_config(src, lambda q: _group(q)["weights"].update(strategy="channel"))
    with pytest.raises(wt.ConversionError, match="has shape \\[1\\], but .* needs \\[48, 1\\] \\(channel\\)"):
        wt.load_hf_checkpoint(src)


@pytest.mark.parametrize(
    "edit, pattern",
    [
        (lambda q: q.update(quant_method="gptq"), "quantization_config.quant_method 'gptq' is not supported"),
        (lambda q: q.update(format="int-quantized") or _group(q).pop("format"),
         "config_groups.group_0: format 'int-quantized' is not supported"),
        (lambda q: _group(q).update(format="pack-quantized"),
         "config_groups.group_0: format 'pack-quantized' is not supported"),
        (lambda q: _group(q)["weights"].update(num_bits=4),
         "group_0.weights: 4-bit 'float' weights are not supported"),
        (lambda q: _group(q)["weights"].update(type="int"),
         "group_0.weights: 8-bit 'int' weights are not supported"),
        (lambda q: _group(q)["weights"].update(strategy="block", block_structure=[128, 128]),
         "group_0.weights: strategy 'block' is not supported"),
        (lambda q: _group(q)["weights"].update(strategy="group", group_size=128),
         "group_0.weights: strategy 'group \\(group_size 128\\)' is not supported"),
        (lambda q: _group(q)["weights"].update(symmetric=False), "asymmetric weights"),
        (lambda q: _group(q)["weights"].update(dynamic=True), "dynamic True weights are not supported"),
        (lambda q: _group(q)["weights"].update(actorder="group"), "actorder 'group' is not supported"),
        (lambda q: _group(q).update(weights=None), "group_0.weights must be an object"),
        (lambda q: _group(q)["input_activations"].update(dynamic=False, strategy="tensor"),
         "group_0.input_activations: static activation scales \\(dynamic False\\) are not supported"),
        (lambda q: _group(q).update(output_activations={"num_bits": 8, "type": "float", "dynamic": True}),
         "group_0.output_activations is set"),
        (lambda q: q.update(kv_cache_scheme={"num_bits": 8, "type": "float"}), "kv_cache_scheme is set"),
        (lambda q: q.update(sparsity_config={"format": "sparse-24-bitmask"}), "sparsity_config is set"),
        (lambda q: q.update(transform_config={"config_groups": {}}), "transform_config is set"),
        (lambda q: q.update(config_groups={}), "config_groups must be a non-empty object"),
        (lambda q: q.update(config_groups={"FP8_DYNAMIC": ["Linear"]}),
         "config_groups.FP8_DYNAMIC must be an object"),
    ],
    ids=["quant-method", "int-format", "pack-format", "4-bit", "int-weights", "block", "group", "asymmetric",
         "dynamic-weights", "actorder", "no-weights", "static-inputs", "outputs", "kv-cache", "sparsity",
         "transform", "no-groups", "preset"],
)
def test_unsupported_schemes_are_refused_by_name(wt, hf, tmp_path, edit, pattern):
    src, _ = _fp8(hf, tmp_path)
    _edit_quantization_config(src, edit)
    with pytest.raises(wt.ConversionError, match=pattern) as e:
        wt.load_hf_checkpoint(src)
    assert str(src / "config.json") in str(e.value)


def test_weights_only_and_dense_sparsity_records_are_read(wt, hf, tmp_path):
    # FP8 weights without activation quantization (W8A16), and the empty sparsity record that
    # compressed-tensors writes beside it: the weights mean the same.
    src, ref = _fp8(hf, tmp_path)
    _edit_quantization_config(src, lambda q: _group(q).update(input_activations=None)
                              or q.update(sparsity_config={"format": "dense"}))
    config, tensors = wt.load_hf_checkpoint(src)
    want = hf.reference_tensors(ref)
    assert config["checkpoint_quantization"] == "fp8"
    assert all(torch.equal(t, want[n]) for n, t in tensors.items())
