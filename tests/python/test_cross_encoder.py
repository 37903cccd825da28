"""The cross-encoder API (`Encoder.predict`, `Encoder.rank`) against sentence-transformers'
`CrossEncoder` on the same checkpoint directory.

Checkpoints are random *ForSequenceClassification models (tests._models) with a tokenizer trained
offline of the kind the family ships (tests._tokenizers): BERT, DistilBERT and ELECTRA with
WordPiece, RoBERTa with byte-level BPE, XLM-R with Unigram. Their Linear weights are redrawn at
unit gain so the logits move with the input by about 0.1 (at HF's 0.02 init they move by 1e-4, and
a wrong token type or a misplaced separator would hide under the tolerance).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import ftbert
from tests._models import make_model
from tests._tokenizers import WRITERS
from tests._util import assert_close, run_in_threads
from tests._vocab import random_texts
from tests.conftest import RUN_SEED

TOL = 1e-4
VOCAB = 157  # odd, and what every test tokenizer must fit
# (model family, tokenizer kind, transformers tokenizer class): each family with what it ships.
COMBOS = {
    "bert": ("bert", "wordpiece", "BertTokenizer"),
    "distilbert": ("distilbert", "wordpiece", "DistilBertTokenizer"),
    "electra": ("electra", "wordpiece", "ElectraTokenizer"),
    "roberta": ("roberta", "bpe", None),
    "xlm-roberta": ("xlm-roberta", "unigram", None),
}
ST_ACTIVATIONS = {  # config.json's sentence_transformers.activation_fn -> ours
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.Softmax": "softmax",
}


def _spread_weights(model) -> None:
    # Unit-gain Linear weights (std 1/sqrt(fan_in)): logits then vary with the input (see the
    # module docstring). Embedding tables keep their init; LayerNorms and biases stay as
    # tests._models perturbed and filled them.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embeddings" not in name:
                p.normal_(0.0, p.shape[1] ** -0.5)


class Checkpoint:
    def __init__(self, path: Path, model, combo: str):
        self.path, self.model, self.combo = path, model, combo
        self._ce = {}
        self._enc = None

    @property
    def enc(self) -> ftbert.Encoder:
        if self._enc is None:
            self._enc = ftbert.Encoder.from_pretrained(self.path)
        return self._enc

    def ce(self, **kwargs):
        """sentence-transformers' CrossEncoder on this directory (CPU, offline)."""
        from sentence_transformers import CrossEncoder

        key = tuple(sorted(kwargs.items()))
        if key not in self._ce:
            self._ce[key] = CrossEncoder(str(self.path), device="cpu", local_files_only=True, **kwargs)
        return self._ce[key]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """checkpoint(combo, num_labels=1, kind="cls", model_max_length=512, st_activation=None,
    st_max_seq_length=None, **model_kwargs) -> Checkpoint, built once per module and arguments."""
    built: dict = {}

    def build(combo, num_labels=1, kind="cls", model_max_length=512, st_activation=None,
              st_max_seq_length=None, **model_kwargs):
        key = (combo, num_labels, kind, model_max_length, st_activation, st_max_seq_length,
               tuple(sorted(model_kwargs.items())))
        if key in built:
            return built[key]
        family, tok_kind, tok_class = COMBOS[combo]
        path = tmp_path_factory.mktemp(f"ce-{combo}-{kind}-{num_labels}")
        model = make_model(path, family, kind=kind, num_labels=num_labels, hidden=64, heads=2, layers=2,
                           vocab=VOCAB, seed=(RUN_SEED + len(built)) % (2**31), **model_kwargs)
        _spread_weights(model)
        model.save_pretrained(path)
        if st_activation is not None:
            cfg = json.loads((path / "config.json").read_text())
            cfg["sentence_transformers"] = {"activation_fn": st_activation}
            (path / "config.json").write_text(json.dumps(cfg, indent=2))
        if st_max_seq_length is not None:
            (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": st_max_seq_length}))
        extra = {"tokenizer_class": tok_class} if tok_class else {}
        WRITERS[tok_kind](path, VOCAB, model_max_length=model_max_length, **extra)
        built[key] = Checkpoint(path, model, combo)
        return built[key]

    return build


def random_pairs(rng, n, max_words=30):
    return list(zip(random_texts(rng, n, max_words), random_texts(rng, n, max_words)))


# ---- end to end, every tokenizer kind -----------------------------------------------------------
@pytest.mark.parametrize("combo", COMBOS)
def test_encode_predict_rank_end_to_end(checkpoint, rng, combo):
    ck = checkpoint(combo, num_labels=1)
    enc = ck.enc
    assert enc.head == "sequence_classification" and enc.num_labels == 1

    # encode: mean pooling over what the checkpoint's own encoder (transformers) gives.
    texts = random_texts(rng, int(rng.integers(5, 12)))
    emb = enc.encode(texts, batch_size=3)
    tok = enc.tokenizer
    batch = tok(texts, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        hidden = ck.model.base_model(**batch).last_hidden_state
    m = batch["attention_mask"].unsqueeze(-1).float()
    ref = torch.nn.functional.normalize((hidden * m).sum(1) / m.sum(1), dim=1).numpy()
    assert emb.dtype == np.float32
    assert_close(emb, ref, TOL, "encode")

    # predict: the scores are the head's logits through a sigmoid, pair by pair.
    pairs = random_pairs(rng, int(rng.integers(7, 20)))
    scores = enc.predict(pairs, batch_size=int(rng.integers(2, 6)))
    assert scores.dtype == np.float32 and scores.shape == (len(pairs),)
    batch = tok([a for a, _ in pairs], [b for _, b in pairs], padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        logits = ck.model(**batch).logits
    assert_close(scores, torch.sigmoid(logits).squeeze(-1).numpy(), TOL, "predict vs the transformers model")

    # rank: every document once, best first.
    query, docs = random_texts(rng, 1)[0], random_texts(rng, int(rng.integers(3, 9)))
    ranked = enc.rank(query, docs)
    assert sorted(r["corpus_id"] for r in ranked) == list(range(len(docs)))
    assert all(set(r) == {"corpus_id", "score"} for r in ranked)
    got = [r["score"] for r in ranked]
    assert got == sorted(got, reverse=True)


# ---- predict against CrossEncoder ------------------------------------------------------------
@pytest.mark.parametrize("num_labels", [1, 3])
@pytest.mark.parametrize("combo", COMBOS)
def test_predict_matches_cross_encoder(checkpoint, rng, combo, num_labels):
    ck = checkpoint(combo, num_labels=num_labels)
    pairs = random_pairs(rng, int(rng.integers(19, 44)))
    bs = int(rng.choice([2, 3, 7, 32]))
    ours = ck.enc.predict(pairs, batch_size=bs)
    theirs = ck.ce().predict(pairs, batch_size=bs)
    assert ours.dtype == np.float32
    assert ours.shape == ((len(pairs),) if num_labels == 1 else (len(pairs), num_labels))
    assert_close(ours, theirs, TOL, f"{combo}, {num_labels} labels, batch {bs}")
    # The default activation: sigmoid for one label, none for more.
    logits = ck.enc.predict(pairs, activation="identity")
    want = torch.sigmoid(torch.from_numpy(logits)).numpy() if num_labels == 1 else logits
    assert_close(ours, want, TOL, "the default activation")
    # Sensitivity: the scores differ from pair to pair by far more than the tolerance.
    assert np.ptp(ours, axis=0).min() > 50 * TOL


@pytest.mark.parametrize("num_labels", [1, 3])
def test_pairs_as_lists_tuples_and_arrays(checkpoint, rng, num_labels):
    ck = checkpoint("bert", num_labels=num_labels)
    pairs = random_pairs(rng, 9)
    ref = ck.enc.predict(pairs)
    assert_close(ck.enc.predict([list(p) for p in pairs]), ref, TOL, "lists")
    assert_close(ck.enc.predict(tuple(pairs)), ref, TOL, "a tuple of tuples")
    assert_close(ck.enc.predict(np.array(pairs)), ref, TOL, "a 2-D numpy array of str")


@pytest.mark.parametrize("num_labels", [1, 3])
@pytest.mark.parametrize("as_list", [False, True])
def test_single_pair_like_cross_encoder(checkpoint, rng, num_labels, as_list):
    ck = checkpoint("roberta", num_labels=num_labels)
    a, b = random_pairs(rng, 1)[0]
    pair = [a, b] if as_list else (a, b)
    ours = ck.enc.predict(pair)
    theirs = ck.ce().predict(pair)
    assert type(ours) is type(theirs)
    assert np.shape(ours) == np.shape(theirs) == (() if num_labels == 1 else (num_labels,))
    assert np.asarray(ours).dtype == np.float32
    assert_close(ours, theirs, TOL, "one pair")
    assert_close(ours, ck.enc.predict([pair])[0], TOL, "one pair vs a batch of one")


# ---- activations ------------------------------------------------------------------------------
def _tanh_half(t):
    return torch.tanh(t) * 0.5


@pytest.mark.parametrize("num_labels", [1, 3])
@pytest.mark.parametrize(
    "ours,theirs",
    [
        ("sigmoid", torch.nn.Sigmoid()),
        ("softmax", torch.nn.Softmax(dim=1)),
        ("identity", torch.nn.Identity()),
        (None, torch.nn.Identity()),
        ("auto", None),  # CrossEncoder's None: its default
        (_tanh_half, _tanh_half),
        (torch.nn.Softmax(dim=-1), torch.nn.Softmax(dim=-1)),
    ],
    ids=["sigmoid", "softmax", "identity", "None", "auto", "callable", "module"],
)
def test_activation_matches_cross_encoder(checkpoint, rng, num_labels, ours, theirs):
    ck = checkpoint("xlm-roberta", num_labels=num_labels)
    pairs = random_pairs(rng, int(rng.integers(5, 30)))
    bs = int(rng.integers(2, 9))
    got = ck.enc.predict(pairs, batch_size=bs, activation=ours)
    assert_close(got, ck.ce().predict(pairs, batch_size=bs, activation_fn=theirs), TOL,
                 f"activation {ours!r}")
    logits = ck.enc.predict(pairs, activation="identity")
    if ours == "softmax" and num_labels == 3:
        assert_close(got.sum(1), np.ones(len(pairs)), TOL, "softmax rows")
    if ours in ("identity", None):
        assert_close(got, logits, TOL, "no activation")


def test_activation_callable_sees_float32_batches(checkpoint, rng):
    ck = checkpoint("bert", num_labels=3)
    pairs = random_pairs(rng, 11)
    seen = []

    def spy(t):
        seen.append((t.dtype, tuple(t.shape)))
        return t

    ck.enc.predict(pairs, batch_size=4, activation=spy)
    assert seen == [(torch.float32, (4, 3)), (torch.float32, (4, 3)), (torch.float32, (3, 3))]


# CrossEncoder builds the recorded Softmax without a dim (torch then picks dim 1 and warns).
@pytest.mark.filterwarnings("ignore:Implicit dimension choice for softmax")
@pytest.mark.parametrize("num_labels", [1, 3])
@pytest.mark.parametrize("recorded", list(ST_ACTIVATIONS))
def test_auto_uses_the_recorded_activation(checkpoint, rng, num_labels, recorded):
    ck = checkpoint("bert", num_labels=num_labels, st_activation=recorded)
    assert ck.enc.config["head"]["score_activation"] == ST_ACTIVATIONS[recorded]
    pairs = random_pairs(rng, int(rng.integers(5, 20)))
    ours = ck.enc.predict(pairs)  # "auto"
    assert_close(ours, ck.ce().predict(pairs), TOL, f"auto with {recorded}")
    assert_close(ours, ck.enc.predict(pairs, activation=ST_ACTIVATIONS[recorded]), TOL, "auto vs named")


# ---- truncation ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "combo,limit_from",
    [
        ("bert", "tokenizer"),
        ("roberta", "tokenizer"),
        ("xlm-roberta", "tokenizer"),
        ("distilbert", "tokenizer"),
        ("bert", "sentence_bert_config"),
        ("xlm-roberta", "sentence_bert_config"),
        ("bert", "model_positions"),
    ],
)
def test_truncated_pairs_match_cross_encoder(checkpoint, rng, combo, limit_from):
    limit = 37  # odd, and far below the pairs' lengths
    if limit_from == "tokenizer":  # tokenizer_config.json's model_max_length
        ck = checkpoint(combo, model_max_length=limit)
        ce = ck.ce()
    elif limit_from == "sentence_bert_config":  # sentence-transformers' max_seq_length
        ck = checkpoint(combo, st_max_seq_length=limit)
        ce = ck.ce(max_length=limit)
        assert ck.enc.max_seq_length == limit
    else:  # the model's own positions (the tokenizer says 512)
        ck = checkpoint(combo, max_pos=limit)
        ce = ck.ce()
        assert ck.enc.max_seq_length == limit
    # Pairs of very unequal lengths too, so "longest_first" trims the longer text only.
    firsts = random_texts(rng, 17, max_words=90)
    seconds = random_texts(rng, 17, max_words=90)
    seconds[:5] = random_texts(rng, 5, max_words=3)
    pairs = list(zip(firsts, seconds))
    tok = ck.enc.tokenizer
    full = tok(firsts, seconds)["input_ids"]
    assert max(len(x) for x in full) > limit, "no pair reaches the limit: the test tests nothing"
    bs = int(rng.integers(3, 8))
    ours = ck.enc.predict(pairs, batch_size=bs)
    assert_close(ours, ce.predict(pairs, batch_size=bs), TOL, f"truncated at {limit} ({limit_from})")
    if limit_from != "model_positions":
        assert_close(ours, ck.ce(max_length=limit).predict(pairs, batch_size=bs), TOL,
                     "CrossEncoder(max_length=)")
    ranked = ck.enc.rank(firsts[0], seconds)
    theirs = ce.rank(firsts[0], seconds)
    assert_close([r["score"] for r in ranked], [r["score"] for r in theirs], TOL, "rank, truncated")


# ---- rank ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("combo", ["bert", "roberta", "distilbert"])
def test_rank_matches_cross_encoder(checkpoint, rng, combo):
    ck = checkpoint(combo, num_labels=1)
    query = random_texts(rng, 1)[0]
    docs = random_texts(rng, int(rng.integers(9, 22)))
    n = len(docs)
    bs = int(rng.integers(3, 11))
    theirs_all = ck.ce().rank(query, docs, return_documents=True, batch_size=bs)
    their_score = {r["corpus_id"]: r["score"] for r in theirs_all}
    # CrossEncoder.rank cuts its sorted list with [:top_k]; one direct call checks that reading.
    k = int(rng.integers(2, n))
    assert ck.ce().rank(query, docs, top_k=k, batch_size=bs) == [
        {"corpus_id": r["corpus_id"], "score": r["score"]} for r in theirs_all[:k]]
    for top_k, return_documents in [(None, False), (None, True), (1, True), (k, False), (n, True), (n + 3, False)]:
        ours = ck.enc.rank(query, docs, top_k=top_k, return_documents=return_documents, batch_size=bs)
        theirs = theirs_all[:top_k]
        assert len(ours) == len(theirs) == min(n if top_k is None else top_k, n)
        keys = {"corpus_id", "score", "text"} if return_documents else {"corpus_id", "score"}
        assert all(set(r) == keys for r in ours)
        assert all(type(r["corpus_id"]) is int and type(r["score"]) is float for r in ours)
        if return_documents:
            assert all(r["text"] == docs[r["corpus_id"]] for r in ours)
        # Position by position, CrossEncoder's scores (a near-tie may swap two documents).
        assert_close([r["score"] for r in ours], [r["score"] for r in theirs], TOL, f"top_k={top_k}")
        assert_close([their_score[r["corpus_id"]] for r in ours], [r["score"] for r in theirs], TOL,
                     "the documents at each position")
        assert len({r["corpus_id"] for r in ours}) == len(ours)


def test_rank_ties_keep_document_order(checkpoint, rng):
    ck = checkpoint("bert", num_labels=1)
    docs = random_texts(rng, 13)

    def flat(t):  # every document scores the same
        return torch.zeros_like(t)

    ours = ck.enc.rank("q", docs, activation=flat, batch_size=4)
    theirs = ck.ce().rank("q", docs, activation_fn=flat, batch_size=4)
    assert [r["corpus_id"] for r in ours] == [r["corpus_id"] for r in theirs] == list(range(13))


def test_rank_activation(checkpoint, rng):
    ck = checkpoint("xlm-roberta", num_labels=1)
    query, docs = random_texts(rng, 1)[0], random_texts(rng, 15)
    ours = ck.enc.rank(query, docs, activation="identity", top_k=6)
    theirs = ck.ce().rank(query, docs, activation_fn=torch.nn.Identity(), top_k=6)
    assert_close([r["score"] for r in ours], [r["score"] for r in theirs], TOL, "rank on logits")


# ---- threads ------------------------------------------------------------------------------------
def test_predict_from_threads(checkpoint, rng):
    ck = checkpoint("roberta", num_labels=3)
    work = [random_pairs(rng, int(rng.integers(3, 25))) for _ in range(6)]
    ref = [ck.enc.predict(p, batch_size=5) for p in work]
    got = run_in_threads(6, lambda t: ck.enc.predict(work[t], batch_size=5), timeout=120)
    for t in range(6):
        assert_close(got[t], ref[t], TOL, f"thread {t}")


# ---- errors -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "pairs,exc,pattern",
    [
        (5, TypeError, r"pairs is int"),
        (None, TypeError, r"pairs is NoneType"),
        ("text", TypeError, r"pairs is a str"),
        ({"a": "b"}, TypeError, r"pairs is dict"),
        ((t for t in [("a", "b")]), TypeError, r"pairs is generator"),
        ([], ValueError, r"pairs is empty"),
        ((), ValueError, r"pairs is empty"),
        ([("a", "b"), 7], TypeError, r"pairs\[1\] is int"),
        ([("a", "b"), ("a", "b"), ("a", "b", "c")], ValueError, r"pairs\[2\] has 3 items"),
        ([("a", "b"), ("a",)], ValueError, r"pairs\[1\] has 1 items"),
        ([("a", "b"), ("a", 3)], TypeError, r"pairs\[1\]\[1\] is int"),
        ([(None, "b")], TypeError, r"pairs\[0\]\[0\] is NoneType"),
        ([["a", "b"], {"a", "b"}], TypeError, r"pairs\[1\] is set"),
        (("a", "b", "c"), ValueError, r"pairs \(one pair\) has 3 items"),
        (("a",), ValueError, r"pairs \(one pair\) has 1 items"),
        (("a", 3), TypeError, r"pairs \(one pair\)\[1\] is int"),
    ],
)
def test_predict_rejects_malformed_pairs(checkpoint, pairs, exc, pattern):
    enc = checkpoint("bert", num_labels=1).enc
    with pytest.raises(exc, match=pattern):
        enc.predict(pairs)


@pytest.mark.parametrize(
    "kwargs,exc,pattern",
    [
        ({"batch_size": 0}, ValueError, r"batch_size must be at least 1, got 0"),
        ({"batch_size": -3}, ValueError, r"batch_size must be at least 1, got -3"),
        ({"batch_size": 2.5}, TypeError, r"batch_size must be an integer"),
        ({"batch_size": True}, TypeError, r"batch_size must be an integer"),
        ({"activation": "relu"}, ValueError, r"unknown activation 'relu'"),
        ({"activation": "Sigmoid"}, ValueError, r"unknown activation 'Sigmoid'"),
        ({"activation": 3}, TypeError, r"activation must be one of"),
    ],
)
def test_predict_rejects_bad_arguments(checkpoint, kwargs, exc, pattern):
    enc = checkpoint("bert", num_labels=1).enc
    with pytest.raises(exc, match=pattern):
        enc.predict([("a b", "c d")], **kwargs)


def test_predict_rejects_activation_that_drops_the_batch(checkpoint):
    enc = checkpoint("bert", num_labels=3).enc
    with pytest.raises(ValueError, match=r"activation returned shape \(\)"):
        enc.predict([("a", "b"), ("c", "d")], activation=lambda t: t.sum())


@pytest.mark.parametrize(
    "args,kwargs,exc,pattern",
    [
        ((5, ["a"]), {}, TypeError, r"query is int"),
        (("q", "doc"), {}, TypeError, r"documents is str"),
        (("q", None), {}, TypeError, r"documents is NoneType"),
        (("q", []), {}, ValueError, r"documents is empty"),
        (("q", ["a", "b", 3]), {}, TypeError, r"documents\[2\] is int"),
        (("q", ["a", ("b", "c")]), {}, TypeError, r"documents\[1\] is tuple"),
        (("q", ["a", "b"]), {"top_k": 0}, ValueError, r"top_k must be at least 1"),
        (("q", ["a", "b"]), {"top_k": -2}, ValueError, r"top_k must be at least 1"),
        (("q", ["a", "b"]), {"top_k": 1.5}, TypeError, r"top_k must be an integer"),
        (("q", ["a", "b"]), {"batch_size": 0}, ValueError, r"batch_size must be at least 1"),
        (("q", ["a", "b"]), {"activation": "tanh"}, ValueError, r"unknown activation 'tanh'"),
        (("q", ["a", "b"]), {"return_documents": "yes"}, TypeError, r"return_documents must be"),
    ],
)
def test_rank_rejects_bad_arguments(checkpoint, args, kwargs, exc, pattern):
    enc = checkpoint("bert", num_labels=1).enc
    with pytest.raises(exc, match=pattern):
        enc.rank(*args, **kwargs)


def test_rank_needs_one_label(checkpoint):
    enc = checkpoint("bert", num_labels=3).enc
    with pytest.raises(ValueError, match=r"rank needs a one-label cross-encoder.*num_labels=3"):
        enc.rank("q", ["a", "b"])


@pytest.mark.parametrize("combo", ["bert", "roberta"])
def test_no_head_raises(checkpoint, combo):
    enc = checkpoint(combo, kind="model").enc
    assert enc.head is None
    with pytest.raises(ValueError, match=r"predict needs a sequence-classification head.*no task head"):
        enc.predict([("a", "b")])
    with pytest.raises(ValueError, match=r"rank needs a sequence-classification head.*no task head"):
        enc.rank("q", ["a"])


def test_token_head_raises(checkpoint):
    enc = checkpoint("bert", num_labels=3, kind="token").enc
    assert enc.head == "token_classification"
    with pytest.raises(ValueError, match=r"sequence-classification head.*token_classification head"):
        enc.predict([("a", "b")])


# ---- GPU ----------------------------------------------------------------------------------------
def _cuda_ready() -> bool:
    from ftbert._native import _C

    return torch.cuda.is_available() and _C.cuda_backend_built()


@pytest.mark.skipif(not _cuda_ready(), reason="needs a GPU and ftbert's CUDA backend")
@pytest.mark.parametrize("num_labels", [1, 3])
def test_cuda_matches_cpu(checkpoint, rng, num_labels):
    ck = checkpoint("roberta", num_labels=num_labels)
    gpu = ftbert.Encoder.from_pretrained(ck.path, device="cuda")
    pairs = random_pairs(rng, int(rng.integers(10, 40)))
    bs = int(rng.integers(3, 9))
    assert_close(gpu.predict(pairs, batch_size=bs), ck.enc.predict(pairs, batch_size=bs), TOL, "cuda vs cpu")
    query, docs = random_texts(rng, 1)[0], random_texts(rng, 11)
    if num_labels == 1:
        assert_close([r["score"] for r in gpu.rank(query, docs)], [r["score"] for r in ck.enc.rank(query, docs)],
                     TOL, "rank, cuda vs cpu")
