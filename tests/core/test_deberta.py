"""DeBERTa-v2/v3 on the CPU against transformers' DebertaV2Model, ForSequenceClassification and
ForTokenClassification (random checkpoints of tests._models.make_deberta).

v3's own settings (no token types, no absolute positions, shared attention keys, normed relative
embeddings) with 8 log buckets over 16 relative positions, so that sequences of 40 to 64 tokens
reach every region of the bucket table: the exact distances (|δ| <= 4), the log buckets and the
clamped ends (|δ| past 16). Variants: c2p or p2c alone, no relative-embedding norm, absolute
positions added (position_biased_input), no buckets (max_relative_positions is the span), buckets
over max_position_embeddings, token types, odd sizes (head dims 16 and 15), and v3's own table (256
buckets over 512) from 1 to 512 tokens. Right and left padding and holes inside a sequence, batch 1
and ragged batches, both attention paths, padded and packed (padding_free and forward_packed);
float32 within 1e-4 on the attended positions, bfloat16 (where the CPU has it) within twice
transformers' own bfloat16 error + 1e-3. The query and key projections are scaled up (sharpen) so
that a relative embedding read at a wrong distance misses the tolerance by far. And what a user
meets on the way there: the settings the engine does not run, refused by name, in config.json and
in a converted ftbert_config.json, sequences longer than the model's positions; and the
architecture units' own checks under the Python layer.

Parity at short lengths for every head, converted directories and the converter's round trip are
the family-driven tests' (test_head_parity.py, test_padding_free.py, test_family_parity.py)."""

import copy
import json
import shutil

import numpy as np
import pytest
import torch

import ftbert
from ftbert import _C
from ftbert.encoder import _host_tensor
from ftbert.weights_tools import load_hf_checkpoint
from tests._models import make_deberta, widen_head
from tests._util import padded_ids

TOL = 1e-4
MAX_POS = 64

# v3's settings at test sizes; VARIANTS change one thing each.
V3 = dict(hidden=48, heads=3, layers=2, type_vocab=0, buckets=8, max_relative=16, max_pos=MAX_POS, vocab=157)
VARIANTS = {
    "v3": {},
    "h64-heads4": dict(hidden=64, heads=4, intermediate=131),
    "h60-heads4": dict(hidden=60, heads=4, layers=1),  # head dim 15
    "c2p-only": dict(pos_att_type="c2p"),
    "p2c-only": dict(pos_att_type="p2c"),
    "norm-none": dict(norm_rel_ebd="none"),
    "position-biased": dict(position_biased_input=True),
    "no-buckets": dict(buckets=-1),  # span 16: every distance past 16 reads a clamped end
    "no-buckets-no-reach": dict(buckets=-1, max_relative=-1),  # span max_pos: nothing clamped
    "buckets-over-max-pos": dict(max_relative=-1),  # the log buckets reach max_pos
    "token-types": dict(type_vocab=2),  # v2's
    # v3's own table (256 buckets over 512): its own test, at its own lengths.
    "v3-own-buckets": dict(buckets=256, max_relative=512, max_pos=512),
}
ATTENTIONS = ["flash", "unfused"]
SHARPEN = 8.0  # sharpen()'s factor: attention weights up to ~0.7, not one-hot
PADDING_FREE = pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "packed"])


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    # torch's OpenMP workers spin after every op and starve the engine's threads on 2-core CI
    # machines; the references here are small.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def sharpen(hf, factor=SHARPEN):
    """Scales every layer's query and key projections by `factor` (in place; the caller saves).
    At init scale (std 0.02) the scores are ~0.01 and the softmax all but uniform: a relative
    embedding read at the wrong distance moves the outputs by about TOL or less. Scaled, the terms
    weigh: see test_every_relative_embedding_row_is_read_at_its_distances."""
    with torch.no_grad():
        for layer in hf.base_model.encoder.layer:
            layer.attention.self.query_proj.weight.mul_(factor)
            layer.attention.self.key_proj.weight.mul_(factor)


class Model:
    """One random checkpoint, its transformers model and its encoders (shared: tests must not
    change them)."""

    def __init__(self, path, hf):
        self.path, self.hf = path, hf
        self._encoders, self._bf16 = {}, None

    def encoder(self, attention="auto", padding_free=False, dtype="float32"):
        key = (attention, padding_free, dtype)
        if key not in self._encoders:
            self._encoders[key] = ftbert.Encoder.from_pretrained(self.path, attention=attention,
                                                                 padding_free=padding_free, dtype=dtype)
        return self._encoders[key]

    @property
    def hf_bf16(self):
        if self._bf16 is None:
            self._bf16 = copy.deepcopy(self.hf).to(torch.bfloat16)
        return self._bf16

    @property
    def token_types(self) -> bool:
        return self.hf.config.type_vocab_size > 1


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """zoo(variant, kind="model") -> Model, each made once per module."""
    made = {}

    def get(variant, kind="model"):
        if (variant, kind) not in made:
            path = tmp_path_factory.mktemp(f"deberta-{variant}-{kind}")
            hf = make_deberta(path, kind=kind, num_labels=3, seed=40 + len(made),
                              **{**V3, **VARIANTS[variant]})
            sharpen(hf)
            if kind != "model":
                widen_head(hf)  # logits of order 1: a wrong first token or row shows clearly
            hf.save_pretrained(path)
            made[variant, kind] = Model(path, hf)
        return made[variant, kind]

    return get


def make_inputs(rng, m, batch, seq, style):
    """(ids, mask, types or None): the pad id exactly at padding; token types over the whole table
    where the model has one. style: "right", "left" or "holes"."""
    ids, mask = padded_ids(rng, m.hf.config, batch, seq, style)
    types = rng.integers(0, m.hf.config.type_vocab_size, (batch, seq)) if m.token_types else None
    return ids, mask, types


def reference(hf, ids, mask, types=None):
    """(final hidden states, logits or None) of a transformers model, float32 numpy."""
    with torch.no_grad():
        out = hf(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long(),
                 token_type_ids=None if types is None else torch.from_numpy(types),
                 output_hidden_states=True)
    hidden = out.hidden_states[-1].float().numpy()
    logits = getattr(out, "logits", None)
    return hidden, None if logits is None else logits.float().numpy()


def hidden_error(got, want, mask):
    return float(np.abs(got - want)[mask.astype(bool)].max())


# Batch 1 at the longest sequence the model takes (every distance up to 63: both clamped ends);
# ragged batches; left padding (the tokens at the end of the row: positions stay the padded row's);
# holes inside a sequence.
SHAPES = [(1, MAX_POS, "right"), (4, 57, "right"), (3, 44, "left"), (3, 50, "holes")]


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "v3-own-buckets"])
@pytest.mark.parametrize("attention", ATTENTIONS)
@PADDING_FREE
@pytest.mark.parametrize("batch,seq,style", SHAPES)
def test_hidden_states_match_transformers(zoo, rng, variant, attention, padding_free, batch, seq, style):
    m = zoo(variant)
    enc = m.encoder(attention, padding_free)
    assert enc.attention_for(batch, seq) == attention
    ids, mask, types = make_inputs(rng, m, batch, seq, style)
    want, _ = reference(m.hf, ids, mask, types)
    got = enc(ids, mask, types).last_hidden_state
    assert np.isfinite(got).all()  # padding too
    err = hidden_error(got, want, mask)
    assert err <= TOL, f"hidden {err:.2e}"


@pytest.mark.parametrize("attention", ATTENTIONS)
@PADDING_FREE
@pytest.mark.parametrize("batch,seq,style", [(2, 512, "right"), (3, 300, "left"), (4, 2, "right"),
                                             (3, 1, "right")])
def test_v3_s_own_buckets_match_transformers(zoo, rng, attention, padding_free, batch, seq, style):
    # 256 buckets over 512 positions: exact up to 128, logarithmic beyond, never clamped; and the
    # shortest sequences, whose terms are one or three columns wide.
    test_hidden_states_match_transformers(zoo, rng, "v3-own-buckets", attention, padding_free, batch, seq,
                                          style)


@pytest.mark.parametrize("variant", ["v3", "position-biased", "no-buckets"])
@pytest.mark.parametrize("attention", ATTENTIONS)
def test_forward_packed_matches_each_sequence_alone(zoo, rng, variant, attention):
    # Sequences one after another, none padded: each one's distances (and absolute positions,
    # where added) start again at its first token. The longest is the model's longest.
    m = zoo(variant)
    lengths = [MAX_POS, 1, 40, 17, 2, 61]
    seqs = [rng.integers(3, m.hf.config.vocab_size, n) for n in lengths]
    types = [rng.integers(0, 2, n) for n in lengths] if m.token_types else None
    cu = np.concatenate([[0], np.cumsum(lengths)])
    enc = m.encoder(attention)
    out = enc.forward_packed(np.concatenate(seqs), cu, None if types is None else np.concatenate(types))
    assert out.last_hidden_state.shape == (cu[-1], m.hf.config.hidden_size)
    for b, ids in enumerate(seqs):
        want, _ = reference(m.hf, ids[None], np.ones((1, len(ids)), np.int32))
        err = np.abs(out.last_hidden_state[cu[b]:cu[b + 1]] - want[0]).max()
        assert err <= TOL, f"sequence {b} ({lengths[b]} tokens): {err:.2e}"


@pytest.mark.parametrize("kind", ["cls", "token"])
@pytest.mark.parametrize("variant", ["v3", "c2p-only"])
@pytest.mark.parametrize("attention", ATTENTIONS)
@PADDING_FREE
@pytest.mark.parametrize("batch,seq,style", [(1, 61, "right"), (4, 53, "right"), (3, 46, "left")])
def test_heads_match_transformers(zoo, rng, kind, variant, attention, padding_free, batch, seq, style):
    m = zoo(variant, kind)
    enc = m.encoder(attention, padding_free)
    ids, mask, types = make_inputs(rng, m, batch, seq, style)
    want_h, want_l = reference(m.hf, ids, mask, types)
    out = enc(ids, mask, types)
    assert hidden_error(out.last_hidden_state, want_h, mask) <= TOL
    if kind == "token":
        err = hidden_error(out.logits, want_l, mask)
    else:
        # ContextPooler reads token 0. A left-padded row's token 0 is a pad, whose every key
        # transformers masks (uniform weights over the row); ftbert's padded forward attends its
        # row's tokens and its packed one reads the first real token: such rows are left out.
        rows = mask[:, 0] == 1
        assert rows.any()
        err = float(np.abs(out.logits - want_l)[rows].max())
    assert err <= TOL, f"logits {err:.2e}"


def rows_read(hf, seq):
    """The rows of the relative embeddings transformers reads for sequences of `seq` tokens (8 log
    buckets reaching 64 never give the bucket -8: row 0 is not among them)."""
    from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position

    attn = hf.base_model.encoder.layer[0].attention.self
    x = torch.zeros(1, seq, 1)
    rel = build_relative_position(x, x, attn.position_buckets, attn.max_relative_positions)
    return sorted(set(torch.clamp(rel + attn.pos_ebd_size, 0, 2 * attn.pos_ebd_size - 1).flatten().tolist()))


@pytest.mark.parametrize("variant", ["v3", "no-buckets", "buckets-over-max-pos"])
def test_every_relative_embedding_row_is_read_at_its_distances(zoo, rng, variant):
    # transformers with any one row of the relative embeddings changed (an exact distance, a log
    # bucket, a clamped end) is 10 x TOL away from ftbert, which matches the unchanged model within
    # TOL: the parity above would catch a row read at a wrong distance.
    m = zoo(variant)
    ids, mask, _ = make_inputs(rng, m, 2, MAX_POS, "right")
    mask[:] = 1  # every distance up to 63
    ids[ids == m.hf.config.pad_token_id] = 5
    got = m.encoder()(ids, mask).last_hidden_state
    rel = m.hf.encoder.rel_embeddings.weight
    want, _ = reference(m.hf, ids, mask)
    assert hidden_error(got, want, mask) <= TOL
    for row in rows_read(m.hf, MAX_POS):
        with torch.no_grad():
            saved = rel[row].clone()
            rel[row] = torch.from_numpy(rng.standard_normal(rel.shape[1]).astype(np.float32))
            try:
                changed, _ = reference(m.hf, ids, mask)
            finally:
                rel[row] = saved
        assert hidden_error(got, changed, mask) > 10 * TOL, f"row {row} of {rel.shape[0]}"


@pytest.mark.skipif(bool(_C.cpu_dtype_unsupported_reason("bfloat16")),
                    reason=_C.cpu_dtype_unsupported_reason("bfloat16") or "runs")
@pytest.mark.parametrize("variant", ["v3", "p2c-only", "no-buckets", "position-biased"])
@pytest.mark.parametrize("attention", ATTENTIONS)
@PADDING_FREE
@pytest.mark.parametrize("batch,seq,style", [(3, 61, "right"), (2, MAX_POS, "left")])
def test_bfloat16_within_twice_transformers_error(zoo, rng, variant, attention, padding_free, batch,
                                                  seq, style):
    m = zoo(variant)
    ids, mask, types = make_inputs(rng, m, batch, seq, style)
    want, _ = reference(m.hf, ids, mask, types)
    theirs_h, _ = reference(m.hf_bf16, ids, mask, types)
    got = m.encoder(attention, padding_free, "bfloat16")(ids, mask, types).last_hidden_state
    assert np.isfinite(got).all()
    ours, theirs = hidden_error(got, want, mask), hidden_error(theirs_h, want, mask)
    assert ours <= 2 * theirs + 1e-3, f"ftbert {ours:.3e} vs transformers {theirs:.3e}"


@pytest.mark.skipif(bool(_C.cpu_dtype_unsupported_reason("bfloat16")),
                    reason=_C.cpu_dtype_unsupported_reason("bfloat16") or "runs")
@pytest.mark.parametrize("kind", ["cls", "token"])
def test_bfloat16_heads_within_twice_transformers_error(zoo, rng, kind):
    # 16 sequences: over 4, the largest of a dozen errors drew ftbert 2.4x transformers' for one
    # seed in 25, the two being alike over 64 (mean abs 1.8e-2 and 1.7e-2).
    m = zoo("v3", kind)
    ids, mask, _ = make_inputs(rng, m, 16, 53, "right")
    _, want = reference(m.hf, ids, mask)
    _, theirs = reference(m.hf_bf16, ids, mask)
    got = m.encoder("auto", False, "bfloat16")(ids, mask).logits
    valid = mask.astype(bool) if kind == "token" else slice(None)
    ours, theirs = np.abs(got - want)[valid].max(), np.abs(theirs - want)[valid].max()
    assert ours <= 2 * theirs + 1e-3, f"logits: ftbert {ours:.3e} vs transformers {theirs:.3e}"


# ---- what the engine refuses ------------------------------------------------------------------


def test_v3_without_token_types_refuses_a_type_other_than_zero(zoo, rng):
    # type_vocab_size 0: the converter's one zero row takes type 0 only.
    m = zoo("v3")
    ids, mask, _ = make_inputs(rng, m, 2, 9, "right")
    enc = m.encoder()
    np.testing.assert_array_equal(enc(ids, mask, np.zeros_like(ids)).last_hidden_state,
                                  enc(ids, mask).last_hidden_state)
    with pytest.raises(ValueError, match="token_type_ids"):
        enc(ids, mask, np.ones_like(ids))


@pytest.mark.parametrize("call", ["numpy", "torch", "packed", "padding_free"])
def test_a_sequence_longer_than_the_positions_is_refused(zoo, call):
    # No absolute table is read (v3), but the relative positions' table stops at max_position.
    m = zoo("v3")
    ids = np.full((2, MAX_POS + 1), 5)
    mask = np.ones_like(ids)
    mask[1, 3:] = 0
    with pytest.raises(ValueError, match=f"length {MAX_POS + 1}, which exceeds max_position_embeddings {MAX_POS}"):
        if call == "numpy":
            m.encoder()(ids, mask)
        elif call == "torch":
            m.encoder()(torch.from_numpy(ids), torch.from_numpy(mask))
        elif call == "packed":
            m.encoder().forward_packed(np.full(MAX_POS + 4, 5), [0, 3, MAX_POS + 4])
        else:
            m.encoder(padding_free=True)(ids, mask)


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory):
    """A small v3 checkpoint whose config.json the error tests edit (each in a copy)."""
    path = tmp_path_factory.mktemp("deberta-small")
    hf = make_deberta(path, hidden=32, heads=2, layers=1, type_vocab=0, buckets=8, max_relative=16,
                      max_pos=MAX_POS, seed=7)
    sharpen(hf)  # the terms weigh: a setting read wrong shows past TOL
    hf.save_pretrained(path)
    return path


def edited_copy(src, dst, name, **changes):
    """A copy of checkpoint directory `src` at `dst` with `changes` made to its JSON file `name`
    (a value of ... deletes the key)."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / name).read_text())
    for key, value in changes.items():
        if value is ...:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (dst / name).write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("changes,message", [
    (dict(relative_attention=False), "relative_attention false"),
    (dict(relative_attention=...), "relative_attention false"),  # transformers' default
    (dict(share_att_key=False), "share_att_key false"),
    (dict(conv_kernel_size=3), "conv_kernel_size 3"),
    (dict(embedding_size=16), "embedding_size 16 != hidden_size 32"),
    (dict(attention_head_size=8), "attention_head_size 8"),
    (dict(pos_att_type="p2p"), "pos_att_type 'p2p' is not supported"),
    (dict(pos_att_type="c2p|p2p"), r"pos_att_type 'c2p\|p2p' is not supported"),
    (dict(pos_att_type=["p2c", "p2p"]), r"pos_att_type \['p2c', 'p2p'\] is not supported"),
    (dict(pos_att_type=""), "pos_att_type '' is not supported"),
    (dict(pos_att_type=[]), r"pos_att_type \[\] is not supported"),
    (dict(pos_att_type=None), "pos_att_type None is not supported"),
    (dict(norm_rel_ebd="batch_norm"), "norm_rel_ebd 'batch_norm' is not supported"),
    (dict(position_buckets=1), "position_buckets must be an integer, at least 2"),
    (dict(max_relative_positions=5), r"max_relative_positions 5 must exceed position_buckets / 2 \+ 1"),
])
def test_a_setting_the_engine_does_not_run_is_refused_by_name(small_dir, tmp_path, changes, message):
    path = edited_copy(small_dir, tmp_path / "hf", "config.json", **changes)
    with pytest.raises(ValueError, match=message):
        ftbert.Encoder.from_pretrained(path)
    with pytest.raises(ValueError, match=message):
        ftbert.convert_checkpoint(path, tmp_path / "out", progress=False)


@pytest.mark.parametrize("pos_att_type,c2p,p2c", [("P2C | c2p", True, True), (["c2p"], True, False),
                                                  ("p2c", False, True)])
def test_pos_att_type_is_read_as_transformers_reads_it(small_dir, tmp_path, rng, pos_att_type, c2p, p2c):
    # A "|"-separated string of any case or a list, as DebertaV2Config takes either.
    path = edited_copy(small_dir, tmp_path / "hf", "config.json", pos_att_type=pos_att_type)
    enc = ftbert.Encoder.from_pretrained(path)
    d = enc.config["disentangled"]
    assert (d["c2p"], d["p2c"]) == (c2p, p2c)
    from transformers import DebertaV2Model

    hf = DebertaV2Model.from_pretrained(path).eval()
    ids, mask = padded_ids(rng, hf.config, 2, 45, "right")
    want, _ = reference(hf, ids, mask)
    assert hidden_error(enc(ids, mask).last_hidden_state, want, mask) <= TOL
    if not (c2p and p2c):  # one term alone is another model than both
        both = ftbert.Encoder.from_pretrained(small_dir)(ids, mask).last_hidden_state
        assert hidden_error(both, want, mask) > 10 * TOL


@pytest.fixture(scope="module")
def converted_dir(small_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("deberta-converted")
    ftbert.convert_checkpoint(small_dir, out, progress=False)
    return out


GOOD = dict(position_buckets=8, max_relative_positions=16, c2p=True, p2c=True, position_table=False, norm=True)


@pytest.mark.parametrize("disentangled,message", [
    (None, "disentangled None does not fit model_type 'deberta-v2'"),
    ([8, 16], "disentangled must be null or an object with the keys"),
    ({k: v for k, v in GOOD.items() if k != "norm"}, "disentangled must be null or an object with the keys"),
    ({**GOOD, "share_att_key": True}, "disentangled must be null or an object with the keys"),
    ({**GOOD, "position_buckets": 1}, "disentangled.position_buckets must be an integer"),
    ({**GOOD, "position_buckets": 8.0}, "disentangled.position_buckets must be an integer"),
    ({**GOOD, "position_buckets": "8"}, "disentangled.position_buckets must be an integer"),
    ({**GOOD, "max_relative_positions": 0}, "disentangled.max_relative_positions must be a positive integer"),
    ({**GOOD, "max_relative_positions": True}, "disentangled.max_relative_positions must be a positive integer"),
    ({**GOOD, "max_relative_positions": 5}, r"disentangled.max_relative_positions 5 must exceed position_buckets / 2"),
    ({**GOOD, "c2p": "yes"}, "disentangled.c2p must be true or false"),
    ({**GOOD, "p2c": 1}, "disentangled.p2c must be true or false"),
    ({**GOOD, "position_table": None}, "disentangled.position_table must be true or false"),
    ({**GOOD, "norm": "layer_norm"}, "disentangled.norm must be true or false"),
    ({**GOOD, "c2p": False, "p2c": False}, r"disentangled adds neither term \(c2p and p2c both false\)"),
])
def test_a_bad_disentangled_object_in_a_converted_config_is_refused(converted_dir, tmp_path, disentangled,
                                                                    message):
    path = edited_copy(converted_dir, tmp_path / "converted", "ftbert_config.json", disentangled=disentangled)
    with pytest.raises(ValueError, match=message):
        ftbert.Encoder.from_pretrained(path)


def test_a_converted_config_s_disentangled_object_is_what_runs(converted_dir, small_dir, tmp_path, rng):
    # The engine reads its settings from the object, not from the family: p2c turned off there
    # gives another model (and transformers' with pos_att_type "c2p" agrees with it).
    path = edited_copy(converted_dir, tmp_path / "converted", "ftbert_config.json",
                       disentangled={**GOOD, "p2c": False})
    hf_dir = edited_copy(small_dir, tmp_path / "hf", "config.json", pos_att_type="c2p")
    from transformers import DebertaV2Model

    hf = DebertaV2Model.from_pretrained(hf_dir).eval()
    ids, mask = padded_ids(rng, hf.config, 2, 50, "right")
    want, _ = reference(hf, ids, mask)
    assert hidden_error(ftbert.Encoder.from_pretrained(path)(ids, mask).last_hidden_state, want, mask) <= TOL
    both = ftbert.Encoder.from_pretrained(converted_dir)(ids, mask).last_hidden_state
    assert hidden_error(both, want, mask) > 10 * TOL


# ---- the engine's own checks, under the Python layer --------------------------------------------


def native(path, **changes):
    config, tensors = load_hf_checkpoint(path)
    weights = {name: _host_tensor(t) for name, t in tensors.items()}
    return _C.Encoder({**config, **changes}, weights, "cpu", "float32")


@pytest.mark.parametrize("disentangled,message", [
    (None, "architecture 'deberta' needs a \"disentangled\" object with c2p or p2c"),
    ({**GOOD, "c2p": False, "p2c": False}, "architecture 'deberta' needs a \"disentangled\" object with c2p or p2c"),
    ({**GOOD, "max_relative_positions": 5}, r"max_relative_positions 5 must exceed position_buckets / 2 \+ 1"),
    ({**GOOD, "position_buckets": 1}, "position_buckets at least 2"),
])
def test_the_deberta_unit_refuses_what_it_cannot_run(small_dir, disentangled, message):
    with pytest.raises(Exception, match=message):
        native(small_dir, architecture="deberta", disentangled=disentangled)


def test_the_cpu_keeps_term_tables_and_batch_invariance_auto_stays_off(small_dir):
    # The CPU computes the terms as tables (the fused kernel's inline terms are the GPU's); its
    # kernels are invariant either way, so "auto" has nothing to turn on.
    enc = ftbert.Encoder.from_pretrained(small_dir)
    assert enc._native.terms_in_attention is False and enc.batch_invariant is False


def test_the_bert_unit_refuses_disentangled_attention_it_would_drop(small_dir):
    # As it refuses a relative bias table: BERT's unit would run a DeBERTa config without its
    # disentangled terms (and, position_table false, without any position) and say nothing. A
    # config without an architecture runs that unit.
    for changes in (dict(architecture="bert"), {}):
        with pytest.raises(ValueError, match="disentangled"):
            native(small_dir, **changes)
