"""Text pairs in, scores out: the cross-encoder API behind `Encoder.predict` and `Encoder.rank`.

It follows sentence-transformers' `CrossEncoder` so that a reranker or an NLI checkpoint gives the
same numbers here as there:
- pairs are tokenized together by the checkpoint's own tokenizer, `tok(firsts, seconds,
  padding=True, truncation="longest_first", max_length=...)`: the tokenizer's pair template
  decides the separators and token types, and "longest_first" trims the longer text of a pair
  first;
- the truncation length is the one `CrossEncoder` ends up with: the tokenizer's model_max_length,
  capped at what the model takes (`Encoder.max_seq_length`);
- pairs run longest first (ordered as `CrossEncoder` orders them, by characters), in batches of
  `batch_size`, and come back in the caller's order;
- the activation is applied to each batch's logits in float32, then a one-label model's [B, 1]
  becomes [B]. By default it is the checkpoint's recorded one (config.json's
  sentence_transformers.activation_fn), else sigmoid for one label and none for more.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from .text import _pad_to_bucket, tokenizer_lock

if TYPE_CHECKING:
    from .encoder import Encoder

SEQUENCE_CLASSIFICATION = "sequence_classification"
ACTIVATIONS = ("auto", "sigmoid", "softmax", "identity")


# ---- argument checks ------------------------------------------------------------------------
def _check_head(enc: "Encoder", what: str) -> None:
    if enc.head == SEQUENCE_CLASSIFICATION:
        return
    has = "no task head (a bare encoder)" if enc.head is None else f"a {enc.head} head"
    raise ValueError(
        f"{what} needs a sequence-classification head (a checkpoint whose config.json names a "
        f"*ForSequenceClassification architecture); this encoder has {has}"
    )


def _check_batch_size(what: str, batch_size) -> int:
    if isinstance(batch_size, (bool, np.bool_)) or not isinstance(batch_size, (int, np.integer)):
        raise TypeError(f"{what}: batch_size must be an integer, got {batch_size!r}")
    if batch_size < 1:
        raise ValueError(f"{what}: batch_size must be at least 1, got {batch_size}")
    return int(batch_size)


def _type_name(x) -> str:
    return type(x).__name__


def _as_list(x):
    # A numpy array of strings reads as the nested lists it holds (CrossEncoder accepts them too).
    if isinstance(x, np.ndarray) and x.dtype.kind in ("U", "O"):
        return x.tolist()
    return x


def _check_pair(where: str, pair) -> tuple[str, str]:
    pair = _as_list(pair)
    if not isinstance(pair, (list, tuple)):
        raise TypeError(f"predict: {where} is {_type_name(pair)}, expected a (text, text) pair")
    if len(pair) != 2:
        raise ValueError(f"predict: {where} has {len(pair)} items, expected a pair of 2 texts")
    for j, text in enumerate(pair):
        if not isinstance(text, str):
            raise TypeError(f"predict: {where}[{j}] is {_type_name(text)}, expected str")
    return pair[0], pair[1]


def _check_pairs(pairs) -> tuple[list[tuple[str, str]], bool]:
    """The pairs as a list, and whether one bare pair was given (whose score comes back alone)."""
    pairs = _as_list(pairs)
    if isinstance(pairs, (str, bytes)):
        raise TypeError(
            f"predict: pairs is a {_type_name(pairs)}, expected a list of (text, text) pairs "
            "(or one pair)"
        )
    if not isinstance(pairs, (list, tuple)):
        raise TypeError(
            f"predict: pairs is {_type_name(pairs)}, expected a list of (text, text) pairs (or one pair)"
        )
    if len(pairs) == 0:
        raise ValueError("predict: pairs is empty; give at least one (text, text) pair")
    # As CrossEncoder decides: a sequence whose first item is a text is one pair, not a batch.
    if isinstance(pairs[0], str):
        return [_check_pair("pairs (one pair)", pairs)], True
    return [_check_pair(f"pairs[{i}]", p) for i, p in enumerate(pairs)], False


def _resolve_activation(enc: "Encoder", activation) -> Callable[[Any], Any] | None:
    """The function applied to each batch's float32 logits [B, num_labels], or None for none."""
    if callable(activation):
        return activation
    if activation is None:
        return None
    if not isinstance(activation, str):
        raise TypeError(
            f"activation must be one of {', '.join(map(repr, ACTIVATIONS))}, None or a callable, "
            f"got {_type_name(activation)}"
        )
    if activation not in ACTIVATIONS:
        raise ValueError(
            f"unknown activation {activation!r}: expected one of {', '.join(map(repr, ACTIVATIONS))}, "
            "None or a callable"
        )
    if activation == "auto":
        return auto_activation(enc.config, enc.num_labels)
    return _activation_function(activation)


def auto_activation(config: dict, num_labels: int | None) -> Callable[[Any], Any] | None:
    """activation="auto": the checkpoint's score activation (CrossEncoder's, in the engine config's
    head), else sigmoid for one label and none for several."""
    head = config.get("head") or {}
    return _activation_function(head.get("score_activation") or ("sigmoid" if num_labels == 1 else "identity"))


def _activation_function(activation: str) -> Callable[[Any], Any] | None:
    import torch

    if activation == "sigmoid":
        return torch.sigmoid
    if activation == "softmax":
        # Over the labels, as torch.nn.Softmax() (CrossEncoder's) does on [B, N].
        return lambda scores: torch.softmax(scores, dim=-1)
    return None


# ---- scoring --------------------------------------------------------------------------------
def _truncation_length(enc: "Encoder", tok) -> int:
    # CrossEncoder truncates at the tokenizer's model_max_length (capped at max_position_embeddings);
    # the engine's own limit also holds. Tokenizers without a limit store a huge sentinel.
    limit = enc.max_seq_length
    own = getattr(tok, "model_max_length", None)
    if isinstance(own, int) and not isinstance(own, bool) and own > 0:
        limit = min(limit, own)
    return limit


def _score(enc: "Encoder", pairs: list[tuple[str, str]], batch_size: int, act) -> np.ndarray:
    import torch

    lock = tokenizer_lock(enc)
    with lock:  # the first call loads the tokenizer: once, however many threads arrive together
        tok = enc.tokenizer
        pad_id = tok.pad_token_id or 0
        max_length = _truncation_length(enc, tok)
    num_labels = enc.num_labels
    # CrossEncoder's order (longest pair first, by characters, numpy's argsort), so that a callable
    # activation sees the same batches there and here; the caller's order is restored below.
    order = np.argsort([-(len(a) + len(b)) for a, b in pairs])
    device = enc.device if enc.device.startswith("cuda") else "cpu"
    out: np.ndarray | None = None
    for start in range(0, len(pairs), batch_size):
        idx = order[start : start + batch_size]
        with lock:  # not held for the forward below: other threads tokenize meanwhile
            batch = tok(
                [pairs[i][0] for i in idx],
                [pairs[i][1] for i in idx],
                padding=True,
                truncation="longest_first",
                max_length=max_length,
                return_tensors="pt",
            )
        ids, mask = batch["input_ids"], batch["attention_mask"]
        types = batch.get("token_type_ids")
        types = torch.zeros_like(ids) if types is None else types
        if device != "cpu":
            ids, mask, types = _pad_to_bucket(ids, mask, types, enc, pad_id)
        ids, mask, types = ids.to(device), mask.to(device), types.to(device)
        logits = enc(ids, mask, types).logits
        scores = logits.float()  # a float16/bfloat16 encoder's logits: activations in float32
        if act is not None:
            scores = torch.as_tensor(act(scores))
            if scores.dim() == 0 or scores.shape[0] != len(idx):
                raise ValueError(
                    f"activation returned shape {tuple(scores.shape)} for a batch of {len(idx)} pairs; "
                    "it must keep the batch dimension first"
                )
        if num_labels == 1 and scores.dim() > 1:
            scores = scores.squeeze(-1)
        scores = scores.detach().to("cpu", torch.float32).numpy()
        if out is None:
            out = np.empty((len(pairs), *scores.shape[1:]), dtype=np.float32)
        elif scores.shape[1:] != out.shape[1:]:
            raise ValueError(
                f"activation returned rows of shape {scores.shape[1:]} for one batch and "
                f"{out.shape[1:]} for another"
            )
        out[idx] = scores
    assert out is not None
    return out


def predict(enc: "Encoder", pairs, batch_size: int = 32, activation="auto"):
    """Scores text pairs with `enc`'s sequence-classification head, as sentence-transformers'
    `CrossEncoder.predict` does.

    pairs: a list (or tuple) of (text, text) pairs, each a list or tuple of two str; or one pair
    (then the result is that pair's score alone: a numpy float32 scalar for one label, else
    [num_labels]). activation: "auto" (the checkpoint's recorded score activation, else sigmoid for
    one label and none for more), "sigmoid", "softmax" (over the labels), "identity", None (as
    "identity"), or a callable taking and returning a torch tensor of float32 logits [B, num_labels].

    Returns numpy float32: [N] for a one-label model, else [N, num_labels].
    """
    _check_head(enc, "predict")
    checked, single = _check_pairs(pairs)
    batch_size = _check_batch_size("predict", batch_size)
    act = _resolve_activation(enc, activation)
    scores = _score(enc, checked, batch_size, act)
    return scores[0] if single else scores


def rank(
    enc: "Encoder",
    query: str,
    documents: Sequence[str],
    top_k: int | None = None,
    return_documents: bool = False,
    batch_size: int = 32,
    activation="auto",
) -> list[dict]:
    """Scores each document against `query` with a one-label cross-encoder and orders them, best
    first, as sentence-transformers' `CrossEncoder.rank` does: a list of {"corpus_id": index in
    `documents`, "score": float[, "text": the document when return_documents]}, the first `top_k`
    (all when None). Equal scores keep the documents' order."""
    _check_head(enc, "rank")
    if enc.num_labels != 1:
        raise ValueError(
            f"rank needs a one-label cross-encoder (a relevance score per pair); this one has "
            f"num_labels={enc.num_labels} ({', '.join(enc.labels)}): use predict with "
            "(query, document) pairs instead"
        )
    if not isinstance(query, str):
        raise TypeError(f"rank: query is {_type_name(query)}, expected str")
    documents = _as_list(documents)
    if isinstance(documents, (str, bytes)) or not isinstance(documents, (list, tuple)):
        raise TypeError(f"rank: documents is {_type_name(documents)}, expected a list of str")
    if len(documents) == 0:
        raise ValueError("rank: documents is empty; give at least one document")
    for i, doc in enumerate(documents):
        if not isinstance(doc, str):
            raise TypeError(f"rank: documents[{i}] is {_type_name(doc)}, expected str")
    if top_k is not None:
        if isinstance(top_k, (bool, np.bool_)) or not isinstance(top_k, (int, np.integer)):
            raise TypeError(f"rank: top_k must be an integer or None, got {top_k!r}")
        if top_k < 1:
            raise ValueError(f"rank: top_k must be at least 1 (or None for all), got {top_k}")
    if not isinstance(return_documents, (bool, np.bool_)):
        raise TypeError(f"rank: return_documents must be True or False, got {return_documents!r}")
    batch_size = _check_batch_size("rank", batch_size)
    act = _resolve_activation(enc, activation)

    scores = _score(enc, [(query, doc) for doc in documents], batch_size, act)
    if scores.ndim != 1:
        raise ValueError(f"rank: the activation gave scores of shape {scores.shape[1:]} per document, "
                         "expected one number")
    results = []
    for i, score in enumerate(scores.tolist()):
        entry: dict = {"corpus_id": i, "score": score}
        if return_documents:
            entry["text"] = documents[i]
        results.append(entry)
    # sorted() is stable, reverse=True included: equal scores keep the documents' order, as there.
    results.sort(key=lambda r: r["score"], reverse=True)
    return results if top_k is None else results[: int(top_k)]
