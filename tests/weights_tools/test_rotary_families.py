"""What the rotary families' converter refuses, by name: settings of NomicBERT, GTE,
Jina-embeddings-v3 and EuroBERT checkpoints the engine does not run (scaled ropes, a head width
other than hidden / heads, grouped K/V heads, biases EuroBERT's unit has not) and EuroBERT's
pooling heads.
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
    ({"num_key_value_heads": 3}, "num_key_value_heads 3 does not divide num_attention_heads 2"),
    ({"attention_bias": True}, "attention_bias True is not supported"),
    ({"mlp_bias": True}, "mlp_bias True is not supported"),
])
def test_eurobert_settings_the_engine_does_not_run_are_refused(tmp_path, changes, pattern):
    make_model(tmp_path, "eurobert", hidden=32, heads=2, seed=5)
    _edit(tmp_path, **changes)
    with pytest.raises(ftbert.weights_tools.ConversionError, match=pattern):
        ftbert.Encoder.from_pretrained(tmp_path)


def test_eurobert_unknown_pooling_is_refused_by_name(tmp_path):
    make_model(tmp_path, "eurobert", kind="cls", hidden=32, heads=2, seed=6)
    _edit(tmp_path, classifier_pooling="max")
    with pytest.raises(ftbert.weights_tools.ConversionError, match="classifier_pooling 'max' is not supported"):
        ftbert.Encoder.from_pretrained(tmp_path)


@pytest.mark.parametrize("pooling, engine_input", [("mean", "mean"), ("late", "late_mean"), (None, "late_mean")])
@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("left", [False, True], ids=["right", "left"])
def test_eurobert_pooling_heads_match_transformers(tmp_path, pooling, engine_input, padding_free, left):
    # "late" (transformers' default, also when config.json leaves the key out) averages the
    # per-token logits; the engine averages the activations before the affine classifier.
    import numpy as np
    import torch

    from tests._util import ragged_mask

    hf = make_model(tmp_path, "eurobert", kind="cls", hidden=48, heads=3, num_labels=3, seed=7,
                    pooling=pooling or "late")
    if pooling is None:
        cfg = json.loads((tmp_path / "config.json").read_text())
        del cfg["classifier_pooling"]
        (tmp_path / "config.json").write_text(json.dumps(cfg))
    enc = ftbert.Encoder.from_pretrained(tmp_path, padding_free=padding_free)
    assert enc.config["head"]["input"] == engine_input
    rng = np.random.default_rng(7)
    ids = rng.integers(4, 150, (4, 13))
    mask = ragged_mask(rng, 4, 13, left=left)
    with torch.no_grad():
        want = hf(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long()).logits.numpy()
    assert np.abs(enc(ids, mask).logits - want).max() <= 1e-4



def _as_original_gte(path, theta, factor, token_types):
    """Rewrites a GteModel checkpoint at `path` into what the original code's checkpoints hold:
    model_type "new", rope_theta and an "ntk" rope_scaling, its other settings; without a token-type
    table where `token_types` is false (type_vocab_size 0)."""
    from safetensors.torch import load_file, save_file

    cfg = json.loads((path / "config.json").read_text())
    cfg.pop("rope_parameters", None)
    cfg.update(model_type="new", architectures=["NewModel"], rope_theta=theta,
               rope_scaling={"type": "ntk", "factor": factor}, layer_norm_type="layer_norm",
               position_embedding_type="rope", pack_qkv=True, unpad_inputs=False,
               logn_attention_scale=False, logn_attention_clip1=False)
    if not token_types:
        cfg["type_vocab_size"] = 0
        sd = load_file(str(path / "model.safetensors"))
        sd = {k: v for k, v in sd.items() if "token_type" not in k}
        save_file(sd, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("token_types", [True, False])
def test_gte_checkpoint_of_the_original_code_with_ntk_rope_scaling(tmp_path, token_types):
    # The reference is transformers' GteModel with the original code's fixed-NTK frequencies: those
    # of theta * factor, divided by factor^(2/d).
    import numpy as np
    import torch
    import transformers

    from tests._util import ragged_mask

    if getattr(transformers, "GteModel", None) is None:
        pytest.skip(f"transformers {transformers.__version__} has no GteModel")
    theta, factor, hidden, heads = 10000.0, 2.0, 48, 3
    hf = make_model(tmp_path, "gte", hidden=hidden, heads=heads, layers=2, seed=8, max_pos=600)
    _as_original_gte(tmp_path, theta, factor, token_types)
    enc = ftbert.Encoder.from_pretrained(tmp_path)
    # Without a table, the converter's one zero row.
    assert enc.config["model_type"] == "gte" and enc.config["type_vocab_size"] == 1
    d = hidden // heads
    assert enc.config["layer"]["rotary_theta"] == theta * factor
    assert enc.config["layer"]["rotary_scale"] == pytest.approx(factor ** (2.0 / d))
    rotary = hf.rotary_emb
    with torch.no_grad():
        inv = 1.0 / (theta * factor) ** (torch.arange(0, d, 2, dtype=torch.float) / d)
        rotary.inv_freq.copy_(inv / factor ** (2.0 / d))
        rotary.original_inv_freq.copy_(rotary.inv_freq)
        if not token_types:
            hf.embeddings.token_type_embeddings.weight.zero_()
    rng = np.random.default_rng(8)
    ids = rng.integers(3, 150, (3, 300))
    mask = ragged_mask(rng, 3, 300, left=False)
    with torch.no_grad():
        want = hf(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long()).last_hidden_state.numpy()
    got = enc(ids, mask).last_hidden_state
    assert np.abs(got - want)[mask.astype(bool)].max() <= 1e-4


@pytest.mark.parametrize("changes, pattern", [
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_scaling .* is not supported \\(only none or type 'ntk'\\)"),
    ({"logn_attention_scale": True}, "logn_attention_scale True is not supported"),
    ({"pack_qkv": False}, "pack_qkv False is not supported"),
    ({"layer_norm_type": "rms_norm"}, "layer_norm_type 'rms_norm' is not supported"),
])
def test_gte_original_settings_the_engine_does_not_run_are_refused(tmp_path, changes, pattern):
    make_model(tmp_path, "gte", hidden=32, heads=2, seed=9)
    _as_original_gte(tmp_path, 10000.0, 2.0, True)
    _edit(tmp_path, **changes)
    with pytest.raises(ftbert.weights_tools.ConversionError, match=pattern):
        ftbert.Encoder.from_pretrained(tmp_path)


def _as_original_nomic(path):
    """Rewrites a NomicBertModel checkpoint's config.json the way the hub's (the original code's)
    spells it: n_embd, n_layer, ..., activation_function "swiglu", rotary_emb_base."""
    cfg = json.loads((path / "config.json").read_text())
    theta = (cfg.pop("rope_parameters", None) or {}).get("rope_theta", 1000.0)
    for new, old in (("hidden_size", "n_embd"), ("num_hidden_layers", "n_layer"),
                     ("num_attention_heads", "n_head"), ("intermediate_size", "n_inner"),
                     ("max_position_embeddings", "n_positions"), ("layer_norm_eps", "layer_norm_epsilon")):
        cfg[old] = cfg.pop(new)
    cfg.pop("hidden_act")
    cfg.pop("head_dim", None)
    cfg.update(activation_function="swiglu", rotary_emb_base=theta, rotary_emb_fraction=1.0,
               rotary_emb_interleaved=False, rotary_scaling_factor=None, qkv_proj_bias=False,
               mlp_fc1_bias=False, mlp_fc2_bias=False, prenorm=False, causal=False)
    (path / "config.json").write_text(json.dumps(cfg))


def test_nomic_checkpoint_with_the_original_config_keys_matches_transformers(tmp_path):
    import numpy as np
    import torch

    from tests._util import ragged_mask

    hf = make_model(tmp_path, "nomic_bert", hidden=64, heads=4, layers=2, intermediate=83, seed=10)
    _as_original_nomic(tmp_path)
    enc = ftbert.Encoder.from_pretrained(tmp_path)
    c = enc.config
    assert (c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"], c["intermediate_size"],
            c["hidden_act"]) == (64, 2, 4, 83, "silu")
    rng = np.random.default_rng(10)
    ids = rng.integers(3, 150, (3, 40))
    mask = ragged_mask(rng, 3, 40, left=False)
    with torch.no_grad():
        want = hf(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long()).last_hidden_state.numpy()
    assert np.abs(enc(ids, mask).last_hidden_state - want)[mask.astype(bool)].max() <= 1e-4


@pytest.mark.parametrize("changes, pattern", [
    ({"rotary_scaling_factor": 2.0}, "rotary_scaling_factor 2.0 is not supported"),
    ({"rotary_emb_fraction": 0.5}, "rotary_emb_fraction 0.5 is not supported"),
    ({"prenorm": True}, "prenorm True is not supported"),
    ({"qkv_proj_bias": True}, "qkv_proj_bias True is not supported"),
    ({"activation_function": "gelu_fast"}, "hidden_act 'gelu_fast'"),
])
def test_nomic_original_settings_the_engine_does_not_run_are_refused(tmp_path, changes, pattern):
    make_model(tmp_path, "nomic_bert", hidden=32, heads=2, seed=11)
    _as_original_nomic(tmp_path)
    _edit(tmp_path, **changes)
    with pytest.raises(ftbert.weights_tools.ConversionError, match=pattern):
        ftbert.Encoder.from_pretrained(tmp_path)


@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "packed"])
def test_eurobert_grouped_kv_heads_match_transformers(tmp_path, kv_heads, padding_free):
    # EuroBERT-610m's kind: fewer K/V heads than query heads, repeated at conversion as
    # transformers' repeat_kv reads them.
    import numpy as np
    import torch
    import transformers

    from tests._util import ragged_mask

    torch.manual_seed(12)
    cfg = transformers.EuroBertConfig(vocab_size=157, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=kv_heads, intermediate_size=83, pad_token_id=1,
                                      bos_token_id=0, eos_token_id=2, mask_token_id=3,
                                      attn_implementation="eager")
    hf = transformers.EuroBertModel(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    hf.save_pretrained(tmp_path)
    enc = ftbert.Encoder.from_pretrained(tmp_path, padding_free=padding_free)
    rng = np.random.default_rng(12)
    ids = rng.integers(4, 150, (3, 29))
    mask = ragged_mask(rng, 3, 29, left=False)
    with torch.no_grad():
        want = hf(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long()).last_hidden_state.numpy()
    got = enc(ids, mask).last_hidden_state
    assert np.abs(got - want)[mask.astype(bool)].max() <= 1e-4
