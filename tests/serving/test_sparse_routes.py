"""POST /embed_sparse (SPLADE, TEI's shape) and /embed_multivector (ColBERT) on a real server (tiny
random checkpoints): each equals Encoder.encode_sparse / encode_multivector for the same texts,
with top_k, normalize and truncation; requests of all kinds at once share the batcher's forwards
and still get their own rows; a front process of `--workers` answers the same; a model without
the head answers 400 saying what is missing, and /info lists the routes a model has."""

from __future__ import annotations

import asyncio
import warnings

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tests._models import make_model
from tests._tokenizers import write_wordpiece_tokenizer
from tests._vocab import random_texts
from tests.serving._helpers import MAX_POS, VOCAB, make_embedder, need_serve_extra, serve

need_serve_extra()

import httpx  # noqa: E402

import ftbert  # noqa: E402

TOL = 1e-5
DIM = 16


def make_splade_colbert(path):
    """A random BertForMaskedLM (hidden 32) with a WordPiece tokenizer and a ColBERT `linear.weight`
    [DIM, 32] beside it: both /embed_sparse and /embed_multivector run on it."""
    model = make_model(path, "bert", kind="mlm", hidden=32, heads=2, layers=1, vocab=VOCAB, max_pos=MAX_POS,
                       fill_biases=True)
    with torch.no_grad():
        model.get_output_embeddings().bias.sub_(0.3)  # some of the vocabulary stays at zero
    model.save_pretrained(path)
    tensors = load_file(path / "model.safetensors")
    tensors["linear.weight"] = torch.randn(DIM, 32, generator=torch.Generator().manual_seed(3)) * 0.3
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    write_wordpiece_tokenizer(path, VOCAB, model_max_length=MAX_POS)
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_splade_colbert(tmp_path_factory.mktemp("splade"))


@pytest.fixture(scope="module")
def enc(model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the MLM head "is left out" of the plain encoder
        return ftbert.Encoder.from_pretrained(model)


@pytest.fixture(scope="module")
def server(model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        with serve(model) as s:
            yield s


@pytest.fixture(scope="module")
def embed_server(tmp_path_factory):
    with serve(make_embedder(tmp_path_factory.mktemp("embedder"))) as s:
        yield s


def _post(server, route, body):
    return httpx.post(server.url + route, json=body, timeout=60)


def _ok(r):
    assert r.status_code == 200, r.text
    return r.json()


def assert_sparse_equal(got_rows, want_rows):
    assert len(got_rows) == len(want_rows)
    for got, (idx, val) in zip(got_rows, want_rows):
        np.testing.assert_array_equal([e["index"] for e in got], idx)
        np.testing.assert_allclose([e["value"] for e in got], val, rtol=0, atol=TOL)


def assert_vectors_equal(got_rows, want_rows):
    assert len(got_rows) == len(want_rows)
    for got, want in zip(got_rows, want_rows):
        np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=0, atol=TOL)


def test_embed_sparse_is_encode_sparse_in_teis_shape(server, enc, rng):
    texts = random_texts(rng, 5)
    got = _ok(_post(server, "/embed_sparse", {"inputs": texts}))
    assert all(set(e) == {"index", "value"} for row in got for e in row)
    assert_sparse_equal(got, enc.encode_sparse(texts))
    assert_sparse_equal(_ok(_post(server, "/embed_sparse", {"inputs": texts[0]})), enc.encode_sparse(texts[:1]))
    top = _ok(_post(server, "/embed_sparse", {"inputs": texts, "top_k": 4}))
    assert_sparse_equal(top, enc.encode_sparse(texts, top_k=4))
    assert all(len(row) == 4 for row in top)


def test_embed_multivector_is_encode_multivector(server, enc, rng):
    texts = random_texts(rng, 4)
    got = _ok(_post(server, "/embed_multivector", {"inputs": texts}))
    assert_vectors_equal(got, enc.encode_multivector(texts))
    assert all(len(row[0]) == DIM for row in got)
    raw = _ok(_post(server, "/embed_multivector", {"inputs": texts, "normalize": False}))
    assert_vectors_equal(raw, enc.encode_multivector(texts, normalize=False))


def test_truncation_of_the_routes_follows_the_request(server, enc):
    long = "word " * (MAX_POS * 2)
    rows = _ok(_post(server, "/embed_multivector", {"inputs": long}))
    assert len(rows[0]) == MAX_POS  # the server truncates by default, as encode does
    left = _ok(_post(server, "/embed_multivector", {"inputs": long + "end", "truncate": True,
                                                    "truncation_direction": "left"}))
    assert len(left[0]) == MAX_POS
    r = _post(server, "/embed_sparse", {"inputs": long, "truncate": False})
    assert r.status_code == 413 and "more than the limit" in r.json()["error"]["message"]


def test_requests_of_every_kind_at_once_share_forwards_and_get_their_own_rows(server, enc, rng):
    texts = random_texts(rng, 24)
    want_sparse = enc.encode_sparse(texts)
    want_k = enc.encode_sparse(texts, top_k=3)
    want_multi = enc.encode_multivector(texts)
    want_raw = enc.encode_multivector(texts, normalize=False)
    want_embed = enc.encode(texts)

    async def run():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            calls = []
            for i, t in enumerate(texts):
                calls += [c.post("/embed_sparse", json={"inputs": [t]}),
                          c.post("/embed_sparse", json={"inputs": [t], "top_k": 3}),
                          c.post("/embed_multivector", json={"inputs": [t]}),
                          c.post("/embed_multivector", json={"inputs": [t], "normalize": False}),
                          c.post("/embed", json={"inputs": [t]})]
            return await asyncio.gather(*calls)

    replies = [_ok(r) for r in asyncio.run(run())]
    for i in range(len(texts)):
        sparse, top, multi, raw, emb = replies[5 * i : 5 * i + 5]
        assert_sparse_equal(sparse, want_sparse[i : i + 1])
        assert_sparse_equal(top, want_k[i : i + 1])
        assert_vectors_equal(multi, want_multi[i : i + 1])
        assert_vectors_equal(raw, want_raw[i : i + 1])
        np.testing.assert_allclose(emb[0], want_embed[i], rtol=0, atol=TOL)


def test_info_lists_the_routes_the_model_has(server, embed_server):
    routes = httpx.get(server.url + "/info").json()["routes"]
    assert "/embed_sparse" in routes and "/embed_multivector" in routes
    routes = httpx.get(embed_server.url + "/info").json()["routes"]
    assert "/embed_sparse" not in routes and "/embed_multivector" not in routes


@pytest.mark.parametrize("route, words", [("/embed_sparse", "masked-LM head"),
                                          ("/embed_multivector", "token projection")])
def test_a_model_without_the_head_answers_400_saying_what_is_missing(embed_server, route, words):
    r = _post(embed_server, route, {"inputs": ["a text"]})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert words in err["message"] and "the loaded model has none" in err["message"]
    assert err["type"] == "invalid_request_error"


@pytest.mark.parametrize("route, body, param", [
    ("/embed_sparse", {"inputs": 3}, "inputs"),
    ("/embed_sparse", {"inputs": []}, "inputs"),
    ("/embed_sparse", {"inputs": "a", "top_k": 0}, "top_k"),
    ("/embed_sparse", {"inputs": "a", "prompt_name": "query"}, "prompt_name"),
    ("/embed_multivector", {"inputs": ["a", 1]}, "inputs"),
    ("/embed_multivector", {"inputs": "a", "normalize": "yes"}, "normalize"),
])
def test_bad_requests_answer_422_naming_the_field(server, route, body, param):
    r = _post(server, route, body)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["param"] == param


def test_a_front_process_answers_as_one_process_does(model, enc, rng):
    from tests.serving.test_workers import WorkersServer

    texts = random_texts(rng, 6)
    front = WorkersServer(model)
    try:
        assert_sparse_equal(front.client.post("/embed_sparse", json={"inputs": texts, "top_k": 5}).json(),
                            enc.encode_sparse(texts, top_k=5))
        assert_vectors_equal(front.client.post("/embed_multivector", json={"inputs": texts}).json(),
                             enc.encode_multivector(texts))
        assert "/embed_sparse" in front.client.get("/info").json()["routes"]
    finally:
        status, err = front.stop()
    assert status == 0, err[-3000:]


def test_a_front_of_a_model_without_the_head_answers_400(tmp_path):
    from tests.serving.test_workers import WorkersServer

    front = WorkersServer(make_embedder(tmp_path))
    try:
        r = front.client.post("/embed_sparse", json={"inputs": "a text"})
        assert r.status_code == 400 and "masked-LM head" in r.json()["error"]["message"]
    finally:
        status, err = front.stop()
    assert status == 0, err[-3000:]

