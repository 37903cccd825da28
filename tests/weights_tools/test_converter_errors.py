"""Checkpoints the converter must refuse, each with a ConversionError that names the problem."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import load_file, save_file


def _edit_config(src, **changes):
    path = src / "config.json"
    cfg = json.loads(path.read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    path.write_text(json.dumps(cfg))


def _edit_weights(src, edit):
    path = src / "model.safetensors"
    sd = load_file(str(path))
    edit(sd)
    save_file(sd, str(path))


def test_conversion_error_is_a_value_error(wt):
    assert issubclass(wt.ConversionError, ValueError) and issubclass(wt.FormatError, ValueError)


@pytest.mark.parametrize("model_type", ["albert", "electra-generator", "deberta", "Roberta", "ELECTRA"])
def test_other_model_type_is_refused_by_name(wt, make_checkpoint, tmp_path, model_type):
    src, _ = make_checkpoint("model")
    _edit_config(src, model_type=model_type)
    # The message names the model_type and every one that can be converted.
    *others, last = (repr(t) for f in wt.FAMILIES.values() for t in f.model_types)
    supported = re.escape(f"(only {', '.join(others)} or {last} can be converted)")
    with pytest.raises(wt.ConversionError, match=f"model_type '{model_type}' is not supported {supported}"):
        wt.convert_checkpoint(src, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_config_without_model_type_is_refused(wt, make_checkpoint):
    src, _ = make_checkpoint("model")
    _edit_config(src, model_type=None)
    with pytest.raises(wt.ConversionError, match="no model_type"):
        wt.load_hf_checkpoint(src)


@pytest.mark.parametrize("act", ["quick_gelu", "gelu_fast", "tanh"])
def test_unsupported_hidden_act_is_refused_by_name(wt, make_checkpoint, act):
    src, _ = make_checkpoint("model")
    _edit_config(src, hidden_act=act)
    with pytest.raises(wt.ConversionError, match=f"hidden_act '{act}'"):
        wt.load_hf_checkpoint(src)


def test_relative_position_embeddings_are_refused(wt, make_checkpoint):
    src, _ = make_checkpoint("model")
    _edit_config(src, position_embedding_type="relative_key")
    with pytest.raises(wt.ConversionError, match="relative_key"):
        wt.load_hf_checkpoint(src)


def test_hidden_size_not_divisible_by_heads_is_refused(wt, make_checkpoint):
    src, _ = make_checkpoint("model")
    _edit_config(src, num_attention_heads=5)
    with pytest.raises(wt.ConversionError, match="not divisible by num_attention_heads 5"):
        wt.load_hf_checkpoint(src)


@pytest.mark.parametrize(
    "kind, tensor, part",
    [
        ("model", "layers.1.ffn_out_weight", 0),
        ("model", "embeddings.ln_beta", 0),
        ("mlm", "layers.0.qkv_bias", 2),  # V's bias, under the task model's prefix
        ("cls", "pooler.bias", 0),  # a pooler weight without its bias
    ],
)
def test_missing_tensor_is_named(wt, hf, make_checkpoint, kind, tensor, part):
    src, _ = make_checkpoint(kind)
    name = hf.hf_name(tensor, part, kind)
    _edit_weights(src, lambda sd: sd.pop(name))
    with pytest.raises(wt.ConversionError, match=re.escape(f"missing tensor '{name}'")):
        wt.load_hf_checkpoint(src)


def test_wrong_shape_names_tensor_found_and_expected_shapes(wt, hf, make_checkpoint):
    src, _ = make_checkpoint("mlm")
    name = hf.hf_name("layers.1.ffn_in_weight", kind="mlm")  # HF [I, H] = [80, 48]
    _edit_weights(src, lambda sd: sd.__setitem__(name, torch.randn(79, 48)))
    with pytest.raises(wt.ConversionError) as e:
        wt.load_hf_checkpoint(src)
    msg = str(e.value)
    assert name in msg and "[79, 48]" in msg and "[80, 48]" in msg


def test_vocab_size_disagreeing_with_embeddings_is_refused(wt, make_checkpoint):
    src, _ = make_checkpoint("model")
    _edit_config(src, vocab_size=100)
    with pytest.raises(wt.ConversionError, match=re.escape("[101, 48]")):
        wt.load_hf_checkpoint(src)


def test_more_layers_than_the_config_says_is_refused(wt, make_checkpoint):
    src, _ = make_checkpoint("model", num_hidden_layers=3)
    _edit_config(src, num_hidden_layers=2)
    with pytest.raises(wt.ConversionError, match="layer 2.*num_hidden_layers=2"):
        wt.load_hf_checkpoint(src)


def test_missing_config_is_refused(wt, make_checkpoint, tmp_path):
    src, _ = make_checkpoint("model")
    (src / "config.json").unlink()
    with pytest.raises(wt.ConversionError, match="no config.json"):
        wt.convert_checkpoint(src, tmp_path / "out", progress=False)


def test_config_that_is_not_json_is_refused(wt, make_checkpoint):
    src, _ = make_checkpoint("model")
    (src / "config.json").write_text('{"model_type": "bert",')
    with pytest.raises(wt.ConversionError, match="config.json: cannot be read as JSON"):
        wt.load_hf_checkpoint(src)


def test_directory_without_weights_is_refused(wt, make_checkpoint):
    src, _ = make_checkpoint("model")
    (src / "model.safetensors").unlink()
    with pytest.raises(wt.ConversionError, match="no weight file"):
        wt.load_hf_checkpoint(src)


def test_missing_shard_is_named(wt, make_checkpoint):
    src, _ = make_checkpoint("model", "sharded")
    shard = sorted(src.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(wt.ConversionError, match=f"shard {re.escape(shard.name)} is missing"):
        wt.load_hf_checkpoint(src)


@pytest.mark.parametrize(
    "layout, fname", [("safetensors", "model.safetensors"), ("bin", "pytorch_model.bin")]
)
def test_damaged_source_file_is_a_conversion_error(wt, make_checkpoint, layout, fname):
    src, _ = make_checkpoint("model", layout)
    data = (src / fname).read_bytes()
    (src / fname).write_bytes(data[: len(data) // 3])
    with pytest.raises(wt.ConversionError, match=re.escape(fname)):
        wt.load_hf_checkpoint(src)


def test_non_finite_weight_is_refused(wt, hf, make_checkpoint):
    src, _ = make_checkpoint("model")
    name = hf.hf_name("layers.0.attn_out_weight")

    def poison(sd):
        sd[name][3, 5] = float("nan")

    _edit_weights(src, poison)
    with pytest.raises(wt.ConversionError, match=re.escape(name) + ".*NaN"):
        wt.load_hf_checkpoint(src)


def test_float16_overflow_is_refused_but_bfloat16_is_fine(wt, hf, make_checkpoint, tmp_path):
    src, _ = make_checkpoint("model")
    name = hf.hf_name("layers.1.ffn_out_bias")

    def inflate(sd):
        sd[name][7] = 1.0e5  # past float16's 65504

    _edit_weights(src, inflate)
    with pytest.raises(wt.ConversionError, match="'layers.1.ffn_out_bias'.*overflow float16"):
        wt.convert_checkpoint(src, tmp_path / "half", dtype="float16", progress=False)
    _, t = wt.read_converted(wt.convert_checkpoint(src, tmp_path / "bf", dtype="bfloat16", progress=False))
    assert float(t["layers.1.ffn_out_bias"][7]) == pytest.approx(1.0e5, rel=2**-8)


def test_unknown_dtype_is_refused(wt, make_checkpoint, tmp_path):
    src, _ = make_checkpoint("model")
    with pytest.raises(wt.ConversionError, match="unknown dtype 'int8'"):
        wt.convert_checkpoint(src, tmp_path / "out", dtype="int8", progress=False)


def test_writing_into_the_source_directory_is_refused(wt, make_checkpoint):
    src, _ = make_checkpoint("model")
    before = sorted(p.name for p in src.iterdir())
    with pytest.raises(wt.ConversionError, match="source directory"):
        wt.convert_checkpoint(src, src / "." , progress=False)
    assert sorted(p.name for p in src.iterdir()) == before


def test_source_that_is_not_a_directory_is_refused(wt, tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(wt.ConversionError, match="not a directory"):
        wt.load_hf_checkpoint(tmp_path / "file")
    with pytest.raises(wt.ConversionError, match="no such directory"):
        wt.load_hf_checkpoint(tmp_path / "nothing")
