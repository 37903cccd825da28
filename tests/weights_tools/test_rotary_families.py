"""What the rotary families' converter refuses, by name: settings of NomicBERT, GTE,
Jina-embeddings-v3 and EuroBERT checkpoints the engine does not run (scaled ropes, a head width
other than hidden / heads, grouped K/V heads, biases EuroBERT's unit has not, its "late" head).
Their parity is test_head_parity.py's, driven by the family tables."""

import json

import pytest

import ftbert
from tests._models import make_model


def _edit(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("family", ["nomic_bert", "gte", "jina_embeddings_v3", "eurobert"])
@pytest.mark.parametrize("rope, pattern", [
    ({"rope_type": "dynamic", "rope_theta": 1000.0, "factor": 2.0}, "rope_type 'dynamic' is not supported"),
    ({"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0}, "rope_type 'yarn' is not supported"),
])
def test_a_scaled_rope_is_refused_by_name(tmp_path, family, rope, pattern):
    make_model(tmp_path, family, hidden=32, heads=2, seed=3)
    _edit(tmp_path, rope_parameters=rope)
    with pytest.raises(ftbert.weights_tools.ConversionError, match=pattern):
        ftbert.Encoder.from_pretrained(tmp_path)


def test_a_head_width_other_than_hidden_over_heads_is_refused(tmp_path):
    make_model(tmp_path, "nomic_bert", hidden=32, heads=2, seed=4)
    _edit(tmp_path, head_dim=8)
    with pytest.raises(ftbert.weights_tools.ConversionError, match="head_dim 8 is not hidden_size / num_attention_heads"):
        ftbert.Encoder.from_pretrained(tmp_path)


@pytest.mark.parametrize("changes, pattern", [
    ({"num_key_value_heads": 1}, "num_key_value_heads 1 is not num_attention_heads 2: grouped K/V heads"),
    ({"attention_bias": True}, "attention_bias True is not supported"),
    ({"mlp_bias": True}, "mlp_bias True is not supported"),
])
def test_eurobert_settings_the_engine_does_not_run_are_refused(tmp_path, changes, pattern):
    make_model(tmp_path, "eurobert", hidden=32, heads=2, seed=5)
    _edit(tmp_path, **changes)
    with pytest.raises(ftbert.weights_tools.ConversionError, match=pattern):
        ftbert.Encoder.from_pretrained(tmp_path)


def test_eurobert_late_pooling_head_is_refused_by_name(tmp_path):
    # "late" (transformers' default) averages per-token logits: a head the engine does not run.
    make_model(tmp_path, "eurobert", kind="cls", hidden=32, heads=2, seed=6)
    _edit(tmp_path, classifier_pooling="late")
    with pytest.raises(ftbert.weights_tools.ConversionError, match="classifier_pooling 'late' is not supported"):
        ftbert.Encoder.from_pretrained(tmp_path)


def test_eurobert_mean_pooling_head_matches_transformers(tmp_path):
    import numpy as np
    import torch

    from tests._util import ragged_mask

    hf = make_model(tmp_path, "eurobert", kind="cls", hidden=48, heads=3, num_labels=3, seed=7, pooling="mean")
    enc = ftbert.Encoder.from_pretrained(tmp_path)
    assert enc.config["head"]["input"] == "mean"
    rng = np.random.default_rng(7)
    ids = rng.integers(4, 150, (4, 13))
    mask = ragged_mask(rng, 4, 13, left=False)
    with torch.no_grad():
        want = hf(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long()).logits.numpy()
    assert np.abs(enc(ids, mask).logits - want).max() <= 1e-4
