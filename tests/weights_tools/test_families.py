"""The family tables (families.py) and the RoBERTa family's checkpoints: roberta, xlm-roberta and
camembert convert like BERT under their own prefix, defaults and position ids."""

from __future__ import annotations

import json

import pytest
import torch

MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "camembert")
ROBERTA_FAMILY = ("roberta", "xlm-roberta", "camembert")


def _edit_config(src, **changes):
    """Sets config.json keys; a value of ... removes the key."""
    path = src / "config.json"
    cfg = json.loads(path.read_text())
    for k, v in changes.items():
        if v is ...:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    path.write_text(json.dumps(cfg))


def test_every_supported_model_type_has_a_family_of_its_name(wt):
    from importlib import import_module

    families = import_module(wt.__name__ + ".families")
    assert families.supported_model_types() == MODEL_TYPES
    assert tuple(wt.FAMILIES) == MODEL_TYPES
    for t in MODEL_TYPES:
        assert wt.family_for(t).name == t and wt.family_for(t).model_types == (t,)
    for other in ("BERT", "distilbert", None, 3, ["bert"]):
        assert wt.family_for(other) is None


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_config_defaults_are_those_of_the_transformers_config_class(wt, hf, model_type):
    # A key left out of config.json must mean what transformers makes of it.
    config_cls, _ = hf.model_classes(model_type)
    reference = config_cls()
    family = wt.family_for(model_type)
    for engine_key, key in family.config.items():
        assert key.hf is not None, engine_key
        assert key.default == getattr(reference, key.hf), f"{model_type}: {engine_key}"


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_task_model_prefix_is_the_transformers_base_model_prefix(wt, hf, model_type):
    for kind in ("mlm", "cls"):
        _, cls = hf.model_classes(model_type, kind)
        assert wt.family_for(model_type).weights.prefixes == (cls.base_model_prefix + ".",)


def test_roberta_family_differs_from_bert_only_where_transformers_does(wt):
    bert = wt.family_for("bert")
    for t in ROBERTA_FAMILY:
        f = wt.family_for(t)
        assert f.position_ids == "padding_offset" and bert.position_ids == "absolute"
        assert f.config["pad_token_id"].default == 1
        # The encoder's tensors are BertModel's names: only the task-model prefix differs.
        assert f.weights.embeddings == bert.weights.embeddings
        assert f.weights.layer == bert.weights.layer and f.weights.layer_prefix == bert.weights.layer_prefix
        assert f.weights.pooler == bert.weights.pooler and f.heads == ("pooler",)
        assert f.token_types and f.projection is None


@pytest.mark.parametrize("family", ROBERTA_FAMILY)
@pytest.mark.parametrize(
    "kind, has_pooler", [("model", True), ("mlm", False), ("cls", False), ("choice", True)]
)
def test_roberta_family_roundtrip_is_exact(wt, hf, make_checkpoint, tmp_path, family, kind, has_pooler):
    src, model = make_checkpoint(kind, family=family)
    out = wt.convert_checkpoint(src, tmp_path / "out", progress=False)
    config, tensors = wt.read_converted(out)
    assert config["model_type"] == family and config["format_version"] == wt.FORMAT_VERSION == 2
    assert (config["position_ids"], config["pad_token_id"]) == ("padding_offset", 1)
    assert config["has_pooler"] is has_pooler
    ref = hf.reference_tensors(model)
    assert list(tensors) == [n for n, _ in wt.expected_tensors(config)]
    assert set(tensors) == set(ref)
    for name, t in tensors.items():
        assert torch.equal(t, ref[name]), name


@pytest.mark.parametrize("layout", ["sharded", "bin_sharded"])
def test_roberta_from_sharded_checkpoints(wt, hf, make_checkpoint, layout):
    src, model = make_checkpoint("mlm", layout, family="roberta", type_vocab_size=1)
    config, tensors = wt.load_hf_checkpoint(src)
    assert config["type_vocab_size"] == 1 and tensors["embeddings.token_type"].shape == (1, 48)
    ref = hf.reference_tensors(model)
    assert all(torch.equal(t, ref[n]) for n, t in tensors.items())


def test_task_heads_are_ignored_and_named(wt, make_checkpoint, capsys):
    src, _ = make_checkpoint("cls", family="xlm-roberta")
    capsys.readouterr()
    wt.load_hf_checkpoint(src, progress=True)
    out = capsys.readouterr().out
    assert "xlm-roberta, 2 layers" in out
    assert "ignored 4 tensor(s) outside the encoder: classifier.dense.bias" in out


def test_missing_tensor_is_named_with_the_roberta_prefix(wt, make_checkpoint):
    from safetensors.torch import load_file, save_file

    src, _ = make_checkpoint("cls", family="camembert")
    path = src / "model.safetensors"
    sd = load_file(str(path))
    name = "roberta.encoder.layer.1.attention.self.key.bias"
    del sd[name]
    save_file(sd, str(path))
    with pytest.raises(wt.ConversionError, match=f"missing tensor '{name}'"):
        wt.load_hf_checkpoint(src)


@pytest.mark.parametrize("family", ROBERTA_FAMILY)
def test_relative_position_embeddings_are_refused(wt, make_checkpoint, family):
    src, _ = make_checkpoint("model", family=family)
    _edit_config(src, position_embedding_type="relative_key")
    with pytest.raises(wt.ConversionError, match="position_embedding_type 'relative_key' is not supported"):
        wt.load_hf_checkpoint(src)


# ---- pad_token_id ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "family, value, written",
    [
        ("roberta", 5, 5),
        ("roberta", ..., 1),  # RobertaConfig's default
        ("camembert", 0, 0),
        ("roberta", 39, 39),  # max_position_embeddings 41: one usable position is left
        ("bert", 7, 7),
        ("bert", ..., 0),
        # BERT never reads it: a config.json without a usable one still converts.
        ("bert", None, 0),
        ("bert", 500, 0),
        ("bert", "[PAD]", 0),
    ],
)
def test_pad_token_id_is_recorded(wt, make_checkpoint, family, value, written):
    src, _ = make_checkpoint("model", family=family)
    _edit_config(src, pad_token_id=value)
    config, _ = wt.load_hf_checkpoint(src)
    assert config["pad_token_id"] == written
    assert config["position_ids"] == ("absolute" if family == "bert" else "padding_offset")


@pytest.mark.parametrize(
    "value, pattern",
    [
        (None, r"pad_token_id must be an integer from 0 to vocab_size - 1 \(100\), got None"),
        (-1, "pad_token_id must be an integer .* got -1"),
        (101, "pad_token_id must be an integer .* got 101"),
        (1.0, "pad_token_id must be an integer .* got 1.0"),
        (True, "pad_token_id must be an integer .* got True"),
        (40, r"pad_token_id 40 leaves no usable position: position ids start at pad_token_id \+ 1 = 41, "
             "but max_position_embeddings is 41"),
    ],
)
def test_roberta_pad_token_id_must_leave_a_position(wt, make_checkpoint, value, pattern):
    src, _ = make_checkpoint("model", family="roberta")
    _edit_config(src, pad_token_id=value)
    with pytest.raises(wt.ConversionError, match=r"config\.json: " + pattern):
        wt.load_hf_checkpoint(src)


def test_usable_seq_length(wt):
    from importlib import import_module

    layout = import_module(wt.__name__ + ".layout")
    base = {"max_position_embeddings": 514, "pad_token_id": 1}
    assert layout.usable_seq_length({**base, "position_ids": "padding_offset"}) == 512
    assert layout.usable_seq_length({**base, "position_ids": "absolute"}) == 514
    assert layout.usable_seq_length({"max_position_embeddings": 40, "pad_token_id": 3,
                                     "position_ids": "padding_offset"}) == 36
    assert "the usable length 512 (max_position_embeddings 514 - pad_token_id 1 - 1" in layout.seq_limit_text(
        {**base, "position_ids": "padding_offset"})
    assert layout.seq_limit_text({**base, "position_ids": "absolute"}) == "max_position_embeddings 514"


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_a_decoder_config_is_refused_naming_the_key(wt, make_checkpoint, family):
    # is_decoder turns attention causal in transformers; the engine's is bidirectional.
    src, _ = make_checkpoint("model", family=family)
    cfg = json.loads((src / "config.json").read_text())
    cfg["is_decoder"] = True
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(wt.ConversionError, match="is_decoder"):
        wt.load_hf_checkpoint(src)
