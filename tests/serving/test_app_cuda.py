"""The server on a GPU (skipped without one): the batcher's CUDA path (ids to the device, packed
forwards, pooling there) gives every concurrent client its own rows, equal to `Encoder.encode` and
`predict` on the same device."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tests._models import make_bert
from tests.serving._helpers import MAX_POS, ThreadServer, make_cross_encoder, make_embedder, need_serve_extra
from tests._vocab import random_texts, write_vocab

need_serve_extra()

import httpx  # noqa: E402

import ftbert  # noqa: E402
from ftbert.serving import ServeSettings, create_app  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not ftbert.cuda_available(), reason="needs an NVIDIA GPU")]

# float32 with TF32 off: batches of other requests' inputs change the GEMM sizes, not the values,
# beyond float32 rounding.
TOL = 1e-4


@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "no-graphs"])
def test_concurrent_clients_get_their_own_embeddings(tmp_path, rng, graphs):
    path = make_embedder(tmp_path / "embedder")
    enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype="float32")
    requests = [random_texts(rng, int(rng.integers(1, 7))) for _ in range(96)]
    want = [enc.encode(texts) for texts in requests]
    settings = ServeSettings(model=str(path), model_name="tiny", devices="cuda", dtype="float32",
                             cuda_graphs=graphs)
    errors: list[str] = []
    with ThreadServer(create_app(settings)) as s:
        assert httpx.get(s.url + "/info").json()["devices"] == ["cuda"]

        def client(k: int) -> None:
            with httpx.Client(base_url=s.url, timeout=120) as c:
                for i in range(k, len(requests), 12):
                    r = c.post("/v1/embeddings", json={"input": requests[i]})
                    if r.status_code != 200:
                        errors.append(f"request {i}: {r.status_code} {r.text}")
                        continue
                    got = np.array([d["embedding"] for d in r.json()["data"]], np.float32)
                    if got.shape != want[i].shape or np.abs(got - want[i]).max() > TOL:
                        errors.append(f"request {i}: max |diff| {np.abs(got - want[i]).max():.2e}")

        threads = [threading.Thread(target=client, args=(k,)) for k in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        metrics = httpx.get(s.url + "/metrics").text
    assert not errors, errors[:5]
    counts, forwards = {}, None
    for line in metrics.splitlines():
        if line.startswith("ftbert_cuda_graph_forwards_total{"):
            counts[line.split('"')[1]] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("ftbert_batch_size_count "):
            forwards = float(line.rsplit(" ", 1)[1])
    assert set(counts) == {"replayed", "recorded", "op_by_op"} and forwards >= 1
    if graphs:  # every batch's forward counted once, beside the warm-up's
        assert sum(counts.values()) >= forwards
    else:
        assert sum(counts.values()) == 0


def graph_counts(metrics: str) -> dict[str, float]:
    return {line.split('"')[1]: float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
            if line.startswith("ftbert_cuda_graph_forwards_total{")}


def test_lone_requests_after_ready_replay_recordings_made_at_start(tmp_path, rng):
    # Ready means warm: a request alone in its batch, of any length, pays no recording of its
    # shape (head dim 32: the fused attention, whose single-input shapes are recorded at start).
    path = tmp_path / "embedder"
    make_bert(path, hidden=64, heads=2, layers=1, vocab=211, max_pos=MAX_POS, seed=5)
    write_vocab(path, 211)
    settings = ServeSettings(model=str(path), model_name="tiny", devices="cuda", dtype="float16")
    texts = random_texts(rng, 24)
    with ThreadServer(create_app(settings)) as s, httpx.Client(base_url=s.url, timeout=120) as c:
        before = graph_counts(c.get("/metrics").text)
        for text in texts:  # one at a time: each its own batch
            r = c.post("/v1/embeddings", json={"input": text})
            assert r.status_code == 200, r.text
        after = graph_counts(c.get("/metrics").text)
    assert after["replayed"] - before["replayed"] == len(texts), (before, after)
    assert (after["recorded"], after["op_by_op"]) == (before["recorded"], before["op_by_op"]), (before, after)


def test_rerank_on_the_gpu_equals_predict(tmp_path, rng):
    path = make_cross_encoder(tmp_path / "reranker", num_labels=1, seed=3)
    enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype="float32")
    settings = ServeSettings(model=str(path), model_name="tiny", devices="cuda", dtype="float32")
    with ThreadServer(create_app(settings)) as s, httpx.Client(base_url=s.url, timeout=120) as c:
        for _ in range(4):
            query = random_texts(rng, 1)[0]
            texts = random_texts(rng, int(rng.integers(3, 12)))
            r = c.post("/v1/rerank", json={"query": query, "texts": texts})
            assert r.status_code == 200, r.text
            got = np.empty(len(texts), np.float32)
            for res in r.json()["results"]:
                got[res["index"]] = res["score"]
            np.testing.assert_allclose(got, enc.predict([(query, t) for t in texts]), rtol=0, atol=TOL)


def test_float16_embeddings_stay_close_to_float32(tmp_path, rng):
    path = make_embedder(tmp_path / "embedder")
    ref = ftbert.Encoder.from_pretrained(path, device="cuda", dtype="float32")
    settings = ServeSettings(model=str(path), model_name="tiny", devices="cuda", dtype="float16")
    texts = random_texts(rng, 40)
    with ThreadServer(create_app(settings)) as s, httpx.Client(base_url=s.url, timeout=120) as c:
        r = c.post("/v1/embeddings", json={"input": texts})
    assert r.status_code == 200, r.text
    got = np.array([d["embedding"] for d in r.json()["data"]], np.float32)
    cos = (got * ref.encode(texts)).sum(1)  # both unit-norm
    assert cos.min() > 0.999, cos.min()
