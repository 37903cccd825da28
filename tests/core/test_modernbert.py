"""ModernBERT on the CPU against transformers' ModernBertModel (eager attention): rotary positions
with the global and the local theta, sliding-window layers (sequences far past the window) and
global ones, the gated MLP, pre-LayerNorm and the final norm; right and left padding and holes
inside a sequence, both attention paths, padded and packed; float32 within 1e-4, bfloat16 (where
the CPU has it) within twice transformers' own bfloat16 error + 1e-3; and what a ModernBERT
setting the engine does not run gets."""

import copy
import json

import numpy as np
import pytest
import torch

import ftbert
from ftbert import _C
from tests._models import make_modernbert, widen_head
from tests._util import padded_ids

TOL = 1e-4


@pytest.fixture(scope="module")
def modernbert(tmp_path_factory):
    # 5 layers, global every 3rd (0 and 3), windows of ±8; head dim 32; odd intermediate.
    path = tmp_path_factory.mktemp("modernbert")
    hf = make_modernbert(path, hidden=96, heads=3, layers=5, vocab=157, window=16, every=3, seed=4)
    return path, hf


def inputs(rng, hf, batch, seq, style):
    return padded_ids(rng, hf.config, batch, seq, style)


def reference(hf, ids, mask):
    with torch.no_grad():
        out = hf(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long())
    return out.last_hidden_state.float().numpy()


def test_the_engine_config_carries_modernbert_s_layer(modernbert):
    path, hf = modernbert
    enc = ftbert.Encoder.from_pretrained(path)
    assert enc.config["layer"] == {"rotary_theta": 160000.0, "local_rotary_theta": 10000.0,
                                   "local_window": 8, "global_every": 3, "gated_mlp": True,
                                   "rotary_scale": 1.0, "rotary_dynamic_factor": 0.0,
                                   "rotary_original_positions": 0}
    assert enc.config["max_position_embeddings"] == hf.config.max_position_embeddings
    assert enc(np.ones((1, 4), np.int64)).pooler_output is None  # no pooler


@pytest.mark.parametrize("attention", ["unfused", "flash"])
@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("batch,seq,style", [(3, 100, "right"), (2, 61, "left"), (3, 47, "holes"),
                                             (1, 1, "right"), (2, 5, "right")])
def test_hidden_states_match_transformers_float32(modernbert, rng, attention, padding_free, batch,
                                                  seq, style):
    path, hf = modernbert
    enc = ftbert.Encoder.from_pretrained(path, attention=attention, padding_free=padding_free)
    ids, mask = inputs(rng, hf, batch, seq, style)
    want = reference(hf, ids, mask)
    out = enc(ids, mask).last_hidden_state
    assert np.isfinite(out).all()
    err = np.abs(out - want)[mask.astype(bool)].max()
    assert err <= TOL, f"hidden {err:.2e}"


def test_a_long_sequence_matches_transformers(tmp_path, rng):
    # Far past the window and past one CPU key block (256): the sliding layers skip blocks.
    hf = make_modernbert(tmp_path, hidden=64, heads=2, layers=3, window=64, every=2, seed=6,
                         max_pos=2048)
    ids, mask = inputs(rng, hf, 2, 1100, "right")
    want = reference(hf, ids, mask)
    out = ftbert.Encoder.from_pretrained(tmp_path)(ids, mask).last_hidden_state
    assert np.abs(out - want)[mask.astype(bool)].max() <= TOL


def test_every_layer_global_and_other_thetas(tmp_path, rng):
    # global_attn_every_n_layers 1: no sliding layer; rope thetas given the old way.
    make_modernbert(tmp_path, hidden=64, heads=2, layers=2, every=1, seed=7)
    cfg_path = tmp_path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("rope_parameters", None)
    cfg.pop("layer_types", None)
    cfg.update(global_rope_theta=5000.0, local_rope_theta=700.0)
    cfg_path.write_text(json.dumps(cfg))
    from transformers import ModernBertModel

    hf = ModernBertModel.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert hf.config.rope_parameters["full_attention"]["rope_theta"] == 5000.0
    enc = ftbert.Encoder.from_pretrained(tmp_path)
    assert enc.config["layer"]["rotary_theta"] == 5000.0
    ids, mask = inputs(rng, hf, 2, 40, "right")
    assert np.abs(enc(ids, mask).last_hidden_state - reference(hf, ids, mask))[mask.astype(bool)].max() <= TOL


@pytest.mark.skipif(bool(_C.cpu_dtype_unsupported_reason("bfloat16")),
                    reason=_C.cpu_dtype_unsupported_reason("bfloat16") or "runs")
@pytest.mark.parametrize("attention", ["unfused", "flash"])
@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "packed"])
def test_bfloat16_within_twice_transformers_error(modernbert, rng, attention, padding_free):
    path, hf = modernbert
    ids, mask = inputs(rng, hf, 3, 90, "right")
    want = reference(hf, ids, mask)
    theirs = reference(copy.deepcopy(hf).to(torch.bfloat16), ids, mask)
    enc = ftbert.Encoder.from_pretrained(path, dtype="bfloat16", attention=attention,
                                         padding_free=padding_free)
    valid = mask.astype(bool)
    e_ours = np.abs(enc(ids, mask).last_hidden_state - want)[valid].max()
    e_theirs = np.abs(theirs - want)[valid].max()
    assert e_ours <= 2 * e_theirs + 1e-3, f"ftbert {e_ours:.3e} vs transformers {e_theirs:.3e}"


@pytest.mark.parametrize("change, message", [
    ({"attention_bias": True}, "attention_bias True is not supported"),
    ({"norm_bias": True}, "norm_bias True is not supported"),
    ({"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
                          "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
     "rope_parameters.full_attention.rope_type 'linear' is not supported"),
    ({"layer_types": ["full_attention", "full_attention"]}, "layer_types .* is not every 3-th layer"),
])
def test_settings_the_engine_does_not_run_are_refused_by_name(tmp_path, change, message):
    make_modernbert(tmp_path, hidden=32, heads=2, layers=2, seed=8)
    cfg_path = tmp_path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(change)
    if "layer_types" in change:
        cfg["global_attn_every_n_layers"] = 3
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=message):
        ftbert.Encoder.from_pretrained(tmp_path)


def mean_head(path, seed=10):
    """A ModernBERT sequence classifier with classifier_pooling "mean", saved to `path`."""
    hf = make_modernbert(path, kind="cls", hidden=32, heads=2, layers=2, seed=seed, num_labels=3, window=8)
    hf.config.classifier_pooling = "mean"
    widen_head(hf)  # logits of order 1: token 0 in place of the mean misses by far
    hf.save_pretrained(path)
    return hf


@pytest.mark.parametrize("attention", ["unfused", "flash"])
@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("style", ["right", "left", "holes"])
def test_mean_pooling_head_matches_transformers(tmp_path, rng, attention, padding_free, style):
    # classifier_pooling "mean": the head's dense reads the mean of each sequence's attended
    # tokens (past the window of ±4, so the tokens differ), whatever the padding.
    hf = mean_head(tmp_path)
    enc = ftbert.Encoder.from_pretrained(tmp_path, padding_free=padding_free, attention=attention)
    assert enc.config["head"]["input"] == "mean"
    ids, mask = inputs(rng, hf, 4, 37, style)
    with torch.no_grad():
        want = hf(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long()).logits.numpy()
    got = enc(ids, mask).logits
    assert np.abs(got - want).max() <= TOL * max(1.0, np.abs(want).max())
    if style != "right":  # rotary positions count padding: packed, only right padding agrees
        return
    # The same through forward_packed (one sequence of a single token among them).
    lengths = mask.sum(1)
    lengths[1] = 1
    flat = np.concatenate([ids[b][mask[b].astype(bool)][:lengths[b]] for b in range(len(ids))])
    cu = np.concatenate([[0], np.cumsum(lengths)])
    packed = enc.forward_packed(flat, cu).logits
    one = torch.from_numpy(flat[cu[1]:cu[2]])[None]
    with torch.no_grad():
        want_one = hf(one).logits.numpy()[0]
    assert np.abs(packed[1] - want_one).max() <= TOL * max(1.0, np.abs(want_one).max())
    assert np.abs(packed[[0, 2, 3]] - want[[0, 2, 3]]).max() <= TOL * max(1.0, np.abs(want).max())


def test_pooling_values_the_engine_does_not_run_are_refused_and_bare_encoders_load(tmp_path, rng):
    # Any other classifier_pooling is refused for the head only; ModernBERT-base's own config.json
    # carries the key for its bare encoder.
    mean_head(tmp_path / "cls")
    hf = make_modernbert(tmp_path / "bare", hidden=32, heads=2, layers=2, seed=10)
    for d in ("cls", "bare"):
        cfg_path = tmp_path / d / "config.json"
        cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), "classifier_pooling": "max"}))
    with pytest.raises(ValueError, match="classifier_pooling 'max' is not supported for ModernBertForSequenceClassification"):
        ftbert.Encoder.from_pretrained(tmp_path / "cls")
    ids, mask = inputs(rng, hf, 2, 20, "right")
    out = ftbert.Encoder.from_pretrained(tmp_path / "bare")(ids, mask).last_hidden_state
    assert np.abs(out - reference(hf, ids, mask))[mask.astype(bool)].max() <= TOL


def test_a_converted_modernbert_keeps_its_layer(tmp_path, rng):
    hf = make_modernbert(tmp_path / "hf", hidden=32, heads=2, layers=3, seed=9)
    ftbert.convert_checkpoint(tmp_path / "hf", tmp_path / "out", progress=False)
    ids, mask = inputs(rng, hf, 2, 30, "left")
    out = ftbert.Encoder.from_pretrained(tmp_path / "out")(ids, mask).last_hidden_state
    assert np.abs(out - reference(hf, ids, mask))[mask.astype(bool)].max() <= TOL
    cfg_path = tmp_path / "out" / "ftbert_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["layer"] = None
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="layer None does not fit model_type 'modernbert'"):
        ftbert.Encoder.from_pretrained(tmp_path / "out")
    cfg["layer"] = {"rotary_theta": 1.0, "local_rotary_theta": 1.0, "local_window": -1, "global_every": 3,
                    "gated_mlp": True, "rotary_scale": 1.0}
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="layer.local_window must be a non-negative integer"):
        ftbert.Encoder.from_pretrained(tmp_path / "out")
