"""Task heads in the converter: the head that config.json's `architectures` names (sequence or token
classification, every family) becomes the engine config's "head" and the classifier.* tensors;
labels by id; the CrossEncoder score activation; heads the engine does not run (left out, with a
warning naming the architecture and the tensors); missing or misshapen head tensors; and converted
directories whose "head" is malformed."""

from __future__ import annotations

import json
import shutil
import warnings

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from tests._models import HEADED_FAMILIES as FAMILIES, label_names, make_model

HEADS = {"cls": "sequence_classification", "token": "token_classification"}
# family -> (input, activation) of its sequence head, as transformers' classes compute it.
SEQUENCE_INPUT = {"bert": ("pooler", None), "roberta": ("first_token", "tanh"),
                  "xlm-roberta": ("first_token", "tanh"), "camembert": ("first_token", "tanh"),
                  "distilbert": ("first_token", "relu"), "electra": ("first_token", "gelu"),
                  "mpnet": ("first_token", "tanh"), "modernbert": ("first_token", "gelu"),
                  "nomic_bert": ("pooler", None), "gte": ("pooler", None),
                  "jina_embeddings_v3": ("first_token", "tanh"), "eurobert": ("first_token", "gelu"),
                  "deberta-v2": ("first_token", "gelu")}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """checkpoint(family, kind, num_labels=3) -> (directory, model), made once per module; tests that
    edit one work on a copy (fresh())."""
    made = {}

    def get(family, kind, num_labels=3):
        key = (family, kind, num_labels)
        if key not in made:
            path = tmp_path_factory.mktemp(f"{family}-{kind}-{num_labels}")
            made[key] = path, make_model(path, family, kind, num_labels=num_labels, hidden=48, heads=3,
                                         layers=2, intermediate=80, seed=len(made) + 50)
        return made[key]

    return get


@pytest.fixture
def fresh(tmp_path):
    """fresh(src) -> a copy of a checkpoint directory that the test may edit."""
    count = [0]

    def copy(src):
        count[0] += 1
        return shutil.copytree(src, tmp_path / f"copy{count[0]}")

    return copy


def _edit_config(src, **changes):
    """Sets config.json keys; a value of ... removes the key."""
    path = src / "config.json"
    cfg = json.loads(path.read_text())
    for k, v in changes.items():
        if v is ...:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    path.write_text(json.dumps(cfg))


def _outside_encoder(src, model):
    """The saved tensors that are not the encoder's (not under the task model's prefix), in file order."""
    with safe_open(str(src / "model.safetensors"), framework="pt") as f:
        return [n for n in f.keys() if not n.startswith(model.base_model_prefix + ".")]


# ModernBERT's heads: a dense, GELU and a norm of their own, on token 0 or on every token.
TOKEN_ACTIVATION = {"modernbert": "gelu"}
HEAD_NORM = ("modernbert",)


def _expected_head(family, kind, n, score=None):
    source, activation = SEQUENCE_INPUT[family] if kind == "cls" else ("tokens", TOKEN_ACTIVATION.get(family))
    return {"kind": HEADS[kind], "num_labels": n, "input": source, "activation": activation,
            "norm": family in HEAD_NORM, "labels": label_names(n), "score_activation": score}


@pytest.mark.parametrize("kind", ["cls", "token"])
@pytest.mark.parametrize("family", FAMILIES)
def test_head_named_by_architectures_is_converted(wt, hf, checkpoint, capsys, family, kind):
    src, model = checkpoint(family, kind)
    assert json.loads((src / "config.json").read_text())["architectures"] == [type(model).__name__]
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a head the engine runs is no cause for a warning
        config, tensors = wt.load_hf_checkpoint(src, progress=True)
    out = capsys.readouterr().out
    assert f"{HEADS[kind].replace('_', ' ')} head of 3 label(s)" in out
    assert "left out" not in out and "unrecognised" not in out
    assert config["head"] == _expected_head(family, kind, 3)
    keys = list(config)
    assert keys[keys.index("has_pooler") + 1] == "head"
    # A sequence head on the pooler (BERT's, NomicBERT's, GTE's) keeps it; the others have none.
    assert config["has_pooler"] is (SEQUENCE_INPUT[family][0] == "pooler" and kind == "cls")
    # Every tensor, the head's included, equals the one built from the HF modules; the head's come
    # last: its own dense ([H, H]) where it has one, then the output Linear ([H, num_labels]).
    ref = hf.reference_tensors(model)
    assert list(tensors) == [n for n, _ in wt.expected_tensors(config)]
    assert set(tensors) == set(ref)
    for name, t in tensors.items():
        assert torch.equal(t, ref[name]), name
    own_dense = config["head"]["activation"] is not None
    norm = config["head"]["norm"]
    head_names = (["classifier.dense_weight", "classifier.dense_bias"] * own_dense + ["classifier.norm_gamma"] * norm
                  + ["classifier.out_weight", "classifier.out_bias"])
    assert list(tensors)[-len(head_names):] == head_names
    assert tensors["classifier.out_weight"].shape == (48, 3) and tensors["classifier.out_bias"].shape == (3,)
    # Every tensor of the checkpoint is used: nothing is left out (ModernBERT's dense has no bias:
    # the converter's zeros stand for it).
    bias_free = family == "modernbert"
    assert len(_outside_encoder(src, model)) == len(head_names) - bias_free


@pytest.mark.parametrize("family", FAMILIES)
def test_bare_model_has_no_head_and_no_warning(wt, checkpoint, family):
    src, _ = checkpoint(family, "model")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config, tensors = wt.load_hf_checkpoint(src)
    assert config["head"] is None
    assert not any(n.startswith("classifier.") for n in tensors)


def test_labels_are_read_by_id_past_nine(wt, checkpoint, fresh):
    # Ids 10 and up: a string sort of the keys would put "10" before "2".
    src, _ = checkpoint("bert", "token", num_labels=12)
    config, tensors = wt.load_hf_checkpoint(src)
    assert config["head"]["labels"] == label_names(12) and config["head"]["num_labels"] == 12
    assert tensors["classifier.out_bias"].shape == (12,)
    # The order of the keys in the file does not matter either.
    src = fresh(src)
    names = label_names(12)
    _edit_config(src, id2label={str(i): names[i] for i in reversed(range(12))})
    assert wt.load_hf_checkpoint(src)[0]["head"]["labels"] == names


def test_labels_without_id2label_are_transformers_defaults(wt, checkpoint, fresh):
    from transformers import AutoConfig

    src = fresh(checkpoint("roberta", "cls")[0])
    _edit_config(src, id2label=..., label2id=..., num_labels=3)
    want = AutoConfig.from_pretrained(src).id2label
    head = wt.load_hf_checkpoint(src)[0]["head"]
    assert head["labels"] == [want[i] for i in range(3)] == ["LABEL_0", "LABEL_1", "LABEL_2"]


@pytest.mark.parametrize("activation_fn, expected", [
    ("torch.nn.modules.activation.Sigmoid", "sigmoid"),
    ("torch.nn.modules.linear.Identity", "identity"),
    ("torch.nn.modules.activation.Softmax", "softmax"),
    (..., None),
])
def test_score_activation_is_sentence_transformers(wt, checkpoint, fresh, activation_fn, expected):
    # sentence-transformers' CrossEncoder records the activation it applies to the logits in config.json.
    src = fresh(checkpoint("xlm-roberta", "cls", num_labels=1)[0])
    if activation_fn is not ...:
        _edit_config(src, sentence_transformers={"activation_fn": activation_fn, "version": "5.0.0"})
    head = wt.load_hf_checkpoint(src)[0]["head"]
    assert head == _expected_head("xlm-roberta", "cls", 1, score=expected)


@pytest.mark.parametrize("family, kind", [
    ("bert", "mlm"), ("bert", "qa"), ("roberta", "mlm"), ("xlm-roberta", "qa"), ("camembert", "qa"),
    ("distilbert", "mlm"), ("distilbert", "qa"), ("electra", "pretrain"), ("electra", "qa"),
])
def test_unsupported_head_is_left_out_with_a_warning(wt, hf, checkpoint, family, kind):
    src, model = checkpoint(family, kind)
    arch = type(model).__name__
    left_out = _outside_encoder(src, model)
    assert left_out
    with pytest.warns(UserWarning, match=rf"{arch}\b.*left out \({len(left_out)} tensor") as record:
        config, tensors = wt.load_hf_checkpoint(src)
    message = " ".join(str(w.message) for w in record if arch in str(w.message))
    assert left_out[0] in message, message  # the tensors are named, as the checkpoint spells them
    assert config["head"] is None
    ref = hf.reference_tensors(model)  # the encoder's alone
    assert set(tensors) == set(ref)
    assert all(torch.equal(t, ref[n]) for n, t in tensors.items())


def test_unsupported_head_converts_to_a_headless_directory(wt, checkpoint, tmp_path):
    src, model = checkpoint("electra", "pretrain")
    with pytest.warns(UserWarning, match="ElectraForPreTraining"):
        out = wt.convert_checkpoint(src, tmp_path / "out", progress=False)
    assert json.loads((out / "ftbert_config.json").read_text())["head"] is None
    config, tensors = wt.read_converted(out)
    assert config["head"] is None and not any(n.startswith("classifier.") for n in tensors)


def test_checkpoint_without_architectures_gets_no_head(wt, checkpoint, fresh):
    # The head comes from `architectures`, not from which tensors happen to be there: without one,
    # the classifier is left out, and said so.
    src = fresh(checkpoint("bert", "cls")[0])
    _edit_config(src, architectures=...)
    with pytest.warns(UserWarning, match=r"left out \(2 tensor.*classifier\."):
        config, _ = wt.load_hf_checkpoint(src)
    assert config["head"] is None


def _head_cases():
    """(family, kind, index of the head tensor to remove): every tensor of every sequence head, and
    the output Linear of two token heads."""
    cases = [(f, "cls", i) for f in FAMILIES for i in range(2 if SEQUENCE_INPUT[f][0] == "pooler" else 4)]
    return cases + [("roberta", "token", 0), ("electra", "token", 1)]


@pytest.mark.parametrize("family, kind, index", _head_cases())
def test_missing_head_tensor_is_refused_naming_it(wt, checkpoint, fresh, family, kind, index):
    src, model = checkpoint(family, kind)
    src = fresh(src)
    names = _outside_encoder(src, model)
    assert len(names) == (2 if SEQUENCE_INPUT[family][0] == "pooler" or kind == "token" else 4)
    name = names[index]
    path = src / "model.safetensors"
    sd = load_file(str(path))
    del sd[name]
    save_file(sd, str(path), metadata={"format": "pt"})
    with pytest.raises(wt.ConversionError, match=f"missing tensor '{name}'"):
        wt.load_hf_checkpoint(src)


def test_head_wider_than_its_labels_is_refused_naming_the_tensor(wt, checkpoint, fresh):
    # config.json says 4 labels; the classifier has 3 rows.
    src = fresh(checkpoint("camembert", "cls")[0])
    _edit_config(src, id2label={str(i): f"l{i}" for i in range(4)}, label2id=...)
    with pytest.raises(wt.ConversionError, match=r"'classifier\.out_proj\.weight' has shape \[3, 48\]"):
        wt.load_hf_checkpoint(src)


def test_bert_sequence_head_without_its_pooler_is_refused(wt, checkpoint, fresh):
    # BertForSequenceClassification's classifier reads the pooler output: without a pooler the
    # logits cannot be computed.
    src, model = checkpoint("bert", "cls")
    src = fresh(src)
    path = src / "model.safetensors"
    sd = load_file(str(path))
    for n in [n for n in sd if ".pooler." in n]:
        del sd[n]
    save_file(sd, str(path), metadata={"format": "pt"})
    with pytest.raises(wt.ConversionError, match="pooler"):
        wt.load_hf_checkpoint(src)


@pytest.fixture(scope="module")
def converted_head(wt, checkpoint, tmp_path_factory):
    """A converted RoBERTa sequence-classification directory (input "first_token", no pooler)."""
    src, _ = checkpoint("roberta", "cls")
    return wt.convert_checkpoint(src, tmp_path_factory.mktemp("converted-head"), progress=False)


def _head_edit(**changes):
    def edit(head):
        for k, v in changes.items():
            if v is ...:
                head.pop(k)
            else:
                head[k] = v
        return head
    return edit


@pytest.mark.parametrize("edit, pattern", [
    (lambda h: [h], r"head must be null or an object"),
    (_head_edit(kind="regression"), r"head\.kind"),
    (_head_edit(kind=None), r"head\.kind"),
    (_head_edit(num_labels=0, labels=[]), r"head\.num_labels"),
    (_head_edit(num_labels=3.0), r"head\.num_labels"),
    (_head_edit(num_labels="3"), r"head\.num_labels"),
    (_head_edit(num_labels=True), r"head\.num_labels"),
    (_head_edit(labels=["a", "b"]), r"head\.labels"),
    (_head_edit(labels=["a", "b", 3]), r"head\.labels"),
    (_head_edit(labels="abc"), r"head\.labels"),
    (_head_edit(input="tokens"), r"head\.input"),  # a token head's input on a sequence head
    (_head_edit(input="pooler", activation=None), r"head\.input"),  # no pooler in this directory
    (_head_edit(kind="token_classification"), r"head\.input"),  # first_token on a token head
    (_head_edit(activation="swish"), r"head\.activation"),
    (_head_edit(activation=None), r"head\.activation"),
    (_head_edit(score_activation="tanh"), r"head\.score_activation"),
    (_head_edit(labels=...), r"head: missing labels"),
    (_head_edit(bias=True), r"head: unknown bias"),
])
def test_malformed_head_is_a_format_error_naming_the_key(wt, converted_head, tmp_path, edit, pattern):
    out = shutil.copytree(converted_head, tmp_path / "out")
    path = out / "ftbert_config.json"
    cfg = json.loads(path.read_text())
    cfg["head"] = edit(cfg["head"])
    path.write_text(json.dumps(cfg))
    with pytest.raises(wt.FormatError, match=pattern):
        wt.read_converted(out)


def test_head_whose_labels_disagree_with_its_tensors_is_a_format_error(wt, converted_head, tmp_path):
    # A consistent head of 4 labels over a classifier of 3: the tensor is named.
    out = shutil.copytree(converted_head, tmp_path / "out")
    path = out / "ftbert_config.json"
    cfg = json.loads(path.read_text())
    cfg["head"].update(num_labels=4, labels=label_names(4))
    path.write_text(json.dumps(cfg))
    with pytest.raises(wt.FormatError, match=r"classifier\.out_(weight|bias)"):
        wt.read_converted(out)


def test_converted_directory_without_a_head_key_reads_as_headless(wt, checkpoint, tmp_path):
    # Written before heads existed: no "head" key means no head.
    src, _ = checkpoint("bert", "model")
    out = wt.convert_checkpoint(src, tmp_path / "out", progress=False)
    path = out / "ftbert_config.json"
    cfg = json.loads(path.read_text())
    del cfg["head"]
    path.write_text(json.dumps(cfg))
    config, _ = wt.read_converted(out)
    assert config["head"] is None
