"""FP8 weights (weights_tools/fp8.py): the engine's rule for which weights are e4m3, the per-channel
quantization, why reading an FP8 checkpoint as q * s and quantizing it again at load gives back q,
and `ftbert convert --quantization fp8` with the reader of what it writes."""

from __future__ import annotations

from importlib import import_module

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from tests.weights_tools._converted import read_config, rewrite_config, rewrite_weights


@pytest.fixture(scope="module")
def fp8(wt):
    return import_module(wt.__name__ + ".fp8")


def _codes(q: torch.Tensor) -> torch.Tensor:
    return q.view(torch.uint8)


# ---- the rule and the quantization ---------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, gemm_weight, expected",
    [
        ((48, 144), True, True),
        ((768, 768), True, True),
        ((48, 40), True, False),  # 40 is not a multiple of 16
        ((40, 48), True, False),
        ((48, 48), False, False),  # not a weight GEMM's matrix (a pooler, a head)
        ((144,), False, False),
    ],
)
def test_which_weights_are_fp8(wt, fp8, shape, gemm_weight, expected):
    schema = import_module(wt.__name__ + ".schema")
    assert fp8.is_fp8(schema.Tensor("t", shape, False, gemm_weight)) is expected


def test_the_engine_flags_each_layers_four_matrices_in_every_architecture(wt):
    """The flag is the engine's (cpp/core/weights.cpp's gemm_weight, through the binding): in every
    family's architecture, each layer's QKV, attention output, FFN-in and FFN-out, and nothing else
    (embeddings, a projection, the pooler, heads stay 16-bit under quantization "fp8")."""
    families = import_module(wt.__name__ + ".families")
    schema = import_module(wt.__name__ + ".schema")
    for family in wt.FAMILIES.values():
        flagged = {t.name for t in schema.iter_tensors(families._probe_config(family)) if t.gemm_weight}
        want = {f"layers.{i}.{w}" for i in range(2)
                for w in ("qkv_weight", "attn_out_weight", "ffn_in_weight", "ffn_out_weight")}
        assert flagged == want, family.name


def test_quantize_columns_is_the_engines_per_channel_absmax(fp8, rng):
    w = torch.from_numpy(rng.standard_normal((48, 37)).astype("float32")) * torch.logspace(-3, 2, 37)
    w[:, 5] = 0  # an all-zero output channel: scale 1, codes 0
    q, s = fp8.quantize_columns(w)
    assert q.dtype == torch.float8_e4m3fn and q.shape == w.shape and s.dtype == torch.float32 and s.shape == (37,)
    top = w.abs().amax(dim=0)
    assert torch.equal(s[top > 0], top[top > 0] / 448.0) and s[5] == 1.0
    assert torch.equal(_codes(q[:, 5]), torch.zeros(48, dtype=torch.uint8))
    # Each non-zero channel reaches +-448, and q is w / s rounded to nearest e4m3: within half a step.
    assert torch.equal(q.float().abs().amax(dim=0)[top > 0], torch.full((36,), 448.0))
    err = (q.float() - w / s).abs()
    step = torch.where(q.float().abs() < 2**-6, torch.tensor(2.0**-9), q.float().abs() * 2.0**-3)
    assert bool((err <= step / 2 * (1 + 1e-6) + 1e-30).all())


def test_quantize_columns_saturates(fp8):
    # 448 / top rounds so that the largest element can land just above 448: it must stay 448, not NaN.
    w = torch.tensor([[448.00006, -1.0], [1.0, 3.0]], dtype=torch.float32)
    q, _ = fp8.quantize_columns(w)
    assert torch.isfinite(q.float()).all() and q.float().abs().max() == 448.0


# ---- the round trip: q * s read back, quantized again by the engine's rule -------------------------


def _channel_codes(rows: int, cols: int, gen: torch.Generator) -> torch.Tensor:
    """Random e4m3 codes [rows, cols], subnormals included, each row holding +-448 once (what a
    per-channel scale of max|w| / 448 gives)."""
    q = (torch.randn(rows, cols, generator=gen) * 100).clamp(-448, 448)
    q[:, : cols // 4] = torch.randn(rows, cols // 4, generator=gen) * 2**-7  # e4m3's subnormal range
    q = q.to(torch.float8_e4m3fn).float()
    sign = torch.where(torch.rand(rows, generator=gen) < 0.5, 1.0, -1.0)
    q[torch.arange(rows), torch.randint(0, cols, (rows,), generator=gen)] = 448.0 * sign
    return q.to(torch.float8_e4m3fn)


def _requantized(fp8, q: torch.Tensor, s: torch.Tensor, compute: torch.dtype) -> torch.Tensor:
    """What the engine's upload makes of q * s [out, in] (HF's orientation): cast to the compute dtype,
    transposed to [in, out], quantized per output channel (fp8.quantize_columns is its rule)."""
    w16 = (q.float() * s.float()).to(compute)
    return fp8.quantize_columns(w16.float().t())[0].t()


@pytest.mark.parametrize("compute", [torch.float16, torch.bfloat16])
def test_per_channel_checkpoint_requantizes_to_its_own_codes(fp8, rng, compute):
    """q * s cast to 16 bits and quantized again per channel gives q back, bit for bit, for any scale
    from 2**-15 (float16's subnormals start to matter below it) up to float16's range (448 s <= 65504)."""
    gen = torch.Generator().manual_seed(int(rng.integers(2**31)))
    q = _channel_codes(4096, 64, gen)
    for lo, hi in ((2.0**-15, 2.0**-14), (2.0**-15, 146.0)):
        s = torch.exp(torch.empty(4096, 1).uniform_(torch.log(torch.tensor(lo)).item(),
                                                    torch.log(torch.tensor(hi)).item(), generator=gen))
        for scale_dtype in (torch.float32, torch.bfloat16):  # compressed-tensors stores the weight's dtype
            st = s.to(scale_dtype)
            assert torch.equal(_codes(_requantized(fp8, q, st, compute)), _codes(q)), (compute, lo, hi, scale_dtype)


def test_float16_loses_codes_below_the_bound_and_bfloat16_does_not(fp8, rng):
    """Below s = 2**-15 (a channel's max |w| under about 0.0137) q * s reaches float16's subnormals,
    whose absolute steps exceed half an e4m3 step of the small codes: not exact there in float16.
    bfloat16 (float32's exponent range) keeps them."""
    gen = torch.Generator().manual_seed(int(rng.integers(2**31)))
    q = _channel_codes(2048, 64, gen)
    s = torch.full((2048, 1), 2.0**-18)
    lost = (_codes(_requantized(fp8, q, s, torch.float16)) != _codes(q)).any(dim=1)
    assert lost.float().mean() > 0.5
    assert torch.equal(_codes(_requantized(fp8, q, s, torch.bfloat16)), _codes(q))


def test_per_tensor_checkpoint_is_requantized_per_channel(fp8, rng):
    """A per-tensor scale leaves most channels short of +-448: quantized again per channel, their
    codes change (finer), so the engine does not run the checkpoint's bits; the values stay within
    half an e4m3 step of the checkpoint's."""
    gen = torch.Generator().manual_seed(int(rng.integers(2**31)))
    w = torch.randn(64, 48, generator=gen) * torch.logspace(-1, 1, 64).unsqueeze(1)
    s = w.abs().amax() / 448.0
    q = (w / s).clamp(-448, 448).to(torch.float8_e4m3fn)
    again = _requantized(fp8, q, s.reshape(1), torch.bfloat16)
    assert not torch.equal(_codes(again), _codes(q))
    new_s = (q.float() * s).to(torch.bfloat16).float().abs().amax(dim=1, keepdim=True) / 448.0
    deq, orig = again.float() * new_s, q.float() * s
    assert bool(((deq - orig).abs() <= orig.abs() * 2.0**-4 + new_s * 2.0**-9 + 1e-12).all())


# ---- ftbert convert --quantization fp8 ---------------------------------------------------------------


def _header(path):
    with safe_open(str(path), framework="pt") as f:
        names = f.keys()  # safe_open is not iterable
        return {n: (str(f.get_slice(n).get_dtype()), tuple(f.get_slice(n).get_shape())) for n in names}


@pytest.fixture
def odd_model(hf):
    """A model with a 40-wide FFN: its FFN weights ([48, 40], [40, 48]) stay unquantized."""
    return hf.build_model("cls", intermediate_size=40)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_convert_fp8_stores_the_engines_weights_as_e4m3(wt, fp8, hf, tmp_path, odd_model, dtype):
    src = hf.save_checkpoint(odd_model, tmp_path / "hf")
    out = wt.convert_checkpoint(src, tmp_path / "out", dtype=dtype, progress=False, quantization="fp8")
    cfg = read_config(out)
    layout = import_module(wt.__name__ + ".layout")
    at = layout.CONFIG_KEYS.index("dtype") + 1
    assert tuple(cfg) == (*layout.CONFIG_KEYS[:at], "checkpoint_quantization", *layout.CONFIG_KEYS[at:])
    assert cfg["checkpoint_quantization"] == "fp8" and cfg["dtype"] == dtype and cfg["format_version"] == 2
    header = _header(out / "ftbert_weights.safetensors")
    stored = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}[dtype]
    want = {}
    schema = import_module(wt.__name__ + ".schema")
    quantized = fp8.fp8_names(cfg)
    for t in schema.iter_tensors(cfg):
        if t.name in quantized:
            want[t.name] = ("F8_E4M3", t.shape)
            want[t.name + "_scale"] = ("F32", (t.shape[1],))
        else:
            want[t.name] = (stored, t.shape)
    assert header == want
    assert [n for n, (d, _) in want.items() if d == "F8_E4M3"] == [
        f"layers.{i}.{w}" for i in range(2) for w in ("qkv_weight", "attn_out_weight")]
    # Read back: the FP8 weights as float32 q * s, the codes and scales those of quantize_columns on
    # the float32 weights; the rest as the plain conversion stores them.
    config, tensors = wt.read_converted(out)
    assert config["checkpoint_quantization"] == "fp8"
    ref = hf.reference_tensors(odd_model)
    assert list(tensors) == list(ref)
    for name, t in tensors.items():
        if name in quantized:
            q, s = fp8.quantize_columns(ref[name])
            assert t.dtype == torch.float32 and torch.equal(t, q.float() * s), name
        else:
            assert t.dtype == getattr(torch, dtype) and torch.equal(t, ref[name].to(t.dtype)), name


def test_convert_fp8_of_an_fp8_checkpoint_keeps_its_codes(wt, fp8, hf, tmp_path):
    """A per-channel compressed-tensors checkpoint converted with --quantization fp8 stores the
    checkpoint's own codes (the round trip above, in float32): both readers give the same values."""
    src, _ref = hf.save_fp8_checkpoint(hf.build_model("cls"), tmp_path / "ct")
    out = wt.convert_checkpoint(src, tmp_path / "out", progress=False, quantization="fp8")
    hf_config, hf_tensors = wt.load_hf_checkpoint(src)
    config, tensors = wt.read_converted(out)
    assert list(tensors) == list(hf_tensors)
    for name, t in tensors.items():
        assert torch.equal(t, hf_tensors[name]), name
    sd = load_file(str(out / "ftbert_weights.safetensors"))
    raw = load_file(str(src / "model.safetensors"))
    qkv = torch.cat([raw[f"bert.encoder.layer.0.attention.self.{p}.weight"].view(torch.uint8) for p in
                     ("query", "key", "value")]).t()
    assert torch.equal(_codes(sd["layers.0.qkv_weight"]), qkv)
    assert config["checkpoint_quantization"] == hf_config["checkpoint_quantization"] == "fp8"


def test_convert_of_an_fp8_checkpoint_without_the_flag_stores_floats(wt, hf, tmp_path, capsys):
    src, ref = hf.save_fp8_checkpoint(hf.build_model("cls"), tmp_path / "ct")
    out = wt.convert_checkpoint(src, tmp_path / "out", progress=True)
    assert "written dequantized (keep them FP8 with --quantization fp8)" in capsys.readouterr().out
    config, tensors = wt.read_converted(out)
    assert config["checkpoint_quantization"] is None
    want = hf.reference_tensors(ref)
    assert all(torch.equal(t, want[n]) for n, t in tensors.items())


def test_convert_fp8_with_no_weight_to_quantize(wt, hf, tmp_path, capsys):
    # Every side odd: nothing is FP8, the record says the file follows the fp8 rule all the same.
    src = hf.save_checkpoint(hf.build_model("model", hidden_size=36, num_attention_heads=3, intermediate_size=40),
                             tmp_path / "hf")
    out = wt.convert_checkpoint(src, tmp_path / "out", progress=True, quantization="fp8")
    assert "quantized 0 layer weight(s)" in capsys.readouterr().out
    assert all(d != "F8_E4M3" for d, _ in _header(out / "ftbert_weights.safetensors").values())
    config, _ = wt.read_converted(out)
    assert config["checkpoint_quantization"] == "fp8"


def test_unknown_quantization_is_refused(wt, make_checkpoint, tmp_path):
    src, _ = make_checkpoint()
    with pytest.raises(wt.ConversionError, match="unknown quantization 'int8' \\(expected None or one of 'fp8'\\)"):
        wt.convert_checkpoint(src, tmp_path / "out", progress=False, quantization="int8")


def test_cli_quantization_flag(wt, hf, tmp_path, capsys, odd_model):
    src = hf.save_checkpoint(odd_model, tmp_path / "hf")
    assert wt.main([str(src), str(tmp_path / "out"), "--quantization", "fp8", "--dtype", "bfloat16", "-q"]) == 0
    assert "bfloat16, fp8 layer weights" in capsys.readouterr().out
    assert read_config(tmp_path / "out")["checkpoint_quantization"] == "fp8"
    with pytest.raises(SystemExit) as e:
        wt.main([str(src), str(tmp_path / "o2"), "--quantization", "int4"])
    assert e.value.code == 2 and "invalid choice: 'int4'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        wt.main(["--help"])
    assert "--quantization" in capsys.readouterr().out


# ---- reading a converted FP8 directory: damage refused by name --------------------------------------


@pytest.fixture
def converted_fp8(wt, hf, tmp_path, odd_model):
    src = hf.save_checkpoint(odd_model, tmp_path / "hf")
    return wt.convert_checkpoint(src, tmp_path / "out", progress=False, quantization="fp8")


@pytest.mark.parametrize(
    "edit, pattern",
    [
        (lambda sd: sd.pop("layers.0.qkv_weight_scale"), "missing tensor 'layers.0.qkv_weight_scale'"),
        (lambda sd: sd.__setitem__("layers.0.qkv_weight_scale", torch.ones(48)),
         "tensor 'layers.0.qkv_weight_scale' has shape \\[48\\], expected \\[144\\]"),
        (lambda sd: sd.__setitem__("layers.0.qkv_weight_scale", torch.ones(144, dtype=torch.float16)),
         ("tensor 'layers.0.qkv_weight_scale' is float16, but ftbert_config.json declares checkpoint_quantization "
         "'fp8', which stores it as float32")),
        (lambda sd: sd.__setitem__("layers.1.attn_out_weight", sd["layers.1.attn_out_weight"].float()),
         ("tensor 'layers.1.attn_out_weight' is float32, but ftbert_config.json declares checkpoint_quantization "
         "'fp8', which stores it as float8_e4m3fn")),
        (lambda sd: sd.__setitem__("layers.0.ffn_in_weight", sd["layers.0.ffn_in_weight"].to(torch.float8_e4m3fn)),
         "tensor 'layers.0.ffn_in_weight' is float8_e4m3fn, but ftbert_config.json declares dtype float32"),
        (lambda sd: sd.__setitem__("layers.0.ffn_in_weight_scale", torch.ones(40)),
         "unexpected tensor\\(s\\) layers.0.ffn_in_weight_scale"),
        (lambda sd: sd["layers.0.qkv_weight_scale"].__setitem__(7, -1.0),
         "tensor 'layers.0.qkv_weight_scale' holds 1 scale\\(s\\) that are not finite positive numbers \\(of 144\\)"),
        (lambda sd: sd["layers.0.qkv_weight_scale"].__setitem__(slice(0, 3), float("inf")),
         "tensor 'layers.0.qkv_weight_scale' holds 3 scale\\(s\\) that are not finite positive numbers"),
        (lambda sd: sd["layers.1.qkv_weight"].view(torch.uint8).__setitem__((2, 9), 0xFF),  # -NaN in e4m3fn
         "tensor 'layers.1.qkv_weight' holds 1 NaN or infinite value\\(s\\)"),
    ],
    ids=["no-scale", "scale-shape", "scale-dtype", "float-weight", "fp8-unruled", "extra-scale",
         "negative-scale", "inf-scale", "nan-code"],
)
def test_damaged_fp8_directory_is_refused_by_name(wt, converted_fp8, edit, pattern):
    rewrite_weights(converted_fp8, edit)
    with pytest.raises(wt.FormatError, match=pattern):
        wt.read_converted(converted_fp8)


def test_reader_without_the_record_refuses_fp8_tensors(wt, converted_fp8):
    """What a reader that predates FP8 files sees (no checkpoint_quantization: every tensor in dtype):
    refused, never read as something else; so the format keeps version 2. The file is smaller than
    the declared dtype needs, so the size check refuses it first; where it is not (a dtype whose
    size fits), the first FP8 weight is refused by its dtype."""
    rewrite_config(converted_fp8, checkpoint_quantization=...)
    with pytest.raises(wt.FormatError, match="imply 36562 parameters, at least 142.8 KiB, but the weight files "
                       "\\(ftbert_weights.safetensors\\) hold only"):
        wt.read_converted(converted_fp8)
    # Padded so that the sizes fit (the pad is named after the first mismatch, too late to matter).
    rewrite_weights(converted_fp8, lambda sd: sd.update(pad=torch.zeros(1 << 16)))
    with pytest.raises(wt.FormatError, match="tensor 'layers.0.qkv_weight' is float8_e4m3fn, but "
                       "ftbert_config.json declares dtype float32 \\(checkpoint_quantization is None\\)"):
        wt.read_converted(converted_fp8)


@pytest.mark.parametrize("value", ["int8", "FP8", 1, True, {"method": "fp8"}])
def test_bad_checkpoint_quantization_value_is_refused(wt, converted_fp8, value):
    rewrite_config(converted_fp8, checkpoint_quantization=value)
    with pytest.raises(wt.FormatError, match="checkpoint_quantization must be null or one of 'fp8', got"):
        wt.read_converted(converted_fp8)


def test_plain_conversion_writes_no_record_and_reads_as_null(wt, make_checkpoint, tmp_path):
    # The key is optional: written only for FP8 files, so a plain conversion's file is what it was
    # before FP8 files existed; read back, the key is null, after dtype.
    layout = import_module(wt.__name__ + ".layout")
    src, _ = make_checkpoint()
    out = wt.convert_checkpoint(src, tmp_path / "out", progress=False)
    assert tuple(read_config(out)) == layout.CONFIG_KEYS
    config, _ = wt.read_converted(out)
    keys = list(config)
    assert config["checkpoint_quantization"] is None and keys[keys.index("dtype") + 1] == "checkpoint_quantization"
    rewrite_config(out, checkpoint_quantization=None)  # spelled out as null: the same
    assert wt.read_converted(out)[0] == config


def test_converted_fp8_runs_as_its_float_twin(wt, hf, tmp_path, rng, odd_model):
    """The engine on the CPU (quantization None) gives the same bits for the converted FP8 directory
    as for a float32 HF checkpoint holding q * s."""
    import numpy as np

    ftbert = pytest.importorskip("ftbert")
    src = hf.save_checkpoint(odd_model, tmp_path / "hf")
    out = wt.convert_checkpoint(src, tmp_path / "out", progress=False, quantization="fp8")
    _, tensors = wt.read_converted(out)
    twin_model = hf.build_model("cls", intermediate_size=40)
    twin_model.load_state_dict(odd_model.state_dict())
    fam = wt.family_for("bert")
    sd = twin_model.state_dict()
    hf_sd = import_module(wt.__name__ + ".hf").hf_state_dict(fam, read_config(out), tensors)
    with torch.no_grad():
        for k, v in hf_sd.items():
            sd[k].copy_(v)
    twin = hf.save_checkpoint(twin_model, tmp_path / "twin")
    ids = rng.integers(0, hf.TINY["vocab_size"], size=(2, 9)).astype(np.int64)
    mask = np.ones_like(ids)
    a = ftbert.Encoder.from_pretrained(out, device="cpu")(ids, mask)
    b = ftbert.Encoder.from_pretrained(twin, device="cpu")(ids, mask)
    assert np.array_equal(a.last_hidden_state, b.last_hidden_state)
    assert np.array_equal(a.logits, b.logits)
