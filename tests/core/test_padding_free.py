"""Padding-free ("packed") execution on the CPU, model by model: Encoder.padding_free ('auto', True,
False), its rule (padding_free_for), and Encoder.forward_packed.

Packed, only the attended tokens are computed; the outputs must be the padded forward's at every
attended position (float32: within TOL, about 30x the largest difference measured) and exactly zero
at padding. Positions (the RoBERTa family's pad-offset ones included) never change by packing. A
first-token output (pooler, sequence head) reads each sequence's first real token when packed, so
under left padding `auto` stays padded (its results are bit for bit padding_free=False's) while
padding_free=True reads the first real token. Every family of tests/_models.py, bare and with both
heads; right, left and inner padding, empty rows, length-1 sequences, full batches, many short
sequences in a long batch, odd sizes, random inputs; and every user error of the new API. A padded
call (Encoder.__call__'s padded=True) is the padding_free=False forward at every position, masked
ones included, whatever the encoder's padding_free and batch_invariant, and changes no other call.
"""

import numpy as np
import pytest
import torch

import ftbert
from tests._models import FAMILIES, HEAD_KINDS, family_kinds, make_model, widen_head
from tests._packing import first_positions
from tests._util import assert_close, max_error, ragged_mask

# Packed against padded, float32 on the CPU: the largest difference measured over every family and
# kind (2 layers, random batches up to 8 x 60) was 4e-7 relative to max(1, |value|).
TOL = 1e-5
# Against transformers' own modules (a different GEMM): as tests/core/test_head_parity.py.
REF_TOL = 1e-4
KINDS = ("model", *HEAD_KINDS)
# Their positions count the non-pad input ids from pad_token_id + 1.
ROBERTA_FAMILY = ("roberta", "xlm-roberta", "camembert")


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    # torch's OpenMP workers spin for a while after every op and starve the engine's own threads
    # on small machines; this file uses torch only to build checkpoints and small references.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


class Model:
    """One random checkpoint (hidden 48, 3 heads, 2 layers, 3 labels) and its encoders."""

    def __init__(self, family, kind, path, hf):
        self.family, self.kind, self.path, self.hf = family, kind, path, hf
        self.config = hf.config
        self._encoders = {}

    def encoder(self, padding_free):
        """A shared encoder with this padding_free setting; tests must not change it."""
        if padding_free not in self._encoders:
            self._encoders[padding_free] = ftbert.Encoder.from_pretrained(self.path, padding_free=padding_free)
        return self._encoders[padding_free]

    @property
    def pad(self):
        return self.config.pad_token_id

    @property
    def type_vocab(self):
        return getattr(self.config, "type_vocab_size", 1)

    @property
    def first_token_output(self):
        enc = self.encoder(False)
        return enc.config["has_pooler"] or enc.head == "sequence_classification"


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """zoo(family, kind, **make_model extras) -> Model, made once per module."""
    made = {}

    def get(family, kind="model", **extra):
        key = (family, kind, tuple(sorted(extra.items())))
        if key not in made:
            path = tmp_path_factory.mktemp(f"{family}-{kind}")
            hf = make_model(path, family, kind, num_labels=3, hidden=extra.pop("hidden", 48),
                            heads=extra.pop("heads", 3), layers=2, seed=100 + len(made), **extra)
            if kind in HEAD_KINDS:
                widen_head(hf)  # logits of order 1: a wrong first token or row shows clearly
                hf.save_pretrained(path)
            made[key] = Model(family, kind, path, hf)
        return made[key]

    return get


def make_batch(rng, m, batch, seq, padding):
    """(input_ids, attention_mask, token_type_ids or None) for model `m`: the pad id exactly at
    padding. padding: "right", "left", "inner" (holes inside sequences) or "none"."""
    ids = rng.integers(0, m.config.vocab_size - 1, (batch, seq))
    ids += ids >= m.pad
    if padding == "none":
        mask = np.ones((batch, seq), np.int32)
    elif padding == "inner":
        mask = (rng.random((batch, seq)) < 0.6).astype(np.int32)
        mask[:, 0] = 1  # every sequence starts with a token: first-token outputs agree
    else:
        mask = ragged_mask(rng, batch, seq, left=padding == "left")
    ids[mask == 0] = m.pad
    types = rng.integers(0, m.type_vocab, (batch, seq)) if m.type_vocab > 1 else None
    return ids.astype(np.int64), mask, types


def assert_per_token_outputs_match(m, packed, padded, mask):
    """hidden (and token logits) equal at attended positions, packed zeros at padding."""
    valid = mask.astype(bool)
    assert packed.last_hidden_state.shape == padded.last_hidden_state.shape
    assert np.isfinite(packed.last_hidden_state).all()
    assert_close(packed.last_hidden_state[valid], padded.last_hidden_state[valid], TOL, "hidden",
                 relative=True)
    assert (packed.last_hidden_state[~valid] == 0).all(), "packed padding must be exactly zero"
    if m.kind == "token":
        assert_close(packed.logits[valid], padded.logits[valid], TOL, "token logits", relative=True)
        assert (packed.logits[~valid] == 0).all(), "packed token logits at padding must be zero"


def assert_first_token_outputs_match(m, packed, padded):
    """pooler_output and sequence logits equal (token logits are per-token outputs)."""
    for name in ("pooler_output", "logits"):
        a, b = getattr(packed, name), getattr(padded, name)
        assert (a is None) == (b is None), name
        if a is not None and (name == "pooler_output" or m.kind == "cls"):
            assert np.isfinite(a).all()
            assert_close(a, b, TOL, name, relative=True)


def first_token_reference(m, first):
    """(pooler_output, sequence logits) that transformers' own modules give for the first-token
    hidden states `first` [B, H] (None where the model has no such output)."""
    hf, x = m.hf, torch.from_numpy(np.ascontiguousarray(first, np.float32))[:, None, :]
    pooled = logits = None
    with torch.no_grad():
        base = getattr(hf, hf.base_model_prefix, hf)
        if getattr(base, "pooler", None) is not None:
            pooled = base.pooler(x)
        if m.kind == "cls":
            if m.family in ("bert", "nomic_bert", "gte"):  # the classifier on the pooler
                logits = hf.classifier(pooled)
            elif m.family == "deberta-v2":  # ContextPooler (dense, GELU) on token 0, the classifier
                logits = hf.classifier(hf.pooler(x))
            elif m.family == "eurobert":  # its dense and GELU on token 0, then the classifier
                logits = hf.classifier(hf.activation(hf.dense(x[:, 0])))
            elif m.family == "distilbert":
                logits = hf.classifier(torch.relu(hf.pre_classifier(x[:, 0])))
            elif m.family == "modernbert":  # ModernBertPredictionHead on token 0, then the classifier
                logits = hf.classifier(hf.head(x[:, 0]))
            else:  # RobertaClassificationHead, ElectraClassificationHead: read features[:, 0]
                logits = hf.classifier(x)
    return tuple(None if t is None else t.numpy() for t in (pooled, logits))


# ---- packed against padded, every family and kind ---------------------------------------------


@pytest.mark.parametrize("family,kind", family_kinds(KINDS))
@pytest.mark.parametrize("padding,batch,seq", [("right", 5, 13), ("inner", 4, 22), ("left", 6, 17)])
def test_packed_matches_padded(zoo, rng, family, kind, padding, batch, seq):
    m = zoo(family, kind)
    ids, mask, types = make_batch(rng, m, batch, seq, padding)
    padded = m.encoder(False)(ids, mask, types)
    packed = m.encoder(True)(ids, mask, types)
    assert_per_token_outputs_match(m, packed, padded, mask)
    if padding != "left":  # every sequence starts at position 0: the first tokens agree
        assert_first_token_outputs_match(m, packed, padded)
        return
    # Left padding: packed reads each sequence's first real token, i.e. transformers' pooler and
    # head on the padded forward's hidden state there (not at the padding of position 0).
    first = padded.last_hidden_state[np.arange(batch), first_positions(mask)]
    want_pooled, want_logits = first_token_reference(m, first)
    for name, want in (("pooler_output", want_pooled), ("logits", want_logits if m.kind == "cls" else None)):
        got = getattr(packed, name)
        if want is None:
            continue
        assert_close(got, want, REF_TOL, name, relative=True)
        # ... which differs from the padded output that reads position 0 (a pad token).
        assert max_error(got, getattr(padded, name), relative=True) > 1e-3, (
            f"{name}: the test cannot tell the two apart")


@pytest.mark.parametrize("family", ROBERTA_FAMILY)
@pytest.mark.parametrize("kind", ["model", "cls"])
def test_left_padded_first_tokens_are_the_right_padded_ones_for_pad_offset_positions(zoo, rng, family, kind):
    # With positions counted from the ids (pad ids at padding), a sequence left-padded and the same
    # sequence right-padded have the same positions: packed, left padding gives exactly what the
    # padded forward gives for the right-padded batch, first-token outputs included.
    m = zoo(family, kind)
    batch, seq = 5, 15
    ids, left_mask, _ = make_batch(rng, m, batch, seq, "left")
    right_ids = np.full_like(ids, m.pad)
    right_mask = np.zeros_like(left_mask)
    for b in range(batch):
        n = int(left_mask[b].sum())
        right_ids[b, :n] = ids[b, seq - n:]
        right_mask[b, :n] = 1
    packed = m.encoder(True)(ids, left_mask)
    padded_right = m.encoder(False)(right_ids, right_mask)
    assert_close(packed.last_hidden_state[left_mask.astype(bool)],
                 padded_right.last_hidden_state[right_mask.astype(bool)], TOL, "hidden", relative=True)
    assert_first_token_outputs_match(m, packed, padded_right)


@pytest.mark.parametrize("family", ROBERTA_FAMILY)
@pytest.mark.parametrize("padding", ["left", "inner"])
def test_positions_come_from_the_ids_when_packed_as_in_transformers(zoo, rng, family, padding):
    # Non-pad ids under mask 0 (they advance the position count) and pad ids under mask 1 (they sit
    # at position pad_token_id): transformers counts over the ids, so must the packed forward.
    m = zoo(family, "model")
    batch, seq = 4, 19
    ids, mask, _ = make_batch(rng, m, batch, seq, padding)
    ids[mask == 0] = rng.integers(m.pad + 1, m.config.vocab_size, int((mask == 0).sum()))
    stray = (mask == 1) & (rng.random((batch, seq)) < 0.15)
    ids[stray] = m.pad
    got = m.encoder(True)(ids, mask)
    with torch.no_grad():
        ref = m.hf(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long()).last_hidden_state.numpy()
    valid = mask.astype(bool)
    assert_close(got.last_hidden_state[valid], ref[valid], REF_TOL, "hidden vs transformers", relative=True)
    assert (got.last_hidden_state[~valid] == 0).all()


@pytest.mark.parametrize("family", ["bert", "roberta", "distilbert", "electra"])
def test_packed_hidden_matches_transformers(zoo, rng, family):
    # Independent of the padded forward: transformers on the padded batch, at attended positions.
    m = zoo(family, "model")
    ids, mask, types = make_batch(rng, m, 5, 21, "left")
    got = m.encoder(True)(ids, mask, types)
    kwargs = {} if types is None else {"token_type_ids": torch.from_numpy(types)}
    with torch.no_grad():
        ref = m.hf(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long(), **kwargs)
    valid = mask.astype(bool)
    assert_close(got.last_hidden_state[valid], ref.last_hidden_state.numpy()[valid], REF_TOL, "hidden",
                 relative=True)


# ---- shapes and corner cases ------------------------------------------------------------------


@pytest.mark.parametrize("family,kind", [("bert", "cls"), ("roberta", "token"), ("electra", "model"),
                                         ("distilbert", "cls")])
@pytest.mark.parametrize("shape", ["length_one", "seq_one", "full", "many_short", "random"])
def test_packed_matches_padded_on_corner_shapes(zoo, rng, family, kind, shape):
    m = zoo(family, kind)
    if shape == "length_one":  # every sequence one token long, some batches of one row
        batch, seq = 7, 9
        mask = np.zeros((batch, seq), np.int32)
        mask[:, 0] = 1
    elif shape == "seq_one":
        batch, seq = 5, 1
        mask = np.ones((batch, seq), np.int32)
    elif shape == "full":  # T = B * S
        batch, seq = 3, 31
        mask = np.ones((batch, seq), np.int32)
    elif shape == "many_short":  # 1 to 4 tokens each in a batch padded to 96, one full row
        batch, seq = 24, 96
        mask = np.zeros((batch, seq), np.int32)
        for b, n in enumerate(rng.integers(1, 5, batch)):
            mask[b, :n] = 1
        mask[int(rng.integers(0, batch))] = 1
    else:
        batch, seq = int(rng.integers(1, 9)), int(rng.integers(1, 70))
        mask = ragged_mask(rng, batch, seq)
    ids, _, types = make_batch(rng, m, batch, seq, "none")
    ids[mask == 0] = m.pad
    padded = m.encoder(False)(ids, mask, types)
    packed = m.encoder(True)(ids, mask, types)
    assert_per_token_outputs_match(m, packed, padded, mask)
    assert_first_token_outputs_match(m, packed, padded)


@pytest.mark.parametrize("hidden,heads,seq", [(48, 3, 13), (40, 5, 31), (36, 2, 7)])
def test_odd_sizes(zoo, rng, hidden, heads, seq):
    # Head dims 16, 8 and 18, intermediate 4H - 3, odd lengths.
    m = zoo("bert", "cls", hidden=hidden, heads=heads)
    ids, mask, types = make_batch(rng, m, 5, seq, "right")
    padded = m.encoder(False)(ids, mask, types)
    packed = m.encoder(True)(ids, mask, types)
    assert_per_token_outputs_match(m, packed, padded, mask)
    assert_first_token_outputs_match(m, packed, padded)


@pytest.mark.parametrize("family,kind", [("bert", "model"), ("roberta", "cls"), ("electra", "token")])
def test_cuda_graphs_setting_changes_nothing_on_the_cpu(zoo, rng, family, kind):
    # With cuda_graphs (the default) a packed forward computes a token-count bucket of rows, the
    # ones past T zeros; without, exactly T rows. Both are the padded outputs.
    m = zoo(family, kind)
    plain = ftbert.Encoder.from_pretrained(m.path, padding_free=True, cuda_graphs=False)
    bucketed = m.encoder(True)
    for batch, seq in [(6, 40), (6, 40), (16, 70)]:
        ids, mask, types = make_batch(rng, m, batch, seq, "right")
        a, b = plain(ids, mask, types), bucketed(ids, mask, types)
        assert_per_token_outputs_match(m, a, m.encoder(False)(ids, mask, types), mask)
        assert_per_token_outputs_match(m, b, a, mask)
        assert_first_token_outputs_match(m, b, a)


@pytest.mark.parametrize("family,kind", [("bert", "model"), ("bert", "cls"), ("camembert", "cls"),
                                         ("electra", "cls"), ("distilbert", "cls"), ("roberta", "token")])
def test_fully_masked_rows_leave_the_others_alone(zoo, rng, family, kind):
    m = zoo(family, kind)
    batch, seq = 5, 12
    ids, mask, types = make_batch(rng, m, batch, seq, "right")
    empty = [1, 3]
    mask[empty] = 0
    ids[mask == 0] = m.pad
    packed = m.encoder(True)(ids, mask, types)
    padded = m.encoder(False)(ids, mask, types)
    for out in (packed, padded):
        for name in ("last_hidden_state", "pooler_output", "logits"):
            a = getattr(out, name)
            assert a is None or np.isfinite(a).all(), name
    assert_per_token_outputs_match(m, packed, padded, mask)
    keep = [b for b in range(batch) if b not in empty]
    # The other rows are what they are without the empty ones in the batch at all.
    sub = m.encoder(True)(ids[keep], mask[keep], None if types is None else types[keep])
    assert_close(packed.last_hidden_state[keep], sub.last_hidden_state, TOL, "hidden", relative=True)
    for name in ("pooler_output", "logits"):
        got = getattr(packed, name)
        if got is not None and (name == "pooler_output" or m.kind == "cls"):
            assert_close(got[keep], getattr(sub, name), TOL, name, relative=True)
            assert_close(got[keep], getattr(padded, name)[keep], TOL, name, relative=True)
    # An empty sequence's first-token outputs are those of a zero first token.
    if m.first_token_output:
        want_pooled, want_logits = first_token_reference(m, np.zeros((len(empty), m.config.hidden_size)))
        if want_pooled is not None:
            assert_close(packed.pooler_output[empty], want_pooled, REF_TOL, "empty pooled", relative=True)
        if m.kind == "cls":
            assert_close(packed.logits[empty], want_logits, REF_TOL, "empty logits", relative=True)


@pytest.mark.parametrize("family,kind", [("bert", "cls"), ("roberta", "model"), ("distilbert", "token")])
def test_a_batch_with_no_token_at_all(zoo, rng, family, kind):
    m = zoo(family, kind)
    ids, mask, types = make_batch(rng, m, 3, 6, "none")
    mask[:] = 0
    for graphs in (True, False):
        enc = ftbert.Encoder.from_pretrained(m.path, padding_free=True, cuda_graphs=graphs)
        out = enc(ids, mask, types)
        assert out.last_hidden_state.shape == (3, 6, m.config.hidden_size)
        assert (out.last_hidden_state == 0).all()
        if m.kind == "token":
            assert (out.logits == 0).all()
        want_pooled, want_logits = first_token_reference(m, np.zeros((3, m.config.hidden_size)))
        if want_pooled is not None:
            assert_close(out.pooler_output, want_pooled, REF_TOL, "pooled", relative=True)
        if m.kind == "cls":
            assert_close(out.logits, want_logits, REF_TOL, "logits", relative=True)


def test_results_do_not_depend_on_the_batch_around_a_sequence(zoo, rng):
    # A sequence alone, and packed among others of many lengths: the same outputs.
    m = zoo("xlm-roberta", "token")
    enc = m.encoder(True)
    ids, mask, _ = make_batch(rng, m, 9, 27, "inner")
    together = enc(ids, mask)
    for b in (0, 4, 8):
        n = int(mask[b].sum())
        alone = enc(ids[b][mask[b] == 1][None], np.ones((1, n), np.int32))
        assert_close(together.last_hidden_state[b][mask[b] == 1], alone.last_hidden_state[0], TOL, "hidden",
                     relative=True)
        assert_close(together.logits[b][mask[b] == 1], alone.logits[0], TOL, "logits", relative=True)


# ---- the auto rule ----------------------------------------------------------------------------


def ran_packed(out, mask):
    """Whether a forward ran packed: packed leaves exact zeros at padding, padded does not (a
    LayerNorm output there)."""
    pad = ~mask.astype(bool)
    assert pad.any(), "needs padding to tell"
    return bool((out.last_hidden_state[pad] == 0).all())


def assert_identical(a, b):
    for name in ("last_hidden_state", "pooler_output", "logits"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            np.testing.assert_array_equal(x, y, err_msg=name)


@pytest.mark.parametrize("family,kind", family_kinds(KINDS))
def test_auto_under_left_padding_stays_padded_only_for_first_token_outputs(zoo, rng, family, kind):
    m = zoo(family, kind)
    batch, seq = 4, 16
    ids, _, types = make_batch(rng, m, batch, seq, "left")
    mask = np.ones((batch, seq), np.int32)
    mask[:, :3] = 0  # every sequence starts with padding, and 13 of 64 positions are
    mask[0, 3] = 0  # padding: the count alone would pack
    ids[mask == 0] = m.pad
    auto = m.encoder("auto")
    assert auto.padding_free == "auto"
    # Plenty of padding: the count alone would pack.
    assert auto.padding_free_for(batch, seq, int(mask.sum()))
    out = auto(ids, mask, types)
    if m.first_token_output:
        assert not ran_packed(out, mask)
        assert_identical(out, m.encoder(False)(ids, mask, types))
    else:
        assert ran_packed(out, mask)
        assert_identical(out, m.encoder(True)(ids, mask, types))


@pytest.mark.parametrize("family,kind", [("bert", "model"), ("bert", "cls"), ("roberta", "cls"), ("electra", "token"),
                                         ("distilbert", "model")])
def test_auto_packs_by_the_amount_of_padding(zoo, rng, family, kind):
    m = zoo(family, kind)
    auto, on, off = m.encoder("auto"), m.encoder(True), m.encoder(False)
    batch, seq = 4, 25
    ids, _, types = make_batch(rng, m, batch, seq, "none")
    for padding_tokens, packs in [(10, True), (30, True), (9, False), (1, False)]:
        mask = np.ones((batch, seq), np.int32)
        # Take the padding off the right ends, spread over the rows (row 0 stays full).
        for i in range(padding_tokens):
            b = 1 + i % (batch - 1)
            mask[b, seq - 1 - i // (batch - 1)] = 0
        assert batch * seq - mask.sum() == padding_tokens
        assert auto.padding_free_for(batch, seq, int(mask.sum())) is packs
        out = auto(ids, mask, types)
        assert ran_packed(out, mask) is packs
        assert_identical(out, (on if packs else off)(ids, mask, types))
    # No padding at all: padded, bit for bit.
    assert_identical(auto(ids, None, types), off(ids, None, types))


@pytest.mark.parametrize("family,kind", [("bert", "cls"), ("roberta", "model"), ("electra", "token")])
def test_auto_with_a_fully_masked_row(zoo, rng, family, kind):
    # An empty row's position 0 is padding: with a first-token output auto stays padded.
    m = zoo(family, kind)
    ids, mask, types = make_batch(rng, m, 4, 10, "right")
    mask[2] = 0
    out = m.encoder("auto")(ids, mask, types)
    if m.first_token_output:
        assert_identical(out, m.encoder(False)(ids, mask, types))
    else:
        assert ran_packed(out, mask)
        assert_identical(out, m.encoder(True)(ids, mask, types))


def test_auto_packs_cpu_tensors_like_numpy(zoo, rng):
    m = zoo("bert", "token")
    ids, mask, types = make_batch(rng, m, 5, 14, "right")
    mask[:, -2:] = 0  # at least 10 of 70 positions are padding: auto packs
    auto = m.encoder("auto")
    from_numpy = auto(ids, mask, types)
    out = auto(torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(types))
    assert isinstance(out.last_hidden_state, torch.Tensor) and out.last_hidden_state.device.type == "cpu"
    np.testing.assert_array_equal(out.last_hidden_state.numpy(), from_numpy.last_hidden_state)
    np.testing.assert_array_equal(out.logits.numpy(), from_numpy.logits)
    assert ran_packed(from_numpy, mask)


@pytest.mark.parametrize("kind", ["numpy", "torch", "torch-bool", "torch-int64"])
@pytest.mark.parametrize("padding", ["right", "left", "inner", "none"])
def test_value_check_counts_the_mask(zoo, rng, kind, padding):
    # padding_free=True packs CUDA tensors by this count (read back with the value check): it must
    # be the mask's attended tokens whatever the mask's dtype.
    from ftbert.inputs import check_values

    m = zoo("bert", "model")
    ids, mask, types = make_batch(rng, m, 5, 13, padding)
    if padding != "none":
        mask[3] = 0  # and an empty row
    types = np.zeros_like(ids) if types is None else types
    args = (ids.astype(np.int32), mask, types.astype(np.int32))
    if kind != "numpy":
        args = tuple(torch.from_numpy(a) for a in args)
        mask_t = {"torch": args[1], "torch-bool": args[1].bool(), "torch-int64": args[1].long()}[kind]
        args = (args[0], mask_t, args[2])
    assert check_values(m.encoder("auto").config, *args) == int(mask.sum())


@pytest.mark.parametrize("batch,seq,tokens,want", [
    (2, 10, 18, True),    # 10% padding: packs
    (2, 10, 19, False),   # 5%
    (4, 25, 90, True),
    (4, 25, 91, False),
    (8, 512, 8 * 512, False),
    (8, 512, 8, True),
    (1, 1, 1, False),
    (3, 7, 0, True),      # nothing but padding
    (4, 25, -1, False),   # count unknown (device inputs nobody counted): never waits for it
])
def test_padding_free_for_rule(zoo, batch, seq, tokens, want):
    m = zoo("bert", "model")
    assert m.encoder("auto").padding_free_for(batch, seq, tokens) is want
    assert m.encoder(True).padding_free_for(batch, seq, tokens) is True
    assert m.encoder(False).padding_free_for(batch, seq, tokens) is False


def test_padding_free_for_never_packs_when_a_first_token_would_differ(zoo):
    native = zoo("bert", "model").encoder("auto")._native
    assert native.padding_free_for(4, 25, 50, first_token_differs=False) is True
    assert native.padding_free_for(4, 25, 50, first_token_differs=True) is False
    assert zoo("bert", "model").encoder(True)._native.padding_free_for(4, 25, 50, first_token_differs=True)


def test_padding_free_property(zoo):
    m = zoo("bert", "model")
    enc = ftbert.Encoder.from_pretrained(m.path)
    assert enc.padding_free == "auto"
    for mode in (True, False, "auto", np.bool_(True), np.bool_(False)):
        enc.padding_free = mode
        want = mode if isinstance(mode, str) else bool(mode)
        assert enc.padding_free == want and type(enc.padding_free) is type(want)
    assert ftbert.Encoder.from_pretrained(m.path, padding_free=True).padding_free is True
    assert ftbert.Encoder.from_pretrained(m.path, padding_free=False).padding_free is False


@pytest.mark.parametrize("bad", ["on", "Auto", "true", "", 1, 0, 1.0, None, np.int64(1), [True]])
def test_bad_padding_free_values_are_refused(zoo, bad):
    m = zoo("bert", "model")
    enc = ftbert.Encoder.from_pretrained(m.path, padding_free=True)
    with pytest.raises(ValueError, match=r"padding_free must be 'auto', True or False, got "):
        enc.padding_free = bad
    assert enc.padding_free is True  # unchanged
    with pytest.raises(ValueError, match=r"padding_free must be 'auto', True or False, got "):
        ftbert.Encoder.from_pretrained(m.path, padding_free=bad)


# ---- a padded call (Encoder.__call__'s padded=True) ---------------------------------------------

# BERT's absolute positions with each head, RoBERTa's counted ones, two rotary families.
PADDED_CALL_MODELS = [("bert", "model"), ("bert", "cls"), ("roberta", "token"), ("nomic_bert", "cls"),
                      ("modernbert", "model")]
# The encoder's own settings, which a padded call overrides: padding_free=True and auto pack, and
# batch_invariant=True packs every other forward.
SETTINGS = {"packed": {"padding_free": True}, "auto": {"padding_free": "auto"},
            "invariant": {"batch_invariant": True}}


@pytest.mark.parametrize("family,kind", PADDED_CALL_MODELS)
@pytest.mark.parametrize("padding,batch,seq", [("right", 5, 13), ("inner", 3, 22), ("left", 7, 9)])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_a_padded_call_is_the_padded_forward_at_every_position(zoo, rng, family, kind, padding, batch, seq,
                                                               setting):
    # Masked positions' rows too (they attend to the attended keys), bit for bit a
    # padding_free=False encoder's: the CPU runs the same kernels either way.
    m = zoo(family, kind)
    ids, mask, types = make_batch(rng, m, batch, seq, padding)
    mask[1] = 0  # a row with no token at all
    ids[1] = m.pad
    want = m.encoder(False)(ids, mask, types)
    enc = ftbert.Encoder.from_pretrained(m.path, **SETTINGS[setting])
    got = enc(ids, mask, types, padded=True)
    for name in ("last_hidden_state", "pooler_output", "logits"):
        a, b = getattr(got, name), getattr(want, name)
        assert (a is None) == (b is None), name
        if a is not None:
            np.testing.assert_array_equal(a, b, err_msg=name)
    masked = mask == 0
    assert np.abs(got.last_hidden_state[masked]).max() > 0, "masked positions' rows must be computed"
    if setting != "auto":  # the same encoder's other calls still pack: zeros there
        assert (enc(ids, mask, types).last_hidden_state[masked] == 0).all()
    assert enc.padding_free == SETTINGS[setting].get("padding_free", "auto")


def test_a_padded_call_takes_cpu_tensors_and_numpy_bools(zoo, rng):
    m = zoo("gte", "model")
    ids, mask, types = make_batch(rng, m, 4, 11, "right")
    want = m.encoder(False)(ids, mask, types).last_hidden_state
    enc = m.encoder(True)
    got = enc(torch.from_numpy(ids), torch.from_numpy(mask), None if types is None else torch.from_numpy(types),
              padded=np.bool_(True))
    assert isinstance(got.last_hidden_state, torch.Tensor)
    np.testing.assert_array_equal(got.last_hidden_state.numpy(), want)
    # padded=False is the encoder's setting: packed here
    assert (enc(ids, mask, types, padded=False).last_hidden_state[mask == 0] == 0).all()


def test_padded_calls_leave_other_threads_on_the_encoders_setting(zoo, rng):
    # One thread's padded calls and another's plain ones on one padding_free=True encoder, at
    # once: the plain ones stay packed (zeros at padding, where a padded forward has rows).
    from tests._util import run_in_threads

    m = zoo("bert", "model")
    enc = ftbert.Encoder.from_pretrained(m.path, padding_free=True, concurrency=2)
    ids, mask, types = make_batch(rng, m, 5, 19, "right")
    mask[2, 7:] = 0
    ids[2, 7:] = m.pad
    want_padded = m.encoder(False)(ids, mask, types).last_hidden_state
    want_packed = enc(ids, mask, types).last_hidden_state
    assert (want_packed[mask == 0] == 0).all() and np.abs(want_padded[mask == 0]).max() > 0
    rounds = 40

    def work(t):
        for _ in range(rounds):
            got = enc(ids, mask, types, padded=t == 0).last_hidden_state
            np.testing.assert_array_equal(got, want_padded if t == 0 else want_packed)
            assert enc.padding_free is True

    run_in_threads(2, work, timeout=120)


@pytest.mark.parametrize("bad", ["yes", "True", 1, 0, 1.0, None, np.int64(1), [True]])
def test_padded_must_be_a_bool(zoo, rng, bad):
    m = zoo("bert", "model")
    ids, mask, types = make_batch(rng, m, 2, 5, "right")
    with pytest.raises(TypeError, match=r"padded must be True or False, got "):
        m.encoder(True)(ids, mask, types, padded=bad)


def test_padded_is_a_keyword(zoo, rng):
    m = zoo("bert", "model")
    ids, mask, types = make_batch(rng, m, 2, 5, "right")
    with pytest.raises(TypeError, match="positional argument"):
        m.encoder(True)(ids, mask, types, True)


def test_the_engine_takes_padded_as_a_bool_and_not_with_packed_outputs(zoo, rng):
    # The binding converts nothing (a truthy object is no request); packed outputs have no
    # padded layout, which the engine says.
    m = zoo("bert", "model")
    native = m.encoder(True)._native
    ids, mask, _ = make_batch(rng, m, 2, 5, "right")
    ids, mask, types = ids.astype(np.int32), mask.astype(np.int32), np.zeros_like(mask)
    with pytest.raises(TypeError, match="incompatible function arguments"):
        native.forward_host(ids, mask, types, padded=1)
    with pytest.raises(ValueError, match=r"padded=True asks for a padded forward, but the inputs or the outputs "
                                         r"come packed"):
        native.forward_host(ids, mask, types, packed_outputs=True, padded=True)
    hidden = native.forward_host(ids, mask, types, padded=True)[0]
    assert hidden.shape == (2, 5, m.config.hidden_size)


# ---- forward_packed ---------------------------------------------------------------------------


def packed_inputs(rng, m, lengths):
    """(input_ids [T], cu_seqlens [B + 1], token_type_ids [T] or None) for sequences of `lengths`."""
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    T = int(cu[-1])
    ids = rng.integers(0, m.config.vocab_size - 1, T)
    ids += ids >= m.pad
    types = rng.integers(0, m.type_vocab, T) if m.type_vocab > 1 else None
    return ids.astype(np.int64), cu, types


def padded_from_packed(m, ids, cu, types):
    """The same sequences as a right-padded batch (pad ids at padding)."""
    lengths = np.diff(cu)
    B, S = len(lengths), max(1, int(lengths.max()))
    pids = np.full((B, S), m.pad, np.int64)
    mask = np.zeros((B, S), np.int32)
    ptypes = None if types is None else np.zeros((B, S), np.int64)
    for b in range(B):
        n = int(lengths[b])
        pids[b, :n] = ids[cu[b]:cu[b + 1]]
        mask[b, :n] = 1
        if types is not None:
            ptypes[b, :n] = types[cu[b]:cu[b + 1]]
    return pids, mask, ptypes


@pytest.mark.parametrize("family,kind", family_kinds(KINDS))
def test_forward_packed_matches_the_padded_forward(zoo, rng, family, kind):
    m = zoo(family, kind)
    lengths = rng.integers(1, 20, 6)
    lengths[2] = 1
    ids, cu, types = packed_inputs(rng, m, lengths)
    T, B = int(cu[-1]), len(lengths)
    out = m.encoder(False).forward_packed(ids, cu, types)  # packed whatever padding_free says
    H = m.config.hidden_size
    assert out.last_hidden_state.shape == (T, H) and out.last_hidden_state.dtype == np.float32
    pids, mask, ptypes = padded_from_packed(m, ids, cu, types)
    padded = m.encoder(False)(pids, mask, ptypes)
    valid = mask.astype(bool)
    assert_close(out.last_hidden_state, padded.last_hidden_state[valid], TOL, "hidden", relative=True)
    if padded.pooler_output is None:
        assert out.pooler_output is None
    else:
        assert out.pooler_output.shape == (B, H)
        assert_close(out.pooler_output, padded.pooler_output, TOL, "pooled", relative=True)
    if m.kind == "model":
        assert out.logits is None
    elif m.kind == "token":
        assert out.logits.shape == (T, 3)
        assert_close(out.logits, padded.logits[valid], TOL, "token logits", relative=True)
    else:
        assert out.logits.shape == (B, 3)
        assert_close(out.logits, padded.logits, TOL, "logits", relative=True)
    # The same packed forward as padding_free=True on the padded batch, scattered back.
    through_call = m.encoder(True)(pids, mask, ptypes)
    np.testing.assert_array_equal(out.last_hidden_state, through_call.last_hidden_state[valid])


@pytest.mark.parametrize("family,kind", [("bert", "token"), ("modernbert", "cls"), ("mpnet", "model")])
@pytest.mark.parametrize("attention", ["flash", "unfused"])
def test_forward_packed_sizes_its_row_buffers_by_its_tokens(zoo, rng, family, kind, attention):
    # One long sequence among many short ones: the per-token buffers hold the tokens' rows, not
    # B x the longest (the padded forward of the same batch needs those; the unfused attention's
    # [B, heads, S, S] scratch is B x S either way). Results unchanged, also after the workspace
    # grows for a padded forward and back.
    m = zoo(family, kind)
    ids, cu, types = packed_inputs(rng, m, [300] + [int(n) for n in rng.integers(1, 6, 40)])
    enc = ftbert.Encoder.from_pretrained(m.path, padding_free=True, attention=attention)
    first = enc.forward_packed(ids, cu, types)
    packed_bytes = enc.workspace_bytes
    pids, mask, ptypes = padded_from_packed(m, ids, cu, types)
    valid = mask.astype(bool)
    through_call = enc(pids, mask, ptypes)  # packed from the mask: rows for B x S positions
    if attention == "flash":
        assert packed_bytes < enc.workspace_bytes / 4, (packed_bytes, enc.workspace_bytes)
    np.testing.assert_array_equal(first.last_hidden_state, through_call.last_hidden_state[valid])
    again = enc.forward_packed(ids, cu, types)
    for name in ("last_hidden_state", "pooler_output", "logits"):
        a, b = getattr(first, name), getattr(again, name)
        assert (a is None) == (b is None), name
        if a is not None:
            np.testing.assert_array_equal(a, b, err_msg=name)


@pytest.mark.parametrize("family", ["roberta", "mpnet"])
@pytest.mark.parametrize("attention", ["flash", "unfused"])
def test_forward_packed_counts_pad_ids_within_each_sequence(zoo, rng, family, attention):
    # padding_offset positions count the non-pad ids up to a token: packed inputs are read in
    # place (no padded batch is built), so the count must start at each sequence's own first
    # token, with pad ids inside sequences and a length-1 one. The unfused attention reads a
    # padded mask that the engine builds from cu_seqlens.
    m = zoo(family, "model")
    ids, cu, _ = packed_inputs(rng, m, [7, 1, 12, 5])
    ids[[0, 3, 7, 9, 10, 24]] = m.pad
    enc = ftbert.Encoder.from_pretrained(m.path, padding_free=True, attention=attention)
    out = enc.forward_packed(ids, cu)
    pids, mask, _ = padded_from_packed(m, ids, cu, None)
    valid = mask.astype(bool)
    # The same tokens packed from a padded batch (ids at their padded positions), and padded.
    np.testing.assert_array_equal(out.last_hidden_state, enc(pids, mask).last_hidden_state[valid])
    assert_close(out.last_hidden_state, m.encoder(False)(pids, mask).last_hidden_state[valid], TOL,
                 "hidden", relative=True)


@pytest.mark.parametrize("family,kind", [("bert", "cls"), ("electra", "token"), ("camembert", "model")])
def test_forward_packed_takes_lists_numpy_and_cpu_tensors(zoo, rng, family, kind):
    m = zoo(family, kind)
    ids, cu, types = packed_inputs(rng, m, [5, 1, 12, 3])
    enc = m.encoder(True)
    ref = enc.forward_packed(ids, cu, types)
    t = None if types is None else types.tolist()
    for i, c, tt in [
        (ids.tolist(), cu.tolist(), t),
        (ids.astype(np.int32), cu.astype(np.int32), None if types is None else types.astype(np.int32)),
        (ids, tuple(int(x) for x in cu), None if types is None else types),
    ]:
        assert_identical(enc.forward_packed(i, c, tt), ref)
    tt = None if types is None else torch.from_numpy(types)
    for c in (cu, torch.from_numpy(cu), cu.tolist()):
        out = enc.forward_packed(torch.from_numpy(ids), c, tt)
        for name in ("last_hidden_state", "pooler_output", "logits"):
            x, y = getattr(out, name), getattr(ref, name)
            assert (x is None) == (y is None), name
            if x is not None:
                assert isinstance(x, torch.Tensor) and x.device.type == "cpu" and x.dtype == torch.float32
                np.testing.assert_array_equal(x.numpy(), y, err_msg=name)


@pytest.mark.parametrize("family", ["bert", "electra"])
def test_forward_packed_token_types_count(zoo, rng, family):
    m = zoo(family, "model")
    ids, cu, types = packed_inputs(rng, m, [7, 4, 9])
    assert types is not None and types.any()
    enc = m.encoder(True)
    with_types = enc.forward_packed(ids, cu, types)
    pids, mask, ptypes = padded_from_packed(m, ids, cu, types)
    assert_close(with_types.last_hidden_state,
                 m.encoder(False)(pids, mask, ptypes).last_hidden_state[mask.astype(bool)], TOL, "hidden",
                 relative=True)
    without = enc.forward_packed(ids, cu)
    np.testing.assert_array_equal(without.last_hidden_state, enc.forward_packed(ids, cu, np.zeros_like(types))
                                  .last_hidden_state)
    assert max_error(without.last_hidden_state, with_types.last_hidden_state, relative=True) > 1e-3


@pytest.mark.parametrize("family,kind", [("bert", "cls"), ("roberta", "model"), ("distilbert", "cls"),
                                         ("xlm-roberta", "token")])
def test_forward_packed_empty_sequences(zoo, rng, family, kind):
    # An empty sequence (cu_seqlens repeats) changes nothing for the others; its first-token
    # outputs are those of a zero first token.
    m = zoo(family, kind)
    ids, cu, types = packed_inputs(rng, m, [4, 9, 2])
    enc = m.encoder(True)
    ref = enc.forward_packed(ids, cu, types)
    with_empty = np.array([0, 0, 4, 4, 13, 13, 15, 15])
    out = enc.forward_packed(ids, with_empty, types)
    assert_close(out.last_hidden_state, ref.last_hidden_state, TOL, "hidden", relative=True)
    real, empty = [1, 3, 5], [0, 2, 4, 6]
    want_pooled, want_logits = first_token_reference(m, np.zeros((len(empty), m.config.hidden_size)))
    if ref.pooler_output is not None:
        assert out.pooler_output.shape == (7, m.config.hidden_size)
        assert_close(out.pooler_output[real], ref.pooler_output, TOL, "pooled", relative=True)
        assert_close(out.pooler_output[empty], want_pooled, REF_TOL, "empty pooled", relative=True)
    if m.kind == "cls":
        assert_close(out.logits[real], ref.logits, TOL, "logits", relative=True)
        assert_close(out.logits[empty], want_logits, REF_TOL, "empty logits", relative=True)
    if m.kind == "token":
        assert_close(out.logits, ref.logits, TOL, "token logits", relative=True)


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_forward_packed_limits_each_sequence_not_the_total(zoo, rng, family):
    # max_position_embeddings 40: RoBERTa's usable length is 40 - pad - 1 = 38.
    m = zoo(family, "model", max_pos=40)
    limit = 40 if family == "bert" else 40 - m.pad - 1
    ids, cu, _ = packed_inputs(rng, m, [limit, 30, limit, 25])  # T far past the table
    out = m.encoder(True).forward_packed(ids, cu)
    assert out.last_hidden_state.shape == (int(cu[-1]), 48)
    assert np.isfinite(out.last_hidden_state).all()
    pids, mask, _ = padded_from_packed(m, ids, cu, None)
    assert_close(out.last_hidden_state, m.encoder(False)(pids, mask).last_hidden_state[mask.astype(bool)],
                 TOL, "hidden", relative=True)
    ids, cu, _ = packed_inputs(rng, m, [3, limit + 1, 2])
    with pytest.raises(ValueError, match=f"sequence length {limit + 1}, which exceeds"):
        m.encoder(True).forward_packed(ids, cu)


@pytest.mark.parametrize("batch", [1, 2, 3, 5, 8, 9, 33, 100])
@pytest.mark.parametrize("seq", [1, 7, 16, 17, 130, 256, 257, 500])
def test_recorded_packed_shape_rounds_up_within_the_model(rng, batch, seq):
    # The shape a GPU recording of packed inputs is made for (the engine's sessions): B and S to
    # powers of two (S never past the model's limit), T up to a bucket at most 1/16 above it.
    from ftbert import _C

    for tokens in sorted({batch, batch * seq, int(rng.integers(batch, batch * seq + 1))}):
        b, s, rows = _C.recorded_packed_shape(batch, seq, tokens, 512)
        assert b >= batch and b & (b - 1) == 0 and b < 2 * batch
        assert seq <= s <= 512 and (s & (s - 1) == 0 or s == 512) and s < 2 * seq
        assert tokens <= rows <= b * s
        assert rows - tokens < max(64, tokens / 16)
        assert rows % 64 == 0 or rows == b * s
    # Shapes that differ only inside their buckets share a recording.
    assert _C.recorded_packed_shape(5, 33, 150, 512) == _C.recorded_packed_shape(8, 64, 190, 512)
    assert _C.recorded_packed_shape(12, 200, 2200, 512) == _C.recorded_packed_shape(16, 256, 2300, 512)
    # A sequence already at the model's limit stays there.
    assert _C.recorded_packed_shape(3, 300, 700, 300)[1] == 300


@pytest.fixture(scope="module")
def small(zoo):
    return zoo("bert", "cls")


def test_forward_packed_error_cu_seqlens(small, rng):
    enc = small.encoder(True)
    ids = rng.integers(0, 200, 10)
    cases = [
        ([1, 4, 10], ValueError, "cu_seqlens must start at 0, got 1"),
        ([0, 6, 4, 10], ValueError, r"cu_seqlens must not decrease"),
        ([0, 4, 9], ValueError, "cu_seqlens ends at 9 but input_ids has 10 tokens"),
        ([0, 4, 11], ValueError, "cu_seqlens ends at 11 but input_ids has 10 tokens"),
        ([[0, 4, 10]], ValueError, r"cu_seqlens must be 1-D with at least 2 entries \[B \+ 1\], got shape \(1, 3\)"),
        ([10], ValueError, r"cu_seqlens must be 1-D with at least 2 entries"),
        (np.int64(10), ValueError, r"cu_seqlens must be 1-D"),
        ([0.0, 4.0, 10.0], TypeError, "cu_seqlens must hold integers, got dtype float64"),
        (np.array([0, 4, 10], object), TypeError, "cu_seqlens must hold integers, got dtype object"),
        (np.array([False, True]), TypeError, "cu_seqlens must hold integers, got dtype bool"),
        (torch.tensor([0.0, 4.0, 10.0]), TypeError, "cu_seqlens must hold integers, got dtype float32"),
        (["0", "4", "10"], TypeError, "cu_seqlens must hold integers"),
    ]
    for cu, exc, match in cases:
        with pytest.raises(exc, match=match):
            enc.forward_packed(ids, cu)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device for the tensor")
def test_forward_packed_refuses_cu_seqlens_on_a_cuda_device(small, rng):
    ids = rng.integers(0, 200, 10)
    with pytest.raises(ValueError, match=r"cu_seqlens is on cuda:0: pass it on the host"):
        small.encoder(True).forward_packed(ids, torch.tensor([0, 4, 10], device="cuda"))


def test_forward_packed_error_input_ids_and_token_types(small, rng):
    enc = small.encoder(True)
    V = small.config.vocab_size
    ids = rng.integers(0, V, 10)
    cu = [0, 4, 10]
    cases = [
        (dict(input_ids=torch.from_numpy(ids)[None]), ValueError,
         r"input_ids must be 1-D \[tokens\] for forward_packed, got shape \(1, 10\)"),
        (dict(input_ids=torch.tensor(3)), ValueError, r"input_ids must be 1-D \[tokens\]"),
        (dict(input_ids=[ids.tolist()]), ValueError, "input_ids"),
        (dict(input_ids=ids.astype(np.float32)), TypeError, "input_ids must hold integers"),
        (dict(input_ids=torch.from_numpy(ids).float()), TypeError, "input_ids must hold integers"),
        (dict(input_ids=np.full(10, V)), ValueError, f"input_ids holds {V}, out of range for vocab_size {V}"),
        (dict(input_ids=np.full(10, -2)), ValueError, "input_ids holds -2, out of range for vocab_size"),
        (dict(input_ids=torch.full((10,), V)), ValueError, f"input_ids holds {V}, out of range"),
        (dict(token_type_ids=np.zeros(9, np.int64)), ValueError,
         r"token_type_ids has shape \(9,\), expected \(10,\) like input_ids"),
        (dict(input_ids=torch.from_numpy(ids), token_type_ids=torch.zeros(11, dtype=torch.long)), ValueError,
         r"token_type_ids has shape \(11,\), expected \(10,\)"),
        (dict(input_ids=torch.from_numpy(ids), token_type_ids=torch.zeros(1, 10, dtype=torch.long)), ValueError,
         r"token_type_ids has shape \(1, 10\), expected \(10,\)"),
        (dict(token_type_ids=np.full(10, 2)), ValueError, "token_type_ids holds 2, out of range for type_vocab_size 2"),
        (dict(token_type_ids=np.zeros(10, np.float32)), TypeError, "token_type_ids must hold integers"),
        (dict(input_ids=torch.from_numpy(ids), token_type_ids=np.zeros(10, np.int64)), TypeError,
         "token_type_ids must be a torch tensor like input_ids"),
        (dict(token_type_ids=torch.zeros(10, dtype=torch.long)), TypeError,
         "token_type_ids is a torch tensor but input_ids is not"),
        (dict(input_ids=ids.tolist(), token_type_ids=torch.zeros(10, dtype=torch.long)), TypeError,
         "token_type_ids is a torch tensor but input_ids is not"),
    ]
    for kwargs, exc, match in cases:
        args = dict(input_ids=ids, cu_seqlens=cu, token_type_ids=None)
        args.update(kwargs)
        with pytest.raises(exc, match=match):
            enc.forward_packed(**args)
    # And nothing of it broke the encoder.
    assert enc.forward_packed(ids, cu).last_hidden_state.shape == (10, small.config.hidden_size)


@pytest.mark.parametrize("shape", [(1, 10), (2, 10)])
def test_forward_packed_refuses_2d_numpy_input_ids(small, rng, shape):
    ids = rng.integers(0, 200, shape)
    with pytest.raises(ValueError, match=r"input_ids must be 1-D \[tokens\] for forward_packed"):
        small.encoder(True).forward_packed(ids, [0, 4, 10])


@pytest.mark.parametrize("shape", [(1, 10), (10, 1)])
def test_forward_packed_refuses_2d_numpy_token_types(small, rng, shape):
    ids = rng.integers(0, 200, 10)
    with pytest.raises(ValueError, match=r"token_type_ids must be 1-D \[tokens\] for forward_packed"):
        small.encoder(True).forward_packed(ids, [0, 4, 10], np.zeros(shape, np.int64))


def test_forward_packed_refuses_0d_numpy_input_ids(small):
    with pytest.raises(ValueError, match=r"input_ids must be 1-D \[tokens\].*shape \(\)"):
        small.encoder(True).forward_packed(np.array(3), [0, 1])
    with pytest.raises(TypeError, match="input_ids must be a numpy array"):
        small.encoder(True).forward_packed(np.int64(3), [0, 1])
