"""The HTTP routes on a real server (uvicorn on 127.0.0.1, tiny random checkpoints): the official
`openai` client's embeddings equal `Encoder.encode`, /rerank and /classify equal `predict`, and
every error a client can cause answers its status with an OpenAI-style JSON error."""

from __future__ import annotations

import base64
import threading
import time

import numpy as np
import pytest

from tests.serving._helpers import (OVERFLOW_ID, make_embedder, make_overflowing_embedder, metric, need_serve_extra,
                                    post_and_leave, serve)
from tests._vocab import random_texts

need_serve_extra()

import httpx  # noqa: E402

import ftbert  # noqa: E402
from ftbert.serving import ServeSettings, create_app  # noqa: E402

TOL = 1e-5


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    return make_embedder(tmp_path_factory.mktemp("embedder"))


def _server(path, **kw):
    return serve(path, **kw)


@pytest.fixture(scope="module")
def embed_server(embedder):
    with _server(embedder, max_client_batch=16, max_request_bytes=100_000) as s:
        yield s


@pytest.fixture(scope="module")
def embed_enc(embedder):
    return ftbert.Encoder.from_pretrained(embedder)


def _post(server, route, body, **kw):
    return httpx.post(server.url + route, json=body, timeout=60, **kw)


def assert_error(r, status, param=None, contains=""):
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str) and err["type"], err
    assert err["param"] == param, err
    assert contains in err["message"], err
    return err


# ---- /v1/embeddings ----------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["default", "float", "base64"])
def test_openai_client_embeddings_equal_encode(embed_server, embed_enc, rng, fmt):
    openai = pytest.importorskip("openai", reason="the openai client is not installed (the test extra has it)")

    client = openai.OpenAI(base_url=embed_server.url + "/v1", api_key="unused", max_retries=0)
    texts = random_texts(rng, int(rng.integers(3, 12)), max_words=60)
    kwargs = {} if fmt == "default" else {"encoding_format": fmt}
    resp = client.embeddings.create(model="tiny", input=texts, **kwargs)
    assert [d.index for d in resp.data] == list(range(len(texts)))
    if fmt == "base64":  # asked for explicitly, the client hands the strings over as they came
        got = np.stack([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in resp.data])
    else:  # "float", or the client's default (it asks for base64 and decodes it)
        got = np.array([d.embedding for d in resp.data], dtype=np.float32)
    want = embed_enc.encode(texts)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL)
    tok = embed_enc.tokenizer(texts, truncation=True, max_length=embed_enc.max_seq_length)["input_ids"]
    assert resp.usage.prompt_tokens == resp.usage.total_tokens == sum(map(len, tok))
    assert resp.model == "tiny"


def test_embeddings_one_string_and_token_ids(embed_server, embed_enc, rng):
    texts = random_texts(rng, 3)
    want = embed_enc.encode(texts)
    r = _post(embed_server, "/v1/embeddings", {"input": texts[0], "model": "x"})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["data"][0]["embedding"], want[0], rtol=0, atol=TOL)

    ids = embed_enc.tokenizer(texts)["input_ids"]
    r = _post(embed_server, "/v1/embeddings", {"input": ids[1]})  # one token list
    assert r.status_code == 200, r.text
    assert len(r.json()["data"]) == 1
    np.testing.assert_allclose(r.json()["data"][0]["embedding"], want[1], rtol=0, atol=TOL)
    r = _post(embed_server, "/v1/embeddings", {"input": ids})  # a list of token lists
    got = np.array([d["embedding"] for d in r.json()["data"]])
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL)
    assert r.json()["usage"]["prompt_tokens"] == sum(map(len, ids))


def test_embeddings_dimensions_truncate_and_renormalize(embed_server, embed_enc, rng):
    texts = random_texts(rng, 4)
    dims = int(rng.integers(2, embed_enc.hidden_size))
    r = _post(embed_server, "/v1/embeddings", {"input": texts, "dimensions": dims})
    got = np.array([d["embedding"] for d in r.json()["data"]])
    cut = embed_enc.encode(texts)[:, :dims]
    want = cut / np.linalg.norm(cut, axis=1, keepdims=True)
    assert got.shape == (len(texts), dims)
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL)


def test_long_inputs_are_truncated_by_default(embed_server, embed_enc):
    text = " ".join(["people"] * 500)  # far past the model's 64 positions
    r = _post(embed_server, "/v1/embeddings", {"input": [text]})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == embed_enc.max_seq_length
    np.testing.assert_allclose(r.json()["data"][0]["embedding"], embed_enc.encode([text])[0], rtol=0, atol=TOL)


def test_openai_client_lists_the_model(embed_server):
    openai = pytest.importorskip("openai", reason="the openai client is not installed (the test extra has it)")

    client = openai.OpenAI(base_url=embed_server.url + "/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list()] == ["tiny"]


def test_two_devices_share_the_queue(embedder, embed_enc, rng):
    # Two encoders (both on the CPU here; cuda:0,cuda:1 on a GPU machine), one forward thread each.
    with _server(embedder, devices="cpu,cpu") as s:
        assert httpx.get(s.url + "/info").json()["devices"] == ["cpu", "cpu"]
        texts = [random_texts(rng, int(rng.integers(1, 5))) for _ in range(12)]
        with httpx.Client(base_url=s.url, timeout=60) as c:
            for t in texts:
                got = np.array([d["embedding"] for d in c.post("/v1/embeddings", json={"input": t}).json()["data"]])
                np.testing.assert_allclose(got, embed_enc.encode(t), rtol=0, atol=TOL)


# ---- /rerank and /classify ---------------------------------------------------------------------
def test_rerank_equals_predict_and_rank(rerank_server, reranker, rng):
    enc = ftbert.Encoder.from_pretrained(reranker)
    query = random_texts(rng, 1)[0]
    texts = random_texts(rng, int(rng.integers(4, 10)))
    r = _post(rerank_server, "/v1/rerank", {"query": query, "texts": texts, "return_text": True})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    want = enc.predict([(query, t) for t in texts])  # sigmoid scores
    got = np.empty(len(texts), np.float32)
    for res in results:
        got[res["index"]] = res["score"]
        assert res["text"] == texts[res["index"]]
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL)
    scores = [res["score"] for res in results]
    assert scores == sorted(scores, reverse=True) and len(results) == len(texts)
    assert [res["index"] for res in results] == [h["corpus_id"] for h in enc.rank(query, texts)]

    r = _post(rerank_server, "/v1/rerank", {"query": query, "texts": texts, "raw_scores": True, "top_n": 2})
    results = r.json()["results"]
    raw = enc.predict([(query, t) for t in texts], activation="identity")
    assert len(results) == 2 and "text" not in results[0]
    assert results[0]["index"] == int(np.argmax(raw))
    for res in results:
        assert abs(res["score"] - raw[res["index"]]) <= TOL


def test_classify_equals_predict(classify_server, classifier, rng):
    enc = ftbert.Encoder.from_pretrained(classifier)
    pairs = [list(p) for p in zip(random_texts(rng, 5), random_texts(rng, 5))]
    r = _post(classify_server, "/classify", {"input": pairs})
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    probs = np.array([[s["score"] for s in d["scores"]] for d in data])
    np.testing.assert_allclose(probs, enc.predict([tuple(p) for p in pairs], activation="softmax"), rtol=0, atol=TOL)
    assert [d["label"] for d in data] == [enc.labels[i] for i in probs.argmax(1)]
    assert [s["label"] for s in data[0]["scores"]] == enc.labels

    r = _post(classify_server, "/classify", {"input": pairs, "raw_scores": True})
    logits = np.array([[s["score"] for s in d["scores"]] for d in r.json()["data"]])
    np.testing.assert_allclose(logits, enc.predict([tuple(p) for p in pairs], activation="identity"),
                               rtol=0, atol=TOL)

    # Single texts: the head's logits on each text alone.
    texts = random_texts(rng, 4)
    r = _post(classify_server, "/classify", {"input": texts, "raw_scores": True})
    logits = np.array([[s["score"] for s in d["scores"]] for d in r.json()["data"]])
    for text, row in zip(texts, logits):
        ids = np.array([enc.tokenizer(text, truncation=True, max_length=enc.max_seq_length)["input_ids"]])
        np.testing.assert_allclose(row, enc(ids).logits[0], rtol=0, atol=TOL)


# ---- /health, /info, /metrics ------------------------------------------------------------------
def test_health_info_metrics(embed_server, embedder):
    assert httpx.get(embed_server.url + "/health").json() == {"status": "ok"}
    info = httpx.get(embed_server.url + "/info").json()
    assert info["model"] == "tiny" and info["family"] == "bert" and info["dtype"] == "float32"
    assert info["devices"] == ["cpu"] and info["max_input_length"] == 64 and info["head"] is None
    assert info["batching"]["max_batch_tokens"] == ServeSettings().max_batch_tokens
    assert info["routes"] == ["/v1/embeddings", "/embed", "/tokenize", "/"]
    _post(embed_server, "/v1/embeddings", {"input": ["one", "two"]})
    r = httpx.get(embed_server.url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    for name in ("ftbert_queue_depth", "ftbert_batch_size_bucket", "ftbert_batch_tokens_bucket",
                 "ftbert_tokens_total", "ftbert_tokens_per_second", "ftbert_request_duration_seconds_bucket",
                 "ftbert_forward_duration_seconds_bucket", "ftbert_queue_wait_seconds_bucket"):
        assert name in text, name
    def value(prefix):
        return float(next(l for l in text.splitlines() if l.startswith(prefix)).split()[-1])

    assert value('ftbert_requests_total{route="/v1/embeddings",status="200"}') >= 1
    assert value("ftbert_request_inputs_count") >= 1 and value("ftbert_request_inputs_sum") >= 2
    assert value("ftbert_tokens_total") >= value("ftbert_batch_tokens_sum") > 0


# ---- errors ------------------------------------------------------------------------------------
def test_malformed_json_is_422(embed_server):
    for headers in ({"content-type": "application/json"}, {}):
        r = httpx.post(embed_server.url + "/v1/embeddings", content=b'{"input": ["a",', timeout=30, headers=headers)
        assert_error(r, 422, None, "not valid JSON")
    # A JSON body sent with another content type (curl -d without -H) is read as JSON.
    r = httpx.post(embed_server.url + "/v1/embeddings", content=b'{"input": "a"}', timeout=30,
                   headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 200, r.text
    r = _post(embed_server, "/v1/embeddings", ["a", "b"])  # JSON, not an object
    assert_error(r, 422, None, "JSON object")


@pytest.mark.parametrize("body, param, contains", [
    ({}, "input", "required"),
    ({"input": 3.5}, "input", "got float"),
    ({"input": None}, "input", "got null"),
    ({"input": []}, "input", "empty"),
    ({"input": ["a", 1]}, "input", "input[1] is int"),
    ({"input": [[1, 2], "a"]}, "input", "input[1] is str"),
    ({"input": [[5, "x"]]}, "input", "input[0][1] is str"),
    ({"input": [[]]}, "input", "empty token list"),
    ({"input": [True]}, "input", "bool"),
    ({"input": "a", "encoding_format": "xml"}, "encoding_format", "encoding_format: input should be 'float'"),
    ({"input": "a", "dimensions": 0}, "dimensions", "greater than or equal to 1"),
    ({"input": "a", "dimensions": "8"}, "dimensions", "valid integer"),
    ({"input": "a", "dimensions": 10_000}, "dimensions", "more than the model's 32"),
    ({"input": [[3, 4], [3, 100_000]]}, "input", "input[1][1] is 100000, not a token id"),
    ({"input": [-1]}, "input", "input[0] is -1, not a token id"),
    ({"input": "a", "model": 5}, "model", ""),
])
def test_wrong_embedding_requests_are_422_naming_the_field(embed_server, body, param, contains):
    assert_error(_post(embed_server, "/v1/embeddings", body), 422, param, contains)


def _embedding_bodies(rng, field: str) -> tuple[list, list]:
    """Bodies of /v1/embeddings (field "input") or /embed ("inputs"): ones the schema takes (some
    of which the route itself refuses), and near misses the schema refuses."""
    texts = random_texts(rng, 5)
    taken = [
        {field: texts[0]}, {field: texts[:3], "model": "tiny"}, {field: texts[1], "dimensions": 7},
        {field: texts[3], "unknown_field": [1, {"x": 2}]},  # extra fields are ignored
        {field: "a", "dimensions": 10_000}, {field: ["a"] * 17},  # refused by the route: 422, 413
    ]
    refused = [
        {field: "a", "dimensions": True}, {field: "a", "dimensions": 2.0}, {field: "a", "dimensions": 0},
        {field: ["a", None]}, {"model": "tiny"}, {field: {}}, [{field: "a"}], "a",
    ]
    if field == "input":
        taken += [{"input": [3, 4, 5]}, {"input": [[3, 4], [5, 6, 7]], "encoding_format": "base64"},
                  {"input": "a", "model": None, "user": "u", "encoding_format": "float", "dimensions": None},
                  {"input": [[3, 4], [3, 100_000]]}]
        refused += [{"input": "a", "model": 5}, {"input": "a", "encoding_format": None},
                    {"input": "a", "encoding_format": "Float"},
                    {"input": "a", "user": ["x"]}, {"input": [True, 3]}]
    else:
        taken += [{"inputs": texts[2], "normalize": False, "truncate": True, "truncation_direction": "Left"},
                  {"inputs": texts[4], "prompt_name": "nope"}, {"inputs": "a", "model": 5}]  # no such field there
        refused += [{"inputs": "a", "normalize": 1}, {"inputs": "a", "truncation_direction": "up"},
                    {"inputs": [3, 4]}]
    return taken, refused


def _assert_direct_answers_as_fastapi(server, route, taken, refused, monkeypatch):
    """The middleware's own path for `route` (no FastAPI routing or dependencies; the schema
    validates) gives the status, content type and body that FastAPI's path gives, for bodies the
    schema takes and ones it refuses, and it is the path exactly those it takes went."""
    import ftbert.serving.app as app_module

    direct_body = app_module._direct_body
    validated = []
    monkeypatch.setattr(app_module, "_direct_body", lambda *a: validated.append(direct_body(*a)) or validated[-1])
    direct = [_post(server, route, b) for b in taken + refused]
    assert [v is not None for v in validated] == [True] * len(taken) + [False] * len(refused)
    monkeypatch.setattr(app_module, "_direct_body", lambda *a: None)  # every body through FastAPI
    for body, d in zip(taken + refused, direct):
        f = _post(server, route, body)
        assert (d.status_code, d.headers["content-type"]) == (f.status_code, f.headers["content-type"]), body
        assert d.json() == f.json(), body
    assert sorted({r.status_code for r in direct}) == [200, 413, 422]


@pytest.mark.parametrize("route, field", [("/v1/embeddings", "input"), ("/embed", "inputs"), ("/", "inputs")])
def test_direct_embedding_routes_answer_as_fastapi_would(embed_server, rng, monkeypatch, route, field):
    _assert_direct_answers_as_fastapi(embed_server, route, *_embedding_bodies(rng, field), monkeypatch)


def _rerank_bodies(rng, route: str) -> tuple[list, list]:
    """Bodies of /v1/rerank or TEI's /rerank the schema takes (the route refusing some: 413) and
    near misses it refuses."""
    q, *texts = random_texts(rng, 5)
    taken = [{"query": q, "texts": texts}, {"query": q, "texts": texts[:1], "return_text": True},
             {"query": q, "texts": texts, "raw_scores": True, "extra": 1}, {"query": q, "texts": ["a"] * 600}]
    refused = [{"query": q}, {"query": 3, "texts": texts}, {"query": q, "texts": []}, {"query": q, "texts": [1]},
               {"query": q, "texts": texts, "return_text": "yes"}, [q], "x"]
    if route == "/v1/rerank":
        taken.append({"query": q, "texts": texts, "top_n": 2})
        refused += [{"query": q, "texts": texts, "top_n": 0}, {"query": q, "texts": texts, "top_n": True}]
    else:
        taken.append({"query": q, "texts": texts, "truncate": True, "truncation_direction": "LEFT"})
        refused.append({"query": q, "texts": texts, "truncation_direction": "middle"})
    return taken, refused


@pytest.mark.parametrize("route", ["/v1/rerank", "/rerank"])
def test_direct_rerank_routes_answer_as_fastapi_would(rerank_server, rng, monkeypatch, route):
    _assert_direct_answers_as_fastapi(rerank_server, route, *_rerank_bodies(rng, route), monkeypatch)


@pytest.mark.parametrize("route, body", [("/v1/embeddings", {"input": "a text that waits"}),
                                         ("/embed", {"inputs": "a text that waits"})])
def test_a_client_that_goes_away_has_its_queued_inputs_dropped(embedder, route, body):
    """The batcher holds a lone input for max_wait_ms; its client leaves before that. The input
    never reaches a forward, the request counts as 499, and the server answers the next one."""
    with _server(embedder, max_wait_ms=1500) as s:
        post_and_leave(s.url, route, body, after_s=0.4)
        time.sleep(2.0)  # past the wait: a forward would have run by now
        text = httpx.get(s.url + "/metrics", timeout=30).text
        assert metric(text, "ftbert_batch_size_count") == 0
        assert metric(text, f'ftbert_requests_total{{route="{route}",status="499"}}') == 1
        assert _post(s, route, body).status_code == 200
        assert metric(httpx.get(s.url + "/metrics", timeout=30).text, "ftbert_batch_size_count") == 1


def test_too_many_inputs_is_413(embed_server):
    assert_error(_post(embed_server, "/v1/embeddings", {"input": ["a"] * 17}), 413, "input", "(16)")


def test_body_too_large_is_413(embed_server):
    assert_error(_post(embed_server, "/v1/embeddings", {"input": "a" * 200_000}), 413, None, "bytes")


def test_chunked_body_too_large_is_413_and_a_small_one_is_served(embed_server, embed_enc):
    # No Content-Length: the body comes in chunks, and the limit must hold all the same.
    import json

    def chunks(body: bytes):
        for i in range(0, len(body), 4096):
            yield body[i:i + 4096]

    big = json.dumps({"input": "a " * 100_000}).encode()
    r = httpx.post(embed_server.url + "/v1/embeddings", content=chunks(big),
                   headers={"content-type": "application/json"}, timeout=60)
    assert "content-length" not in r.request.headers
    assert_error(r, 413, None, "more bytes than this server takes (100000)")
    small = json.dumps({"input": ["a short text", "another one"]}).encode()
    r = httpx.post(embed_server.url + "/v1/embeddings", content=chunks(small),
                   headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 200, r.text
    got = np.array([d["embedding"] for d in r.json()["data"]])
    np.testing.assert_allclose(got, embed_enc.encode(["a short text", "another one"]), rtol=0, atol=TOL)


def test_unknown_route_and_method(embed_server):
    assert_error(httpx.get(embed_server.url + "/v2/nothing"), 404, None, "no route")
    assert_error(httpx.get(embed_server.url + "/v1/embeddings"), 405, None, "GET")


def test_routes_need_their_head(embed_server, classify_server):
    body = {"query": "q", "texts": ["a"]}
    assert_error(_post(embed_server, "/v1/rerank", body), 400, None, "no task head")
    assert_error(_post(embed_server, "/classify", {"input": "a"}), 400, None, "no task head")
    assert_error(_post(classify_server, "/v1/rerank", body), 400, None, "3 labels")


@pytest.mark.parametrize("body, param", [
    ({"texts": ["a"]}, "query"),
    ({"query": "q", "texts": []}, "texts"),
    ({"query": "q", "texts": ["a", 2]}, "texts[1]"),
    ({"query": "q", "texts": ["a"], "top_n": 0}, "top_n"),
    ({"query": "q", "texts": ["a"], "return_text": "yes"}, "return_text"),
])
def test_wrong_rerank_requests_are_422(rerank_server, body, param):
    assert_error(_post(rerank_server, "/v1/rerank", body), 422, param)


@pytest.mark.parametrize("body, contains", [
    ({"input": [["a", "b", "c"]]}, "input[0] is not a [text, text] pair"),
    ({"input": 7}, "got int"),
])
def test_wrong_classify_requests_are_422(classify_server, body, contains):
    assert_error(_post(classify_server, "/classify", body), 422, "input", contains)


def test_an_output_with_nan_is_a_500_naming_the_input_and_the_server_goes_on(tmp_path):
    # JSON has no NaN: the job fails with a clear 5xx, never an encoder error mid-response, and
    # the next requests (on the same connection) are served.
    with serve(make_overflowing_embedder(tmp_path / "m")) as server:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            for inputs, index in (([[2, OVERFLOW_ID, 3]], 0), ([[2, 8, 3], [4, OVERFLOW_ID, 5, 6]], 1)):
                r = client.post("/v1/embeddings", json={"input": inputs})
                assert r.status_code == 500, r.text
                err = r.json()["error"]
                assert err["type"] == "server_error" and err["param"] == "input"
                assert f"input[{index}] holds NaN or Inf" in err["message"], err
            r = client.post("/v1/embeddings", json={"input": [[2, 8, 3]]})
            assert r.status_code == 200 and np.isfinite(r.json()["data"][0]["embedding"]).all()
            assert client.get("/health").status_code == 200


def test_too_long_without_truncation_is_413(embedder):
    with _server(embedder, truncate=False) as s:
        long = " ".join(["people"] * 100)
        err = assert_error(_post(s, "/v1/embeddings", {"input": ["short", long]}), 413, "input", "input[1]")
        assert "64" in err["message"]
        ok = _post(s, "/v1/embeddings", {"input": ["short"]})  # the server goes on
        assert ok.status_code == 200


def test_full_queue_is_429_with_retry_after(embedder):
    # The first request's two inputs wait (max_wait 3 s) in a queue of two: the next one is refused.
    with _server(embedder, max_queue=2, max_client_batch=2, max_wait_ms=3000, retry_after_s=7) as s:
        first = {}
        t = threading.Thread(target=lambda: first.update(r=_post(s, "/v1/embeddings", {"input": ["a", "b"]})))
        t.start()
        deadline = time.monotonic() + 30
        while "ftbert_queue_depth 2.0" not in httpx.get(s.url + "/metrics").text:
            assert time.monotonic() < deadline, "the first request never queued"
            time.sleep(0.01)
        r = _post(s, "/v1/embeddings", {"input": "c"})
        assert_error(r, 429, None, "busy")
        assert r.headers["retry-after"] == "7"
        t.join(30)
        assert first["r"].status_code == 200  # the queued request is answered


def test_shutting_down_is_503(embedder):
    import asyncio

    from ftbert.serving.service import Service

    svc = Service.load(ServeSettings(model=str(embedder)))
    svc.close()  # as at shutdown: the batcher takes no new jobs
    app = create_app(service=svc)

    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
            return await c.post("/v1/embeddings", json={"input": "a"}), await c.get("/health")

    r, health = asyncio.run(main())
    assert_error(r, 503, None, "shutting down")
    assert r.headers["retry-after"] == str(ServeSettings().retry_after_s)
    assert_error(health, 503, None, "shutting down")


def test_quantization_and_batch_invariance_reach_the_encoders_and_info(embedder):
    from ftbert.serving.service import Service

    svc = Service.load(ServeSettings(model=str(embedder), quantization="int8", batch_invariant=True))
    try:
        enc = svc.encoders[0]
        assert enc.quantization == "int8" and enc.batch_invariant
        info = svc.info()
        assert info["quantization"] == "int8" and info["batch_invariant"] is True
    finally:
        svc.close()
    plain = Service.load(ServeSettings(model=str(embedder)))
    try:
        assert plain.info()["quantization"] is None and plain.info()["batch_invariant"] is False
    finally:
        plain.close()
