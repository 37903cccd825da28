"""Architecture units (cpp/core/models/): the engine config's "architecture" chooses the unit that
runs a model (create_model); the family table names it (weights_tools/families.py); a name the
build does not run is refused with the ones it does."""

import numpy as np
import pytest
import torch

import ftbert
from ftbert import _C
from ftbert.encoder import _host_tensor
from ftbert.weights_tools.schema import engine_config
from ftbert.weights_tools import load_hf_checkpoint
from tests._models import family_kinds, make_bert, make_model


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("bert-units")
    make_bert(path, hidden=48, heads=3, layers=2, intermediate=72, seed=9)
    return path


def native(config, tensors, **changes):
    weights = {name: _host_tensor(t) for name, t in tensors.items()}
    return _C.Encoder({**config, **changes}, weights, "cpu", "float32")


def test_the_family_table_names_the_unit_and_the_config_carries_it(bert_dir):
    config, _ = load_hf_checkpoint(bert_dir)
    assert "architecture" not in config  # the converted format records the family, not the unit
    assert engine_config(config)["architecture"] == "bert"


def test_a_config_without_an_architecture_runs_bert_as_before(bert_dir, rng):
    config, tensors = load_hf_checkpoint(bert_dir)
    ids = rng.integers(0, config["vocab_size"], size=(3, 11)).astype(np.int32)
    mask = np.ones_like(ids)
    types = np.zeros_like(ids)
    plain = native(config, tensors).forward_host(ids, mask, types, False)
    named = native(config, tensors, architecture="bert").forward_host(ids, mask, types, False)
    np.testing.assert_array_equal(plain[0], named[0])
    want = ftbert.Encoder.from_pretrained(bert_dir)(ids, mask, types).last_hidden_state
    np.testing.assert_array_equal(plain[0], want)


@pytest.mark.parametrize("name", ["albert", "", "BERT"])
def test_an_architecture_the_build_does_not_run_is_refused_by_name(bert_dir, name):
    config, tensors = load_hf_checkpoint(bert_dir)
    with pytest.raises(ValueError, match=rf"architecture '{name}' is not one this build runs \('bert'"):
        native(config, tensors, architecture=name)


def test_an_unknown_model_type_is_refused_before_the_engine(bert_dir):
    config, _ = load_hf_checkpoint(bert_dir)
    with pytest.raises(ValueError, match="model_type 'albert' is not one ftbert runs"):
        engine_config({**config, "model_type": "albert"})


@pytest.mark.parametrize("family,kind", family_kinds(("model", "cls", "token")))
def test_the_schema_repeats_the_engine_s_layers(tmp_path, family, kind):
    # weights_tools/schema.py asks the engine (cpp/core/weights.cpp) for two layers and repeats the
    # second's pattern: the same list as the engine's own for every layer count, every family and
    # head (MPNet's relative bias table, ModernBERT's first layer and heads, ELECTRA's projection).
    from ftbert.weights_tools.schema import iter_tensors

    make_model(tmp_path, family, kind, hidden=48, heads=3, layers=2, seed=12)
    config, tensors = load_hf_checkpoint(tmp_path)
    for layers in (1, 2, 5):
        cfg = engine_config({**config, "num_hidden_layers": layers})
        assert [(t.name, t.shape, t.table, t.gemm_weight) for t in iter_tensors(cfg)] == \
            [(n, tuple(s), table, gemm) for n, s, table, gemm in _C.expected_tensors(cfg)]
    tables = {t.name for t in iter_tensors(engine_config(config)) if t.table}
    assert tables == {n for n in tensors if n.startswith("embeddings.") and n[11:] in ("word", "position",
                      "token_type")} | {n for n in tensors if n in ("encoder.relative_attention_bias",
                                                                     "encoder.rel_embeddings")}


def test_the_bert_unit_refuses_a_relative_bias_it_would_drop(bert_dir):
    config, tensors = load_hf_checkpoint(bert_dir)
    table = torch.zeros(32, config["num_attention_heads"])
    with pytest.raises(ValueError, match="architecture 'bert' adds no relative position bias"):
        native(config, {**tensors, "encoder.relative_attention_bias": table},
               relative_attention_num_buckets=32)


def test_an_mpnet_unit_without_its_bias_table_is_refused(bert_dir):
    config, tensors = load_hf_checkpoint(bert_dir)
    with pytest.raises(ValueError, match="an MPNet model needs its relative_attention_num_buckets"):
        native(config, tensors, architecture="mpnet")
    with pytest.raises(RuntimeError, match="missing tensor 'encoder.relative_attention_bias'"):
        native(config, tensors, architecture="mpnet", relative_attention_num_buckets=32)
