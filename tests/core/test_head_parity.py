"""Every family of the family tables, bare and with each head, on the CPU against transformers' own
models in float32 (max abs error <= 1e-4 on the last hidden state, the pooler and the logits):
sequence and token classification for every family (BERT's
classifier on the pooler; the RoBERTa family's, ELECTRA's and DistilBERT's own dense on token 0),
odd sizes and label counts, right and left padding, numpy and torch inputs, the labels, converted
directories, the converter's round trip back to the task model's state dict, and checkpoints whose
head the engine does not run (the encoder still loads, with a warning)."""

import json
from importlib import import_module
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from safetensors import safe_open

import ftbert
from tests._models import FAMILIES, family_kinds, head_modules, label_names, make_model, widen_head
from tests._util import ragged_mask

TOL = 1e-4
ROBERTA_FAMILY = ("roberta", "xlm-roberta", "camembert")
HEADS = {"cls": "sequence_classification", "token": "token_classification"}
# family -> where its sequence head reads and its own dense's activation (transformers' classes:
# BertForSequenceClassification reads the pooler; RobertaClassificationHead tanh,
# ElectraClassificationHead GELU, DistilBERT's pre_classifier ReLU).
SEQUENCE_INPUT = {"bert": ("pooler", None), "roberta": ("first_token", "tanh"),
                  "xlm-roberta": ("first_token", "tanh"), "camembert": ("first_token", "tanh"),
                  "distilbert": ("first_token", "relu"), "electra": ("first_token", "gelu"),
                  "mpnet": ("first_token", "tanh"), "modernbert": ("first_token", "gelu"),
                  "nomic_bert": ("pooler", None), "gte": ("pooler", None),
                  "jina_embeddings_v3": ("first_token", "tanh"), "eurobert": ("first_token", "gelu"),
                  "deberta-v2": ("first_token", "gelu")}

# The cases come from the family tables (weights_tools/families.py): every family, bare and with
# each head, so a family added there is tested here with no line of its own. Sizes are cycled over
# the cases: hidden 48 and 64, head dims 16, 24 and 32, odd intermediate sizes, 1, 3 and 5 labels,
# one or two layers, erf and tanh GELU.
SIZES = (
    dict(hidden=48, heads=2, layers=2, num_labels=3),
    dict(hidden=64, heads=4, layers=1, num_labels=5),
    dict(hidden=64, heads=4, layers=2, num_labels=1),
    dict(hidden=48, heads=3, layers=1, num_labels=5, act="gelu_new"),
    dict(hidden=48, heads=2, layers=2, num_labels=3, intermediate=131),
    dict(hidden=64, heads=2, layers=1, num_labels=1, intermediate=97),
)
# What some families' checkpoints carry that the others' do not, in one case each: a moved pad id
# (and so every RoBERTa position), narrow embeddings (ELECTRA's projection) and three token types,
# DistilBERT's ReLU.
EXTRAS = {
    ("camembert", "cls"): dict(pad=3),
    ("electra", "cls"): dict(embedding=32, type_vocab=3),
    ("electra", "token"): dict(embedding=48),
    ("distilbert", "token"): dict(act="relu"),
}
KINDS = ("model", "cls", "token")
ALL_CASES = {
    f"{family}-{kind}": {"family": family, "kind": kind, "seed": 31 + i,
                         **SIZES[i % len(SIZES)], **EXTRAS.get((family, kind), {})}
    for i, (family, kind) in enumerate(family_kinds(KINDS))
}
CASES = {name: spec for name, spec in ALL_CASES.items() if spec["kind"] in HEADS}
BARE = {name: spec for name, spec in ALL_CASES.items() if spec["kind"] == "model"}


class Case:
    """One task checkpoint: the transformers model, its directory, and the engine loaded from it."""

    def __init__(self, name, path, hf, enc):
        self.name, self.path, self.hf, self.enc = name, path, hf, enc
        self.spec = CASES[name]
        self.family, self.kind = self.spec["family"], self.spec["kind"]

    @property
    def token_types(self) -> bool:
        # RoBERTa's one-row table and DistilBERT's absent one take type 0 only.
        return self.family in ("bert", "electra")


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    hf = make_model(path, **CASES[request.param])
    widen_head(hf)
    hf.save_pretrained(path)
    return Case(request.param, path, hf, ftbert.Encoder.from_pretrained(path))


@pytest.fixture(scope="module")
def converted(case, tmp_path_factory):
    """The case's checkpoint converted: through the function for sequence heads, the command line
    for token heads (both paths write the same format)."""
    out = tmp_path_factory.mktemp(case.name + "-converted")
    if case.kind == "cls":
        ftbert.convert_checkpoint(case.path, out, progress=False)
    else:
        from ftbert.cli import main

        assert main(["convert", str(case.path), str(out), "--quiet"]) == 0
    return out


def make_inputs(rng, case, batch, seq, padding):
    """(input_ids, attention_mask, token_type_ids or None): pad_token_id exactly where the mask is 0
    and nowhere else (transformers counts RoBERTa positions from the ids); token types drawn from
    the whole table where the family has one. padding: "none", "right" or "left"."""
    config = case.hf.config
    pad, vocab = config.pad_token_id, config.vocab_size
    ids = rng.integers(0, vocab - 1, (batch, seq))
    ids += ids >= pad  # every id but the pad id
    if padding == "none":
        mask = np.ones((batch, seq), np.int32)
    else:
        mask = ragged_mask(rng, batch, seq, left=padding == "left")
    ids[mask == 0] = pad
    types = rng.integers(0, config.type_vocab_size, (batch, seq)) if case.token_types else None
    return ids.astype(np.int64), mask, types


def reference(hf, ids, mask, types):
    """transformers' task model: (last hidden state, logits), float32 numpy."""
    kwargs = {} if types is None else {"token_type_ids": torch.from_numpy(types)}
    with torch.no_grad():
        out = hf(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long(), output_hidden_states=True,
                 **kwargs)
    return out.hidden_states[-1].numpy(), out.logits.numpy()


def assert_parity(case, out, ids, mask, types):
    hidden, logits = reference(case.hf, ids, mask, types)
    valid = mask.astype(bool)
    assert out.logits.shape == logits.shape
    assert np.isfinite(out.last_hidden_state).all() and np.isfinite(out.logits).all()  # padded rows too
    err_h = np.abs(out.last_hidden_state - hidden)[valid].max()
    assert err_h <= TOL, f"{case.name}: hidden {err_h:.2e}"
    if case.kind == "cls":
        # Token 0 of every row, a pad token in left-padded rows: transformers reads it all the same.
        # Except with sliding windows (ModernBERT): a pad whose window holds no real token gets
        # transformers' uniform weights over every key (its mask adds the float minimum to all),
        # ftbert's zeros; such a row's logits read a pad's hidden state either way. DeBERTa masks
        # a pad query's every key (and zeroes its embedding): the same uniform weights.
        own_pad_rows = ("modernbert", "deberta-v2")
        rows = mask[:, 0] == 1 if case.family in own_pad_rows else np.ones(len(mask), bool)
        err = np.abs(out.logits - logits)[rows].max() if rows.any() else 0.0
    else:
        err = np.abs(out.logits - logits)[valid].max()
    assert err <= TOL, f"{case.name}: logits {err:.2e}"


@pytest.mark.parametrize("padding, batch, seq", [("right", 3, 13), ("left", 4, 18), ("none", 1, 1)])
def test_logits_match_transformers_float32(case, rng, padding, batch, seq):
    ids, mask, types = make_inputs(rng, case, batch, seq, padding)
    out = case.enc(ids, mask, types)
    assert isinstance(out.logits, np.ndarray) and out.logits.dtype == np.float32
    assert_parity(case, out, ids, mask, types)


@pytest.fixture(scope="module", params=list(BARE))
def bare(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    spec = BARE[request.param]
    hf = make_model(path, **spec)
    return request.param, hf, ftbert.Encoder.from_pretrained(path), spec["family"] in ("bert", "electra")


@pytest.mark.parametrize("padding, batch, seq", [("right", 3, 13), ("left", 4, 18), ("none", 1, 1),
                                                 ("right", 2, 33), ("left", 4, 36)])
def test_bare_models_match_transformers_float32(bare, rng, padding, batch, seq):
    # The encoder's last hidden state at every attended position and its pooler (transformers reads
    # token 0 of a left-padded row, a pad token, all the same; so does ftbert: auto stays padded).
    name, hf, enc, token_types = bare
    ids, mask, types = make_inputs(rng, SimpleNamespace(hf=hf, token_types=token_types), batch, seq,
                                   padding)
    out = enc(ids, mask, types)
    kwargs = {} if types is None else {"token_type_ids": torch.from_numpy(types)}
    with torch.no_grad():
        ref = hf(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long(), **kwargs)
    valid = mask.astype(bool)
    assert np.isfinite(out.last_hidden_state).all()
    err = np.abs(out.last_hidden_state - ref.last_hidden_state.numpy())[valid].max()
    assert err <= TOL, f"{name}: hidden {err:.2e}"
    pooled = getattr(ref, "pooler_output", None)
    assert (out.pooler_output is None) == (pooled is None), name
    if pooled is not None:
        err = np.abs(out.pooler_output - pooled.numpy()).max()
        assert err <= TOL, f"{name}: pooled {err:.2e}"


def test_torch_inputs_give_torch_logits(case, rng):
    ids, mask, types = make_inputs(rng, case, 3, 10, "left")
    from_numpy = case.enc(ids, mask, types)
    t = case.enc(torch.from_numpy(ids), torch.from_numpy(mask), None if types is None else torch.from_numpy(types))
    assert isinstance(t.logits, torch.Tensor) and t.logits.dtype == torch.float32 and t.logits.device.type == "cpu"
    want = (3, case.spec["num_labels"]) if case.kind == "cls" else (3, 10, case.spec["num_labels"])
    assert tuple(t.logits.shape) == want
    np.testing.assert_array_equal(t.logits.numpy(), from_numpy.logits)
    np.testing.assert_array_equal(t.last_hidden_state.numpy(), from_numpy.last_hidden_state)


def test_head_and_labels_are_the_checkpoints(case):
    enc, n = case.enc, case.spec["num_labels"]
    id2label = case.hf.config.id2label
    assert enc.head == HEADS[case.kind]
    assert enc.num_labels == n and isinstance(enc.num_labels, int)
    assert enc.labels == [id2label[i] for i in range(n)] == label_names(n)
    source, activation = (SEQUENCE_INPUT[case.family] if case.kind == "cls"
                          else ("tokens", "gelu" if case.family == "modernbert" else None))
    assert enc.config["head"] == {"kind": HEADS[case.kind], "num_labels": n, "input": source,
                                  "activation": activation, "norm": case.family == "modernbert",
                                  "labels": label_names(n), "score_activation": None}
    # The pooler is there only where the task model has one (BERT's sequence head reads it).
    assert enc.config["has_pooler"] is (case.kind == "cls" and SEQUENCE_INPUT[case.family][0] == "pooler")


def test_converted_directory_gives_the_same_logits(case, converted, rng):
    config, _ = ftbert.weights_tools.read_converted(converted)
    stored = json.loads((converted / "ftbert_config.json").read_text())
    assert stored["head"] == case.enc.config["head"]
    from_converted = ftbert.Encoder.from_pretrained(converted)
    assert {k: v for k, v in case.enc.config.items() if not k.startswith("weights_")} == {
        k: v for k, v in config.items() if not k.startswith("weights_")
    }
    assert (from_converted.head, from_converted.num_labels, from_converted.labels) == (
        case.enc.head, case.enc.num_labels, case.enc.labels)
    ids, mask, types = make_inputs(rng, case, 3, 15, "left")
    a, b = case.enc(ids, mask, types), from_converted(ids, mask, types)
    np.testing.assert_array_equal(a.logits, b.logits)
    np.testing.assert_array_equal(a.last_hidden_state, b.last_hidden_state)
    assert_parity(case, b, ids, mask, types)


def test_converter_round_trip_is_exact(case, converted):
    # HF -> engine: the head's tensors are the modules' ([in, out], last in the file); engine -> HF
    # (hf_state_dict): the task model's checkpoint again, head and all, under the names its file
    # holds (the original code's, for the families transformers renames at load).
    wt = ftbert.weights_tools
    config, tensors = wt.read_converted(converted)
    assert list(tensors) == [n for n, _ in wt.expected_tensors(config)]
    dense, out = head_modules(case.hf)
    want = {"classifier.out_weight": out.weight.T, "classifier.out_bias": out.bias}
    if hasattr(case.hf, "head"):  # ModernBERT's norm after the dense's activation
        want = {"classifier.norm_gamma": case.hf.head.norm.weight, **want}
    if dense is not None:
        bias = dense.bias if dense.bias is not None else torch.zeros(dense.weight.shape[0])
        want = {"classifier.dense_weight": dense.weight.T, "classifier.dense_bias": bias, **want}
    assert list(tensors)[-len(want):] == list(want)
    for name, t in want.items():
        assert torch.equal(tensors[name], t.detach().float().contiguous()), name
    hf_mod = import_module(wt.__name__ + ".hf")
    sd = hf_mod.hf_state_dict(wt.family_for(case.family), config, tensors)
    expected = load_file(str(case.path / "model.safetensors"))
    assert set(sd) == set(expected)
    for k, v in expected.items():
        assert torch.equal(sd[k], v.float()), k


@pytest.mark.parametrize("family", FAMILIES)
def test_bare_model_has_no_head(tmp_path, rng, family):
    make_model(tmp_path, family, "model", hidden=48, heads=2, seed=43)
    enc = ftbert.Encoder.from_pretrained(tmp_path)
    assert (enc.head, enc.num_labels, enc.labels, enc.config["head"]) == (None, None, None, None)
    ids = rng.integers(3, 90, (2, 6))
    assert enc(ids).logits is None
    assert enc(torch.from_numpy(ids)).logits is None


def _left_out(path, prefix):
    """The tensors of a saved checkpoint outside the encoder (not under the task model's prefix)."""
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        return [n for n in f.keys() if not n.startswith(prefix)]


@pytest.mark.parametrize("family, kind", [("bert", "mlm"), ("roberta", "qa"), ("xlm-roberta", "mlm"),
                                          ("distilbert", "qa"), ("electra", "pretrain"), ("camembert", "mlm"),
                                          ("mpnet", "mlm"), ("modernbert", "mlm")])
def test_unsupported_head_loads_the_encoder_with_a_warning(tmp_path, rng, family, kind):
    hf = make_model(tmp_path, family, kind, hidden=48, heads=2, seed=44)
    arch = type(hf).__name__
    left_out = _left_out(tmp_path, hf.base_model_prefix + ".")
    assert left_out
    with pytest.warns(UserWarning, match=rf"{arch}\b.*left out \({len(left_out)} tensor") as record:
        enc = ftbert.Encoder.from_pretrained(tmp_path)
    message = " ".join(str(w.message) for w in record if arch in str(w.message))
    assert any(n in message for n in left_out), message
    assert enc.head is None and enc.config["head"] is None
    ids = rng.integers(3, hf.config.vocab_size, (3, 9))
    mask = ragged_mask(rng, 3, 9)
    ids[mask == 0] = hf.config.pad_token_id
    out = enc(ids, mask)
    assert out.logits is None
    with torch.no_grad():
        backbone = getattr(hf, hf.base_model_prefix)
        ref = backbone(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long()).last_hidden_state
    valid = mask.astype(bool)
    assert np.abs(out.last_hidden_state - ref.numpy())[valid].max() <= TOL



def test_malformed_head_in_a_converted_directory_is_refused_on_load(tmp_path):
    make_model(tmp_path / "hf", "electra", "token", num_labels=2, hidden=48, heads=2, seed=45)
    out = ftbert.convert_checkpoint(tmp_path / "hf", tmp_path / "out", progress=False)
    path = out / "ftbert_config.json"
    cfg = json.loads(path.read_text())
    cfg["head"]["labels"] = ["only one"]
    path.write_text(json.dumps(cfg))
    with pytest.raises(ftbert.FormatError, match=r"head\.labels"):
        ftbert.Encoder.from_pretrained(out)
