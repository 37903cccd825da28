"""HF text-embeddings-inference's routes on a real server (uvicorn on 127.0.0.1, tiny random
checkpoints): huggingface_hub's InferenceClient against POST /, and /embed, /rerank, /predict,
/tokenize in TEI's shapes, each against the direct Encoder result; per-request truncation and its
side, normalize, prompts, and the errors a client can cause."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.serving._helpers import MAX_POS, make_embedder, need_serve_extra, serve
from tests._vocab import random_texts

need_serve_extra()

import httpx  # noqa: E402

import ftbert  # noqa: E402

TOL = 1e-5


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    path = make_embedder(tmp_path_factory.mktemp("embedder"))
    (path / "config_sentence_transformers.json").write_text(json.dumps({"prompts": {"query": "query: "}}))
    return path


def _server(path, **kw):
    return serve(path, **kw)


@pytest.fixture(scope="module")
def embed_server(embedder):
    with _server(embedder, truncate=False) as s:  # refuses long inputs unless a request truncates
        yield s


def text_probs(enc, texts):
    """The classifier's softmax over its logits for single texts, straight from the encoder."""
    batch = enc.tokenizer(texts, padding=True, truncation=True, max_length=enc.max_seq_length,
                          return_tensors="np")
    logits = enc(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids")).logits
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _post(server, route, body):
    return httpx.post(server.url + route, json=body, timeout=60)


def _ok(r):
    assert r.status_code == 200, r.text
    return r.json()


# ---- the Hub's client ------------------------------------------------------------------------
def test_inference_client_feature_extraction_is_encode(embed_server, embedder, rng):
    from huggingface_hub import InferenceClient

    enc = ftbert.Encoder.from_pretrained(embedder)
    client = InferenceClient(base_url=embed_server.url)
    text = random_texts(rng, 1)[0]
    got = client.feature_extraction(text)
    np.testing.assert_allclose(np.asarray(got).reshape(1, -1), enc.encode([text]), rtol=0, atol=TOL)
    raw = client.feature_extraction(text, normalize=False)
    want = enc.encode([text], normalize=False)
    np.testing.assert_allclose(np.asarray(raw).reshape(1, -1), want, rtol=0, atol=TOL)
    prompted = client.feature_extraction(text, prompt_name="query")
    np.testing.assert_allclose(np.asarray(prompted).reshape(1, -1), enc.encode(["query: " + text]), rtol=0, atol=TOL)


def test_inference_client_text_classification_is_predict(classify_server, classifier, rng):
    from huggingface_hub import InferenceClient

    enc = ftbert.Encoder.from_pretrained(classifier)
    client = InferenceClient(base_url=classify_server.url)
    text = random_texts(rng, 1)[0]
    got = client.text_classification(text)
    probs = text_probs(enc, [text])[0]
    assert [e.label for e in got] == [enc.labels[i] for i in np.argsort(-probs, kind="stable")]
    np.testing.assert_allclose([e.score for e in got], np.sort(probs)[::-1], rtol=0, atol=TOL)
    assert len(client.text_classification(text, top_k=2)) == 2


# ---- the routes ------------------------------------------------------------------------------
def test_embed_single_and_batch(embed_server, embedder, rng):
    enc = ftbert.Encoder.from_pretrained(embedder)
    texts = random_texts(rng, 5)
    got = np.asarray(_ok(_post(embed_server, "/embed", {"inputs": texts})), np.float32)
    np.testing.assert_allclose(got, enc.encode(texts), rtol=0, atol=TOL)
    one = np.asarray(_ok(_post(embed_server, "/embed", {"inputs": texts[0]})), np.float32)
    assert one.shape == (1, enc.hidden_size)
    np.testing.assert_allclose(one, got[:1], rtol=0, atol=TOL)
    small = np.asarray(_ok(_post(embed_server, "/embed", {"inputs": texts, "dimensions": 8})))
    assert small.shape == (5, 8)
    np.testing.assert_allclose(np.linalg.norm(small, axis=1), 1.0, rtol=1e-5)


def test_truncation_per_request_and_its_side(embed_server, embedder):
    enc = ftbert.Encoder.from_pretrained(embedder)
    words = enc.tokenizer.convert_ids_to_tokens(list(range(20, 120)))
    words = [w for w in words if w.isalpha()][: MAX_POS + 20]
    long = " ".join(words)
    r = _post(embed_server, "/embed", {"inputs": long})  # the server does not truncate
    assert r.status_code == 413 and "not truncated" in r.json()["error"]["message"], r.text
    right = np.asarray(_ok(_post(embed_server, "/embed", {"inputs": long, "truncate": True})))
    left = np.asarray(_ok(_post(embed_server, "/embed", {"inputs": long, "truncate": True,
                                                        "truncation_direction": "Left"})))
    ids = enc.tokenizer(long)["input_ids"]
    keep = MAX_POS - 2
    head = enc.tokenizer.decode(ids[1:1 + keep])
    tail = enc.tokenizer.decode(ids[-1 - keep:-1])
    np.testing.assert_allclose(right, enc.encode([head]), rtol=0, atol=TOL)
    np.testing.assert_allclose(left, enc.encode([tail]), rtol=0, atol=TOL)
    assert np.abs(right - left).max() > 1e-3


def test_rerank_in_tei_shape(rerank_server, reranker, rng):
    enc = ftbert.Encoder.from_pretrained(reranker)
    query, texts = random_texts(rng, 1)[0], random_texts(rng, 6)
    got = _ok(_post(rerank_server, "/rerank", {"query": query, "texts": texts, "return_text": True}))
    want = enc.predict([(query, t) for t in texts])
    assert [g["index"] for g in got] == list(np.argsort(-want, kind="stable"))
    for g in got:
        assert abs(g["score"] - want[g["index"]]) <= TOL and g["text"] == texts[g["index"]]
    raw = _ok(_post(rerank_server, "/", {"query": query, "texts": texts, "raw_scores": True}))
    logits = enc.predict([(query, t) for t in texts], activation="identity")
    for g in raw:
        assert abs(g["score"] - logits[g["index"]]) <= TOL and "text" not in g


def test_predict_texts_pairs_and_batches(classify_server, classifier, rng):
    enc = ftbert.Encoder.from_pretrained(classifier)
    a, b = random_texts(rng, 2)
    one = _ok(_post(classify_server, "/predict", {"inputs": a}))
    probs = text_probs(enc, [a])[0]
    assert [p["label"] for p in one] == [enc.labels[i] for i in np.argsort(-probs, kind="stable")]
    pair = _ok(_post(classify_server, "/predict", {"inputs": [a, b]}))  # two strings: one pair, as TEI
    pprobs = enc.predict([(a, b)], activation="softmax")[0]
    assert abs(pair[0]["score"] - pprobs.max()) <= TOL
    batch = _ok(_post(classify_server, "/predict", {"inputs": [a, b, a]}))
    assert len(batch) == 3 and batch[0] == one
    pairs = _ok(_post(classify_server, "/predict", {"inputs": [[a, b], [b, a]], "raw_scores": True}))
    logits = enc.predict([(a, b), (b, a)], activation="identity")
    assert abs(pairs[1][0]["score"] - logits[1].max()) <= TOL


def test_tokenize(embed_server, embedder):
    enc = ftbert.Encoder.from_pretrained(embedder)
    words = [w for w in enc.tokenizer.convert_ids_to_tokens(list(range(20, 60))) if w.isalpha()][:3]
    text = " ".join(words)
    got = _ok(_post(embed_server, "/tokenize", {"inputs": text}))
    ids = enc.tokenizer(text)["input_ids"]
    assert [t["id"] for t in got[0]] == ids
    assert got[0][0]["special"] and got[0][0]["start"] is None
    assert [t["text"] for t in got[0][1:-1]] == words
    assert text[got[0][1]["start"]:got[0][1]["stop"]] == words[0]
    plain = _ok(_post(embed_server, "/tokenize", {"inputs": [text], "add_special_tokens": False}))
    assert [t["id"] for t in plain[0]] == ids[1:-1]


@pytest.mark.parametrize("route, body, param", [
    ("/embed", {"inputs": 3}, "inputs"),
    ("/embed", {"inputs": []}, "inputs"),
    ("/embed", {"inputs": "a", "truncation_direction": "middle"}, "truncation_direction"),
    ("/embed", {"inputs": "a", "prompt_name": "passage"}, "prompt_name"),
    ("/embed", {"inputs": "a", "normalize": "yes"}, "normalize"),
    ("/", {"inputs": ["a", 2]}, "inputs"),  # the message names inputs[1]
    ("/tokenize", {"inputs": 5}, "inputs"),
])
def test_wrong_requests_are_422_naming_the_field(embed_server, route, body, param):
    r = _post(embed_server, route, body)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["param"] == param, err


def test_routes_need_their_head(embed_server, classify_server):
    r = _post(embed_server, "/predict", {"inputs": "a"})
    assert r.status_code == 400 and "no task head" in r.json()["error"]["message"]
    r = _post(classify_server, "/rerank", {"query": "q", "texts": ["a"]})
    assert r.status_code == 400 and "3 labels" in r.json()["error"]["message"]
