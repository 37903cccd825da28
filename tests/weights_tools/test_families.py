"""The family tables (families.py), the RoBERTa family's checkpoints (roberta, xlm-roberta and
camembert convert like BERT under their own prefix, defaults and position ids), DistilBERT's
(other config keys and names, no token types: a zero one-row table, no pooler), and ELECTRA's
(BERT's names under "electra.", embeddings of embedding_size projected to hidden_size, no pooler)."""

from __future__ import annotations

import json

import pytest
import torch

MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "camembert", "distilbert", "electra", "mpnet", "modernbert",
               "nomic_bert", "gte", "jina_embeddings_v3", "eurobert", "deberta-v2")
ROBERTA_FAMILY = ("roberta", "xlm-roberta", "camembert")
# model_type values a family reads besides its own name: GTE's checkpoints of the original code.
ALIASES = {"new": "gte"}


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
    assert set(families.supported_model_types()) == {*MODEL_TYPES, *ALIASES}
    assert tuple(wt.FAMILIES) == MODEL_TYPES
    for t in MODEL_TYPES:
        aliases = tuple(a for a, f in ALIASES.items() if f == t)
        assert wt.family_for(t).name == t and wt.family_for(t).model_types == (t, *aliases)
    for alias, name in ALIASES.items():
        assert wt.family_for(alias).name == name
    for other in ("BERT", "DistilBERT", "ELECTRA", "albert", None, 3, ["bert"]):
        assert wt.family_for(other) is None


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_config_defaults_are_those_of_the_transformers_config_class(wt, hf, model_type):
    # A key left out of config.json must mean what transformers makes of it.
    config_cls, _ = hf.model_classes(model_type)
    reference = config_cls()
    family = wt.family_for(model_type)
    for engine_key, key in family.config.items():
        if key.hf is None:  # fixed by the family: DistilBERT's eps, absent token types
            assert ((model_type, engine_key) == ("distilbert", "layer_norm_eps")
                    or (engine_key == "type_vocab_size" and not family.token_types))
            continue
        assert key.default == getattr(reference, key.hf), f"{model_type}: {engine_key}"
        for alias in key.aliases:  # attribute_map names read the same attribute; the others are
            # the original code's names (NomicBERT's, read by test_rotary_families.py)
            assert reference.attribute_map.get(alias, key.hf) == key.hf, f"{model_type}: {alias}"
    if family.projection is not None:
        size = family.projection.size
        assert size.default == getattr(reference, size.hf), f"{model_type}: embedding_size"


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_task_model_prefix_is_the_transformers_base_model_prefix(wt, hf, model_type):
    for kind in ("mlm", "cls"):
        _, cls = hf.model_classes(model_type, kind)
        # The first is the one transformers writes; GTE's checkpoints of the original code use "new.".
        assert wt.family_for(model_type).weights.prefixes[0] == cls.base_model_prefix + "."


def test_roberta_family_differs_from_bert_only_where_transformers_does(wt):
    bert = wt.family_for("bert")
    for t in ROBERTA_FAMILY:
        f = wt.family_for(t)
        assert f.position_ids == "padding_offset" and bert.position_ids == "absolute"
        assert f.config["pad_token_id"].default == 1
        # The encoder's tensors are BertModel's names: only the task-model prefix differs.
        assert f.weights.embeddings == bert.weights.embeddings
        assert f.weights.layer == bert.weights.layer and f.weights.layer_prefix == bert.weights.layer_prefix
        assert f.weights.pooler == bert.weights.pooler
        # RobertaClassificationHead: a dense and tanh of its own on token 0, then out_proj.
        assert f.sequence_head.dense == ("classifier.dense.weight", "classifier.dense.bias")
        assert f.sequence_head.activation == "tanh" and f.token_head == bert.token_head
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


def test_unsupported_heads_are_left_out_and_named(wt, make_checkpoint, capsys):
    src, _ = make_checkpoint("mlm", family="xlm-roberta")
    capsys.readouterr()
    with pytest.warns(UserWarning, match=r"XLMRobertaForMaskedLM is not supported and is left out \(5 tensor"):
        wt.load_hf_checkpoint(src, progress=True)
    out = capsys.readouterr().out
    assert "xlm-roberta, 2 layers" in out
    assert "left out 5 tensor(s) outside the encoder: lm_head.bias" in out


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


# ---- DistilBERT --------------------------------------------------------------------------------


def test_distilbert_table_has_no_token_types_and_no_pooler(wt):
    f = wt.family_for("distilbert")
    assert f.position_ids == "absolute" and not f.token_types and f.projection is None
    assert dict(f.weights.pooler) == {}
    assert f.sequence_head.dense == ("pre_classifier.weight", "pre_classifier.bias")
    assert f.sequence_head.activation == "relu"
    assert "embeddings.token_type" not in f.weights.embeddings
    assert (f.config["type_vocab_size"].hf, f.config["type_vocab_size"].default) == (None, 1)
    assert (f.config["layer_norm_eps"].hf, f.config["layer_norm_eps"].default) == (None, 1e-12)
    assert f.weights.roots() == {"embeddings", "transformer"}


def test_every_family_names_an_architecture_the_engine_runs(wt):
    from ftbert import _C

    units = _C.architectures()
    assert "bert" in units
    for name, family in wt.FAMILIES.items():
        assert family.architecture in units, name


def test_a_table_without_an_architecture_unit_is_refused(wt):
    from dataclasses import replace
    from importlib import import_module

    families = import_module(wt.__name__ + ".families")
    for bad in ("", "bert-2", None):
        with pytest.raises(AssertionError, match="must name an architecture unit"):
            families._check(replace(wt.family_for("bert"), architecture=bad))


def test_a_table_with_a_token_type_key_but_no_token_types_is_refused(wt):
    from dataclasses import replace
    from importlib import import_module

    families = import_module(wt.__name__ + ".families")
    f = wt.family_for("distilbert")
    bad = replace(f, config={**f.config, "type_vocab_size": families.Key("type_vocab_size", 2)})
    with pytest.raises(AssertionError, match="type_vocab_size is fixed at 1"):
        families._check(bad)


@pytest.mark.parametrize("kind", ["model", "mlm", "cls"])
@pytest.mark.parametrize("layout", ["safetensors", "bin_sharded"])
def test_distilbert_roundtrip_is_exact(wt, hf, make_checkpoint, tmp_path, kind, layout):
    src, model = make_checkpoint(kind, layout, family="distilbert")
    out = wt.convert_checkpoint(src, tmp_path / "out", progress=False)
    config, tensors = wt.read_converted(out)
    assert config["model_type"] == "distilbert" and config["format_version"] == wt.FORMAT_VERSION
    assert (config["position_ids"], config["pad_token_id"]) == ("absolute", 0)
    assert (config["type_vocab_size"], config["layer_norm_eps"], config["has_pooler"]) == (1, 1e-12, False)
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
            config["intermediate_size"]) == (48, 2, 3, 80)
    ref = hf.reference_tensors(model)
    assert list(tensors) == [n for n, _ in wt.expected_tensors(config)]
    assert set(tensors) == set(ref)
    for name, t in tensors.items():
        assert torch.equal(t, ref[name]), name
    assert not tensors["embeddings.token_type"].any() and tensors["embeddings.token_type"].shape == (1, 48)


def test_distilbert_state_dict_inverts_the_relayout(wt, make_checkpoint):
    from importlib import import_module

    hf_mod = import_module(wt.__name__ + ".hf")
    src, model = make_checkpoint("model", family="distilbert")
    config, tensors = wt.load_hf_checkpoint(src)
    sd = hf_mod.hf_state_dict(wt.family_for("distilbert"), config, tensors)
    want = {k: v for k, v in model.state_dict().items() if k != "embeddings.position_ids"}
    assert set(sd) == set(want)
    assert all(torch.equal(sd[k], want[k].float()) for k in want)


def test_distilbert_classifier_is_converted_and_named(wt, make_checkpoint, capsys):
    src, _ = make_checkpoint("cls", family="distilbert")
    capsys.readouterr()
    config, tensors = wt.load_hf_checkpoint(src, progress=True)
    out = capsys.readouterr().out
    assert "distilbert, 2 layers, hidden 48, 3 heads, intermediate 80" in out and "pooler no" in out
    assert "sequence classification head of 2 label(s)" in out
    assert "left out" not in out and "unrecognised" not in out
    assert (config["head"]["input"], config["head"]["activation"]) == ("first_token", "relu")


def test_distilbert_config_keys_and_their_aliases(wt, make_checkpoint):
    # save_pretrained writes dim / n_layers / n_heads / hidden_dim / activation; transformers also
    # reads hidden_size / num_hidden_layers / num_attention_heads (attribute_map), and so do we.
    src, _ = make_checkpoint("model", family="distilbert", hidden_act="relu")
    config, _ = wt.load_hf_checkpoint(src)
    assert config["hidden_act"] == "relu"
    cfg = json.loads((src / "config.json").read_text())
    renamed = {"dim": "hidden_size", "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads"}
    for old, new in renamed.items():
        cfg[new] = cfg.pop(old)
    (src / "config.json").write_text(json.dumps(cfg))
    assert wt.load_hf_checkpoint(src)[0] == config
    _edit_config(src, num_attention_heads=4, n_heads=3)  # the alias wins, as in transformers
    assert wt.load_hf_checkpoint(src)[0]["num_attention_heads"] == 4


def test_distilbert_unsupported_activation_is_refused(wt, make_checkpoint):
    src, _ = make_checkpoint("model", family="distilbert")
    _edit_config(src, activation="quick_gelu")
    with pytest.raises(wt.ConversionError, match="hidden_act 'quick_gelu' is not supported"):
        wt.load_hf_checkpoint(src)


def test_distilbert_sinusoidal_positions_read_the_stored_table(wt, hf, make_checkpoint):
    # sinusoidal_pos_embds only picks transformers' initialisation: the table is saved like a
    # learned one, and converted from the checkpoint (here random, so any recomputation would show).
    src, model = make_checkpoint("model", family="distilbert", sinusoidal_pos_embds=True)
    _, tensors = wt.load_hf_checkpoint(src)
    assert torch.equal(tensors["embeddings.position"], hf.reference_tensors(model)["embeddings.position"])


def test_distilbert_missing_tensor_is_named_with_its_prefix(wt, make_checkpoint):
    from safetensors.torch import load_file, save_file

    src, _ = make_checkpoint("mlm", family="distilbert")
    path = src / "model.safetensors"
    sd = load_file(str(path))
    name = "distilbert.transformer.layer.1.attention.k_lin.bias"
    del sd[name]
    save_file(sd, str(path))
    with pytest.raises(wt.ConversionError, match=f"missing tensor '{name}'"):
        wt.load_hf_checkpoint(src)


def test_distilbert_layer_beyond_n_layers_names_the_key(wt, make_checkpoint):
    src, _ = make_checkpoint("model", family="distilbert")
    _edit_config(src, n_layers=1)
    with pytest.raises(wt.ConversionError, match="belongs to layer 1, but config.json says n_layers=1"):
        wt.load_hf_checkpoint(src)


# ---- ELECTRA -----------------------------------------------------------------------------------


def test_electra_table_is_berts_under_its_prefix_with_a_projection(wt):
    f, bert = wt.family_for("electra"), wt.family_for("bert")
    assert f.position_ids == "absolute" and f.token_types and dict(f.weights.pooler) == {}
    # ElectraClassificationHead has GELU (erf) where RoBERTa's has tanh.
    assert f.sequence_head.activation == "gelu" and f.sequence_head.out[0] == "classifier.out_proj.weight"
    assert f.weights.prefixes == ("electra.",)
    assert f.weights.embeddings == bert.weights.embeddings
    assert f.weights.layer == bert.weights.layer and f.weights.layer_prefix == bert.weights.layer_prefix
    assert f.accepted_values == bert.accepted_values
    p = f.projection
    assert (p.size.hf, p.size.default) == ("embedding_size", 128)
    assert (p.weight, p.bias) == ("embeddings_project.weight", "embeddings_project.bias")
    assert f.hf_names("embeddings.project_weight") == ("embeddings_project.weight",)
    assert f.hf_names("embeddings.project_bias") == ("embeddings_project.bias",)
    assert f.hf_names("layers.1.qkv_bias") == bert.weights.hf_names("layers.1.qkv_bias")
    assert f.roots() == {"embeddings", "embeddings_project", "encoder"}
    for other in wt.FAMILIES.values():
        assert (other.projection is None) is (other.name != "electra")


def test_expected_tensors_place_the_projection_after_the_embeddings(wt):
    base = {"vocab_size": 11, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
            "intermediate_size": 5, "max_position_embeddings": 7, "type_vocab_size": 2,
            "layer_norm_eps": 1e-12, "hidden_act": "gelu", "has_pooler": False}
    projected = wt.expected_tensors({**base, "embedding_size": 4})
    assert projected[:7] == [
        ("embeddings.word", (11, 4)), ("embeddings.position", (7, 4)), ("embeddings.token_type", (2, 4)),
        ("embeddings.ln_gamma", (4,)), ("embeddings.ln_beta", (4,)),
        ("embeddings.project_weight", (4, 8)), ("embeddings.project_bias", (8,)),
    ]
    assert projected[7][0] == "layers.0.qkv_weight"
    plain = wt.expected_tensors(base)
    assert wt.expected_tensors({**base, "embedding_size": 8}) == plain  # E == H: no projection
    assert [n for n, _ in plain if n.startswith("embeddings.")] == [
        "embeddings.word", "embeddings.position", "embeddings.token_type", "embeddings.ln_gamma",
        "embeddings.ln_beta"]


@pytest.mark.parametrize("kind", ["model", "pretrain", "cls", "mlm"])
@pytest.mark.parametrize("layout", ["safetensors", "bin_sharded"])
def test_electra_roundtrip_is_exact(wt, hf, make_checkpoint, tmp_path, kind, layout):
    src, model = make_checkpoint(kind, layout, family="electra")
    out = wt.convert_checkpoint(src, tmp_path / "out", progress=False)
    config, tensors = wt.read_converted(out)
    assert config["model_type"] == "electra" and config["format_version"] == wt.FORMAT_VERSION
    assert (config["position_ids"], config["pad_token_id"], config["has_pooler"]) == ("absolute", 0, False)
    assert (config["embedding_size"], config["hidden_size"], config["type_vocab_size"]) == (32, 48, 3)
    ref = hf.reference_tensors(model)
    assert list(tensors) == [n for n, _ in wt.expected_tensors(config)] == list(ref)
    for name, t in tensors.items():
        assert torch.equal(t, ref[name]), name
    assert tensors["embeddings.project_weight"].shape == (32, 48)
    assert tensors["embeddings.word"].shape == (101, 32)


def test_electra_with_embedding_size_equal_to_hidden_has_no_projection(wt, hf, make_checkpoint):
    # transformers builds no embeddings_project then; nor is there an engine tensor for one.
    src, model = make_checkpoint("pretrain", family="electra", embedding_size=48)
    assert not hasattr(hf.backbone(model), "embeddings_project")
    config, tensors = wt.load_hf_checkpoint(src)
    assert config["embedding_size"] == config["hidden_size"] == 48
    assert not any("project" in n for n in tensors)
    ref = hf.reference_tensors(model)
    assert list(tensors) == list(ref) and all(torch.equal(t, ref[n]) for n, t in tensors.items())


@pytest.mark.parametrize("embedding_size", [32, 48])
def test_electra_state_dict_inverts_the_relayout(wt, make_checkpoint, embedding_size):
    from importlib import import_module

    hf_mod = import_module(wt.__name__ + ".hf")
    src, model = make_checkpoint("model", family="electra", embedding_size=embedding_size)
    config, tensors = wt.load_hf_checkpoint(src)
    sd = hf_mod.hf_state_dict(wt.family_for("electra"), config, tensors)
    want = model.state_dict()
    assert set(sd) == set(want)
    assert all(torch.equal(sd[k], want[k].float()) for k in want)


def test_electra_pretraining_head_is_left_out_and_named(wt, make_checkpoint, capsys):
    src, _ = make_checkpoint("pretrain", family="electra")
    capsys.readouterr()
    with pytest.warns(UserWarning, match="ElectraForPreTraining is not supported and is left out"):
        wt.load_hf_checkpoint(src, progress=True)
    out = capsys.readouterr().out
    assert "electra, 2 layers, hidden 48, 3 heads, intermediate 80" in out and "pooler no" in out
    assert "embeddings 32 projected to 48" in out
    assert "left out 4 tensor(s) outside the encoder: discriminator_predictions." in out
    assert "unrecognised" not in out


def test_electra_embedding_size_default_is_electras(wt, make_checkpoint):
    # A config.json without embedding_size means ElectraConfig's 128: the 32-wide tables then
    # disagree with it, and the message names the tensor.
    src, _ = make_checkpoint("model", family="electra")
    _edit_config(src, embedding_size=...)
    with pytest.raises(wt.ConversionError, match=r"'embeddings.word_embeddings.weight' has shape \[101, 32\], "
                                                 r"but config.json implies \[101, 128\]"):
        wt.load_hf_checkpoint(src)


@pytest.mark.parametrize("value", [0, -1, 32.0, "32", None, True, 2**31])
def test_electra_bad_embedding_size_is_refused(wt, make_checkpoint, value):
    src, _ = make_checkpoint("model", family="electra")
    _edit_config(src, embedding_size=value)
    with pytest.raises(wt.ConversionError, match=r"config\.json: embedding_size must be a positive integer"):
        wt.load_hf_checkpoint(src)


def test_electra_huge_embedding_size_fails_before_any_read(wt, make_checkpoint):
    src, _ = make_checkpoint("model", family="electra")
    _edit_config(src, embedding_size=10**9)
    with pytest.raises(wt.ConversionError, match=r"embedding_size=1000000000\) imply .*embeddings.word "
                                                 r"\[101, 1000000000\]"):
        wt.load_hf_checkpoint(src)


def test_electra_missing_projection_is_named_with_its_prefix(wt, make_checkpoint):
    from safetensors.torch import load_file, save_file

    src, _ = make_checkpoint("cls", family="electra")
    path = src / "model.safetensors"
    sd = load_file(str(path))
    del sd["electra.embeddings_project.bias"]
    save_file(sd, str(path))
    with pytest.raises(wt.ConversionError, match="missing tensor 'electra.embeddings_project.bias'"):
        wt.load_hf_checkpoint(src)


def test_electra_projection_of_the_wrong_shape_is_refused(wt, make_checkpoint):
    from safetensors.torch import load_file, save_file

    src, _ = make_checkpoint("model", family="electra")
    path = src / "model.safetensors"
    sd = load_file(str(path))
    sd["embeddings_project.weight"] = sd["embeddings_project.weight"].T.contiguous()
    save_file(sd, str(path))
    with pytest.raises(wt.ConversionError, match=r"'embeddings_project.weight' has shape \[32, 48\], but "
                                                 r"config.json implies \[48, 32\]"):
        wt.load_hf_checkpoint(src)


@pytest.mark.parametrize("changes, pattern", [
    ({"position_embedding_type": "relative_key"}, "position_embedding_type 'relative_key' is not supported"),
    ({"is_decoder": True}, "is_decoder"),
])
def test_electra_refuses_what_the_engine_does_not_compute(wt, make_checkpoint, changes, pattern):
    src, _ = make_checkpoint("model", family="electra")
    _edit_config(src, **changes)
    with pytest.raises(wt.ConversionError, match=pattern):
        wt.load_hf_checkpoint(src)
