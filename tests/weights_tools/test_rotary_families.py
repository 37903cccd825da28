"""What the rotary families' converter refuses, by name: settings of NomicBERT, GTE,
Jina-embeddings-v3 and EuroBERT checkpoints the engine does not run (scaled ropes other than
dynamic NTK, a head width other than hidden / heads, grouped K/V heads, biases EuroBERT's unit has
not) and EuroBERT's pooling heads; dynamic NTK rope scaling against transformers, sequence by
sequence. Their parity otherwise is test_head_parity.py's, driven by the family tables."""

import json

import numpy as np
import pytest

import ftbert
from tests._models import make_model
from tests.weights_tools._converted import read_config, write_config


def _edit(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("family", ["nomic_bert", "gte", "jina_embeddings_v3", "eurobert"])
@pytest.mark.parametrize("rope, pattern", [
    ({"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0}, "rope_type 'yarn' is not supported"),
    ({"rope_type": "longrope", "rope_theta": 1000.0, "factor": 4.0}, "rope_type 'longrope' is not supported"),
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


# ---- dynamic NTK rope scaling ---------------------------------------------------------------------
DYNAMIC = {"rope_type": "dynamic", "factor": 2.0}
ROTARY_BERT = ["nomic_bert", "gte", "jina_embeddings_v3"]


def _sharpened(hf, path):
    """hf with its Q and K weights 8x larger, saved again to `path`: peaked attention, where a
    sequence's angles move its outputs by ~1e-2 (random init's flat attention hides them)."""
    import torch

    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "q_proj" in name or "k_proj" in name:
                p.mul_(8.0)
    hf.save_pretrained(path)
    return hf


def _hf_alone(hf, ids, types=None):
    """transformers' last_hidden_state of each sequence run alone, [len, H] each. Its dynamic rope
    keeps the frequencies of the longest sequence seen until one within the original length comes:
    run longest last, each length once grown to, it gives every sequence its own length's."""
    import torch

    out = [None] * len(ids)
    device = next(hf.parameters()).device
    with torch.no_grad():
        for i in sorted(range(len(ids)), key=lambda i: len(ids[i])):
            x = torch.from_numpy(np.asarray(ids[i], np.int64))[None].to(device)
            t = None if types is None else torch.from_numpy(np.asarray(types[i], np.int64))[None].to(device)
            out[i] = hf(x, token_type_ids=t).last_hidden_state[0].float().cpu().numpy()
    return out


@pytest.mark.parametrize("family", ROTARY_BERT)
def test_dynamic_rope_matches_transformers_sequence_by_sequence(tmp_path, family):
    # Sequences past the original 16 positions turn with a theta grown with their own length; each
    # gets what transformers gives it alone, in any batch and through every entry.
    hf = _sharpened(make_model(tmp_path, family, hidden=64, heads=4, layers=2, intermediate=83, seed=21,
                               max_pos=16, rope=DYNAMIC), tmp_path)
    enc = ftbert.Encoder.from_pretrained(tmp_path)
    assert enc.config["max_position_embeddings"] == 32  # factor x the original positions
    assert enc.config["layer"]["rotary_dynamic_factor"] == 2.0
    assert enc.config["layer"]["rotary_original_positions"] == 16
    rng = np.random.default_rng(21)
    lengths = [32, 9, 23, 16, 17, 1, 30]
    ids = [rng.integers(3, 150, n) for n in lengths]
    want = _hf_alone(hf, ids)
    S = max(lengths)
    batch = np.zeros((len(ids), S), np.int64)
    mask = np.zeros((len(ids), S), np.int32)
    for b, x in enumerate(ids):
        batch[b, :len(x)], mask[b, :len(x)] = x, 1
    for mode in ("auto", False, True):
        enc.padding_free = mode
        assert enc.padding_free_for(2, 32, 64)  # no padding, packed all the same
        got = enc(batch, mask).last_hidden_state
        for b, n in enumerate(lengths):
            assert np.abs(got[b, :n] - want[b]).max() <= 1e-4, (mode, n)
    packed = enc.forward_packed(np.concatenate(ids), np.cumsum([0] + lengths)).last_hidden_state
    assert np.abs(packed - np.concatenate(want)).max() <= 1e-4
    # Alone or in the batch: the same sequence, the same angles.
    alone = enc(batch[1:2, :9], mask[1:2, :9]).last_hidden_state[0]
    np.testing.assert_array_equal(alone, got[1, :9])  # the CPU kernels are batch invariant


def test_nomic_rotary_scaling_factor_of_the_original_code_is_dynamic_rope(tmp_path):
    # The hub's nomic-embed-text-v1.5 reaches 8,192 tokens with rotary_scaling_factor set: dynamic
    # NTK past max_trained_positions, up to n_positions.
    hf = _sharpened(make_model(tmp_path, "nomic_bert", hidden=64, heads=4, layers=2, intermediate=83,
                               seed=22, max_pos=16, rope=DYNAMIC), tmp_path)
    _as_original_nomic(tmp_path)
    _edit(tmp_path, rotary_scaling_factor=2.0, max_trained_positions=16, n_positions=40)
    enc = ftbert.Encoder.from_pretrained(tmp_path)
    assert enc.config["max_position_embeddings"] == 40
    assert (enc.config["layer"]["rotary_dynamic_factor"], enc.config["layer"]["rotary_original_positions"]) == (2.0, 16)
    rng = np.random.default_rng(22)
    lengths = [40, 12, 27]
    ids = [rng.integers(3, 150, n) for n in lengths]
    want = _hf_alone(hf, ids)
    got = enc.forward_packed(np.concatenate(ids), np.cumsum([0] + lengths)).last_hidden_state
    assert np.abs(got - np.concatenate(want)).max() <= 1e-4


def test_dynamic_rope_refuses_a_padded_forward(tmp_path):
    make_model(tmp_path, "nomic_bert", hidden=32, heads=2, seed=23, max_pos=16, rope=DYNAMIC)
    enc = ftbert.Encoder.from_pretrained(tmp_path)
    ids = np.full((2, 20), 5)
    with pytest.raises(ValueError, match=r"padded=True .*\(dynamic rope scaling\)"):
        enc(ids, np.ones_like(ids), padded=True)


@pytest.mark.parametrize("family, changes, pattern", [
    ("nomic_bert", {"rope_parameters": {"rope_type": "dynamic", "factor": 0}}, "rope_parameters.factor must be a positive number, got 0"),
    ("gte", {"rope_parameters": {"rope_type": "dynamic", "factor": "2"}}, "rope_parameters.factor must be a positive number, got '2'"),
    ("jina_embeddings_v3", {"rope_parameters": {"rope_type": "dynamic"}}, "rope_parameters.factor must be a positive number, got None"),
    ("nomic_bert", {"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling .* is not supported \\(only none or type 'dynamic'\\)"),
    ("nomic_bert", {"rotary_scaling_factor": 2.0, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0}},
     "rotary_scaling_factor and a dynamic rope_parameters both scale the rope"),
    ("nomic_bert", {"rotary_scaling_factor": -1.0}, "rotary_scaling_factor must be a positive number, got -1.0"),
    ("nomic_bert", {"rotary_scaling_factor": 2.0, "max_trained_positions": 0}, "original positions as a positive integer, got 0"),
    ("eurobert", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, "rope_type 'dynamic' is not supported by EuroBERT"),
])
def test_bad_dynamic_rope_settings_are_refused_by_name(tmp_path, family, changes, pattern):
    make_model(tmp_path, family, hidden=32, heads=2, seed=24)
    _edit(tmp_path, **changes)
    with pytest.raises(ftbert.weights_tools.ConversionError, match=pattern):
        ftbert.Encoder.from_pretrained(tmp_path)


def test_an_older_rope_scaling_dynamic_is_read_as_rope_parameters(tmp_path):
    hf = _sharpened(make_model(tmp_path, "gte", hidden=32, heads=2, seed=25, max_pos=16, rope=DYNAMIC), tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    theta = cfg.pop("rope_parameters")["rope_theta"]
    _edit(tmp_path, rope_scaling={"type": "dynamic", "factor": 2.0}, rope_theta=theta)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.pop("rope_parameters", None)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    enc = ftbert.Encoder.from_pretrained(tmp_path)
    ids = [np.random.default_rng(25).integers(3, 150, 29)]
    assert np.abs(enc.forward_packed(ids[0], [0, 29]).last_hidden_state - _hf_alone(hf, ids)[0]).max() <= 1e-4


@pytest.mark.parametrize("layer, pattern", [
    ({"rotary_dynamic_factor": 2.0, "rotary_original_positions": 0}, "rotary_original_positions must be a positive integer"),
    ({"rotary_dynamic_factor": 0.0, "rotary_original_positions": 8}, "rotary_original_positions must be a positive integer"),
    ({"rotary_dynamic_factor": -2.0, "rotary_original_positions": 8}, "rotary_dynamic_factor must be 0 \\(none\\) or a positive"),
    ({"rotary_dynamic_factor": 2.0, "rotary_original_positions": 33}, "rotary_original_positions 33 is more than"),
])
def test_a_converted_dynamic_rope_is_checked_at_load(tmp_path, layer, pattern):
    make_model(tmp_path / "hf", "nomic_bert", hidden=32, heads=2, seed=26, max_pos=16, rope=DYNAMIC)
    out = ftbert.weights_tools.convert_checkpoint(tmp_path / "hf", tmp_path / "out", progress=False)
    cfg = read_config(out)
    cfg["layer"].update(layer)
    write_config(out, cfg)
    with pytest.raises(ftbert.weights_tools.FormatError, match=pattern):
        ftbert.Encoder.from_pretrained(out)


def test_a_layer_written_before_dynamic_rope_loads_unscaled(tmp_path):
    # Converted directories from before the two keys: no dynamic scaling, the same outputs.
    make_model(tmp_path / "hf", "nomic_bert", hidden=32, heads=2, seed=27, max_pos=64)
    out = ftbert.weights_tools.convert_checkpoint(tmp_path / "hf", tmp_path / "out", progress=False)
    ids = np.random.default_rng(27).integers(3, 150, (2, 40))
    want = ftbert.Encoder.from_pretrained(out)(ids).last_hidden_state
    cfg = read_config(out)
    del cfg["layer"]["rotary_dynamic_factor"], cfg["layer"]["rotary_original_positions"]
    write_config(out, cfg)
    enc = ftbert.Encoder.from_pretrained(out)
    assert (enc.config["layer"]["rotary_dynamic_factor"], enc.config["layer"]["rotary_original_positions"]) == (0.0, 0)
    np.testing.assert_array_equal(enc(ids).last_hidden_state, want)
