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
from tests._models import make_modernbert
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
                                   "local_window": 8, "global_every": 3}
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


def test_mean_pooling_heads_are_refused_but_bare_encoders_carrying_the_key_load(tmp_path, rng):
    # classifier_pooling "mean" changes what a sequence head reads: refused for the head only;
    # ModernBERT-base's own config.json carries it for its bare encoder.
    make_modernbert(tmp_path / "cls", kind="cls", hidden=32, heads=2, layers=2, seed=10)
    hf = make_modernbert(tmp_path / "bare", hidden=32, heads=2, layers=2, seed=10)
    for d in ("cls", "bare"):
        cfg_path = tmp_path / d / "config.json"
        cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), "classifier_pooling": "mean"}))
    with pytest.raises(ValueError, match="classifier_pooling 'mean' is not supported for ModernBertForSequenceClassification"):
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
    cfg["layer"] = {"rotary_theta": 1.0, "local_rotary_theta": 1.0, "local_window": 0, "global_every": 3}
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="layer.local_window must be a positive integer"):
        ftbert.Encoder.from_pretrained(tmp_path / "out")
