"""MPNet on the CPU against transformers' MPNetModel: the relative position bias at every distance
(the exact buckets below 8, the logarithmic ones up to 128, the last bucket beyond), right and left
padding and holes inside a sequence, both attention paths, padded and packed; float32 within 1e-4,
bfloat16 (where the CPU has it) within twice transformers' own bfloat16 error + 1e-3; and what a
malformed MPNet config or checkpoint gets. Every head's parity at short lengths is
test_head_parity.py's (driven by the family tables)."""

import json

import numpy as np
import pytest
import torch

import ftbert
from ftbert import _C
from tests._models import make_mpnet
from tests._util import padded_ids

TOL = 1e-4


def test_buckets_are_transformers_at_every_distance():
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    distance = torch.arange(-9000, 9001)
    want = MPNetEncoder.relative_position_bucket(distance).tolist()
    assert [_C.relative_position_bucket(int(d)) for d in distance] == want


@pytest.fixture(scope="module")
def mpnet(tmp_path_factory):
    path = tmp_path_factory.mktemp("mpnet")
    hf = make_mpnet(path, hidden=96, heads=3, layers=2, vocab=151, seed=5)  # head dim 32
    return path, hf


def inputs(rng, hf, batch, seq, style):
    return padded_ids(rng, hf.config, batch, seq, style)


def reference(hf, ids, mask):
    with torch.no_grad():
        out = hf(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long())
    return out.last_hidden_state.float().numpy(), out.pooler_output.float().numpy()


@pytest.mark.parametrize("attention", ["unfused", "flash"])
@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("batch,seq,style", [(3, 300, "right"), (2, 140, "left"), (3, 61, "holes"),
                                             (1, 512, "right")])
def test_hidden_states_match_transformers_float32(mpnet, rng, attention, padding_free, batch, seq,
                                                  style):
    path, hf = mpnet
    enc = ftbert.Encoder.from_pretrained(path, attention=attention, padding_free=padding_free)
    ids, mask = inputs(rng, hf, batch, seq, style)
    want_h, want_p = reference(hf, ids, mask)
    out = enc(ids, mask)
    valid = mask.astype(bool)
    assert np.isfinite(out.last_hidden_state).all()
    err = np.abs(out.last_hidden_state - want_h)[valid].max()
    assert err <= TOL, f"hidden {err:.2e}"
    if not padding_free or style == "right":  # packed reads a sequence's first attended token
        err = np.abs(out.pooler_output - want_p).max()
        assert err <= TOL, f"pooler {err:.2e}"


def test_the_bias_table_matters(mpnet, rng):
    # The same weights with the relative bias zeroed give other outputs: the table is read.
    path, hf = mpnet
    ids, mask = inputs(rng, hf, 2, 50, "right")
    enc = ftbert.Encoder.from_pretrained(path)
    with torch.no_grad():
        saved = hf.encoder.relative_attention_bias.weight.clone()
        hf.encoder.relative_attention_bias.weight.zero_()
        zeroed, _ = reference(hf, ids, mask)
        hf.encoder.relative_attention_bias.weight.copy_(saved)
    assert np.abs(enc(ids, mask).last_hidden_state - zeroed)[mask.astype(bool)].max() > 1e-2


@pytest.mark.skipif(bool(_C.cpu_dtype_unsupported_reason("bfloat16")),
                    reason=_C.cpu_dtype_unsupported_reason("bfloat16") or "runs")
@pytest.mark.parametrize("attention", ["unfused", "flash"])
@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "packed"])
def test_bfloat16_within_twice_transformers_error(mpnet, rng, attention, padding_free):
    path, hf = mpnet
    ids, mask = inputs(rng, hf, 3, 200, "right")
    want_h, _ = reference(hf, ids, mask)
    import copy

    theirs_h, _ = reference(copy.deepcopy(hf).to(torch.bfloat16), ids, mask)
    enc = ftbert.Encoder.from_pretrained(path, dtype="bfloat16", attention=attention,
                                         padding_free=padding_free)
    valid = mask.astype(bool)
    ours = np.abs(enc(ids, mask).last_hidden_state - want_h)[valid].max()
    theirs = np.abs(theirs_h - want_h)[valid].max()
    assert ours <= 2 * theirs + 1e-3, f"ftbert {ours:.3e} vs transformers {theirs:.3e}"


def test_too_few_buckets_is_refused_by_name(tmp_path):
    # transformers' MPNet looks up 32 buckets whatever the table holds; a smaller table cannot run.
    make_mpnet(tmp_path, hidden=32, heads=2, layers=1, buckets=16)
    with pytest.raises(ValueError, match="relative_attention_num_buckets must be 0 .* from 32 .* got 16"):
        ftbert.Encoder.from_pretrained(tmp_path)


def test_a_larger_table_runs_its_first_32_buckets(tmp_path, rng):
    hf = make_mpnet(tmp_path, hidden=32, heads=2, layers=1, buckets=40, seed=3)
    ids, mask = inputs(rng, hf, 2, 150, "right")
    want, _ = reference(hf, ids, mask)
    got = ftbert.Encoder.from_pretrained(tmp_path)(ids, mask).last_hidden_state
    assert np.abs(got - want)[mask.astype(bool)].max() <= TOL


def test_converted_mpnet_without_its_buckets_is_refused(tmp_path):
    make_mpnet(tmp_path / "hf", hidden=32, heads=2, layers=1)
    ftbert.convert_checkpoint(tmp_path / "hf", tmp_path / "out", progress=False)
    cfg_path = tmp_path / "out" / "ftbert_config.json"
    cfg = json.loads(cfg_path.read_text())
    assert cfg["relative_attention_num_buckets"] == 32
    cfg["relative_attention_num_buckets"] = 0
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="relative_attention_num_buckets 0 does not fit model_type 'mpnet'"):
        ftbert.Encoder.from_pretrained(tmp_path / "out")


def test_token_types_other_than_zero_are_refused(mpnet, rng):
    # MPNet has no token-type embedding: the converter's one zero row takes type 0 only.
    path, hf = mpnet
    ids, mask = inputs(rng, hf, 1, 9, "right")
    with pytest.raises(ValueError, match="token_type_ids"):
        ftbert.Encoder.from_pretrained(path)(ids, mask, np.ones_like(ids))
