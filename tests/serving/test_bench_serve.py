"""`ftbert bench-serve` end to end at a tiny scale (one engine, half-second rows), and its peer
server: FastAPI + sentence-transformers giving the embeddings `Encoder.encode` gives."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from tests.serving._helpers import make_embedder, need_serve_extra
from tests._vocab import random_texts

need_serve_extra()
pytest.importorskip("sentence_transformers")

import httpx  # noqa: E402

import ftbert  # noqa: E402
from ftbert.bench import serve as bench_serve  # noqa: E402


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    return make_embedder(tmp_path_factory.mktemp("embedder"))


def test_peer_server_embeds_as_encode_does(embedder, rng):
    from ftbert.bench.serve_peer import build_app

    app = build_app(str(embedder), "cpu", "float32")
    texts = random_texts(rng, 5)

    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://peer") as c:
            return await c.post("/v1/embeddings", json={"input": texts})

    r = asyncio.run(main())
    assert r.status_code == 200, r.text
    got = np.array([d["embedding"] for d in r.json()["data"]])
    np.testing.assert_allclose(got, ftbert.Encoder.from_pretrained(embedder).encode(texts), rtol=0, atol=1e-4)


def test_bench_serve_writes_rows_json_and_plot(embedder, tmp_path, capsys):
    argv = ["--model", str(embedder), "--engines", "ftbert", "--concurrency", "1,3", "--lengths", "short,24",
            "--duration", "0.5", "--warmup", "0.2", "--client-procs", "1", "--texts", "8",
            "--out", str(tmp_path), "--name", "run"]
    assert bench_serve.main(argv) == 0
    doc = json.loads((tmp_path / "run.json").read_text())
    rows = doc["results"]
    assert [(r["length"], r["concurrency"]) for r in rows] == [("short", 1), ("short", 3), ("24", 1), ("24", 3)]
    for r in rows:
        assert r["engine"] == "ftbert" and r["errors"] == 0 and r["requests"] > 0
        assert r["req_per_s"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"]
    # At least the target (the tiny vocabulary splits words into several pieces, so a text may pass it).
    assert 16 <= rows[0]["tokens"] < rows[2]["tokens"] and rows[2]["tokens"] >= 24
    assert doc["servers"]["ftbert"]["family"] == "bert"
    assert doc["ready_s"]["ftbert"] > 0  # process start to /health 200
    assert (tmp_path / "run.png").stat().st_size > 0
    for r in rows:  # the batcher's figures over each row, from the server's /metrics
        b = r["batches"]
        assert b["per_s"] > 0 and 1 <= b["mean_size"] <= 3  # at most 3 clients' inputs in a forward
        assert b["mean_forward_ms"] > 0 and 0 < b["forward_busy"] <= 1 and b["mean_wait_ms"] >= 0
    out = capsys.readouterr().out
    assert "req/s" in out and "ftbert: ready (/health 200)" in out


def test_bench_serve_runs_ftbert_workers_next_to_the_noop_ceiling(embedder, tmp_path):
    # ftbert with two front processes and the no-op server in two workers, in one run.
    argv = ["--model", str(embedder), "--engines", "ftbert,noop", "--concurrency", "2", "--lengths", "short",
            "--duration", "0.5", "--warmup", "0.2", "--client-procs", "1", "--texts", "8",
            "--serve-args", "--workers 2", "--noop-workers", "2", "--out", str(tmp_path), "--name", "run"]
    assert bench_serve.main(argv) == 0
    doc = json.loads((tmp_path / "run.json").read_text())
    assert [r["engine"] for r in doc["results"]] == ["ftbert", "noop"]
    assert all(r["errors"] == 0 and r["requests"] > 0 for r in doc["results"])
    assert doc["servers"]["ftbert"]["workers"] == 2 and doc["servers"]["noop"]["engine"] == "no-op"
    assert "noop" not in doc["check_cosine_min"]


def test_noop_server_answers_unit_vectors_of_the_width_asked(monkeypatch):
    from ftbert.bench import serve_noop

    monkeypatch.setenv("FTBERT_NOOP_DIM", "7")
    app = serve_noop.build_app()

    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://noop") as c:
            return await c.post("/v1/embeddings", json={"input": ["a b", "c"]})

    r = asyncio.run(main())
    assert r.status_code == 200, r.text
    rows = np.array([d["embedding"] for d in r.json()["data"]])
    assert rows.shape == (2, 7)
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, rtol=1e-12)


@pytest.fixture
def raw_noop():
    """The raw no-op server in 2 processes on a free port; yields its URL."""
    import subprocess
    import sys
    import time

    port = bench_serve._free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ftbert.bench.serve_noop", "--raw", "--workers", "2", "--dim", "5",
                             "--port", str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, "the raw no-op server exited"
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the raw no-op server did not start"
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        assert proc.wait(30) == 0


def test_raw_noop_server_answers_as_the_fastapi_one(raw_noop):
    with httpx.Client(base_url=raw_noop) as c:
        for given, n in (("one text", 1), (["a b", "c", "d e f"], 3)):
            r = c.post("/v1/embeddings", json={"input": given})
            assert r.status_code == 200, r.text
            doc = r.json()
            rows = np.array([d["embedding"] for d in doc["data"]])
            assert rows.shape == (n, 5) and [d["index"] for d in doc["data"]] == list(range(n))
            np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, rtol=1e-12)
            assert doc["usage"]["prompt_tokens"] == (2 if n == 1 else 6)
        assert c.get("/info").json()["engine"] == "no-op (raw)"
        assert c.get("/nowhere").status_code == 404
        assert c.post("/v1/embeddings", content=b"not json").status_code == 400
        assert c.post("/v1/embeddings", json={"inputs": "x"}).status_code == 400


def test_raw_noop_server_answers_pipelined_requests_in_order(raw_noop):
    import socket

    port = int(raw_noop.rsplit(":", 1)[1])
    body = b'{"input": ["x"]}'
    post = (b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        # Two requests in one write, the second split across writes as well.
        s.sendall(post + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + post[:20])
        s.sendall(post[20:])
        data = b""
        while data.count(b"HTTP/1.1 200 OK") < 3:
            chunk = s.recv(65536)
            assert chunk, "the server closed the connection"
            data += chunk
    first, second, third = data.split(b"HTTP/1.1 200 OK")[1:]
    assert b'"embedding"' in first and b'{"status":"ok"}' in second and b'"embedding"' in third


def test_bench_serve_runs_the_raw_noop_server(embedder, tmp_path):
    argv = ["--model", str(embedder), "--engines", "noop-raw", "--concurrency", "2", "--lengths", "short",
            "--duration", "0.5", "--warmup", "0.2", "--client-procs", "1", "--texts", "8", "--noop-workers", "2",
            "--out", str(tmp_path), "--name", "run"]
    assert bench_serve.main(argv) == 0
    doc = json.loads((tmp_path / "run.json").read_text())
    (row,) = doc["results"]
    assert row["engine"] == "noop-raw" and row["errors"] == 0 and row["requests"] > 0
    assert doc["servers"]["noop-raw"]["engine"] == "no-op (raw)"


def test_batch_figures_are_the_batchers_counters_over_the_row():
    before = dict.fromkeys(bench_serve._COUNTERS, 0.0)
    after = {"ftbert_batch_size_count": 50.0, "ftbert_batch_size_sum": 400.0,
             "ftbert_forward_duration_seconds_sum": 1.0, "ftbert_queue_wait_seconds_sum": 0.1}
    b = bench_serve._batch_figures(before, after, 2.0)
    assert b == pytest.approx({"per_s": 25.0, "mean_size": 8.0, "mean_forward_ms": 20.0, "forward_busy": 0.5,
                               "mean_wait_ms": 2.0})
    assert bench_serve._batch_figures(before, before, 2.0) is None  # no forward in the row
    assert bench_serve._batch_figures(None, after, 2.0) is None
    assert "graphs" not in b  # a CPU server exports no graph counts


def test_batch_figures_count_a_gpu_servers_graph_forwards():
    from ftbert.serving.metrics import Metrics

    counts = {"replayed": 5, "recorded": 2, "op_by_op": 3}
    m = Metrics()
    m.count_graphs(lambda: dict(counts))
    m.on_batch(4, 40, 0.001, 0.002)
    before = bench_serve._read_counters(m.render().decode())
    counts.update(replayed=45, recorded=3)
    m.on_batch(6, 60, 0.001, 0.002)
    after = bench_serve._read_counters(m.render().decode())
    b = bench_serve._batch_figures(before, after, 1.0)
    assert b["graphs"] == {"replayed": 40, "recorded": 1, "op_by_op": 0}
    assert b["mean_size"] == 6


def test_bench_serve_refuses_an_unknown_engine(capsys):
    assert bench_serve.main(["--engines", "ftbert,vllm"]) == 2
    assert "unknown engine" in capsys.readouterr().err


@pytest.mark.parametrize("name,want", [("short", 16), ("long", 256), ("ragged", (16, 256)), ("24", 24),
                                       ("16-64", (16, 64)), ("8-8", (8, 8))])
def test_lengths_are_named_counted_or_ranges(name, want):
    assert bench_serve.parse_length(name) == want


@pytest.mark.parametrize("bad", ["medium", "0", "9-3", "-5", "4-", "1.5", "a-b"])
def test_bench_serve_refuses_a_length_it_cannot_read(capsys, bad):
    assert bench_serve.main(["--engines", "ftbert", "--lengths", f"short,{bad}"]) == 2
    err = capsys.readouterr().err
    assert repr(bad) in err and "16-256" in err


def test_ragged_texts_spread_over_their_range(embedder):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(embedder), local_files_only=True)
    texts = bench_serve._texts(tok, (8, 40), 60, seed=1)
    counts = [len(tok(t)["input_ids"]) for t in texts]
    assert len(set(texts)) == 60
    # Each at least its drawn target (the tiny vocabulary's pieces may pass it by a few).
    assert min(counts) >= 8 and max(counts) <= 40 + 8
    assert max(counts) - min(counts) >= 16  # not one length for all
    assert bench_serve._texts(tok, (8, 40), 60, seed=1) == texts  # the seed decides them


def test_wrk_script_sends_each_text_in_the_python_clients_body():
    texts = ["plain words", 'a "quoted" one', "closes ]] and ]=] early"]
    script = bench_serve.wrk_script(texts)
    for t in texts:
        body = json.dumps({"input": t, "model": "bench", "encoding_format": "float"})
        # The body sits in a Lua long string whose closing bracket it does not contain.
        assert any(f"[{'=' * n}[{body}]{'=' * n}]" in script and f"]{'=' * n}]" not in body for n in range(3))
    assert '"/v1/embeddings"' in script and "function done(" in script


def test_wrk_figures_count_answers_without_status_errors():
    out = "Running 1s test\n  2 threads\nFTBERT_WRK 1000 2000000 1500 9000 1750.5 3 10\n"
    res = bench_serve._wrk_figures(out)
    assert res["requests"] == 990 and res["errors"] == 13
    assert res["req_per_s"] == pytest.approx(495.0)
    assert (res["p50_ms"], res["p99_ms"], res["mean_ms"]) == (1.5, 9.0, pytest.approx(1.7505))
    with pytest.raises(RuntimeError, match="wrk printed no figures"):
        bench_serve._wrk_figures("Running 1s test\nsegfault\n")


def test_bench_serve_refuses_wrk_it_cannot_find(capsys, tmp_path):
    argv = ["--client", "wrk", "--wrk", str(tmp_path / "no-wrk-here"), "--engines", "noop"]
    assert bench_serve.main(argv) == 2
    assert "no wrk binary" in capsys.readouterr().err


def test_bench_serve_with_wrk_measures_the_noop_server(embedder, tmp_path):
    import os
    import shutil

    wrk = os.environ.get("FTBERT_WRK", "wrk")
    if shutil.which(wrk) is None:
        pytest.skip(f"needs the wrk load generator ({wrk!r} not found; $FTBERT_WRK names it)")
    argv = ["--model", str(embedder), "--engines", "noop", "--client", "wrk", "--wrk", wrk,
            "--concurrency", "1,4", "--lengths", "short", "--duration", "1", "--warmup", "0",
            "--client-procs", "2", "--texts", "8", "--noop-workers", "1", "--out", str(tmp_path),
            "--name", "run"]
    assert bench_serve.main(argv) == 0
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["options"]["client"] == "wrk"
    assert [r["concurrency"] for r in doc["results"]] == [1, 4]
    for r in doc["results"]:
        assert r["errors"] == 0 and r["requests"] > 0 and r["req_per_s"] > 0
        assert 0 < r["p50_ms"] <= r["p99_ms"]


def test_bench_serve_reads_ftbert_against_encode_on_the_same_texts(embedder, tmp_path, capsys):
    argv = ["--model", str(embedder), "--engines", "ftbert", "--concurrency", "2", "--lengths", "short,40",
            "--duration", "0.5", "--warmup", "0.2", "--client-procs", "1", "--texts", "8", "--encode",
            "--out", str(tmp_path), "--name", "run"]
    assert bench_serve.main(argv) == 0
    doc = json.loads((tmp_path / "run.json").read_text())
    assert set(doc["encode"]) == {"short", "40"}
    for name, e in doc["encode"].items():
        assert e["texts"] == 8 and e["calls"] >= 1 and e["seconds"] >= 0.5
        assert e["sentences_per_s"] == pytest.approx(e["calls"] * 8 / e["seconds"])
    for r in doc["results"]:
        assert r["vs_encode"] == pytest.approx(r["req_per_s"] / doc["encode"][r["length"]]["sentences_per_s"])
    out = capsys.readouterr().out
    assert "Encoder.encode short" in out and "÷ encode" in out


def test_measure_encode_times_whole_calls_of_encode(embedder, monkeypatch):
    calls = []
    real = ftbert.Encoder.encode

    def counted(self, texts, *a, **k):
        calls.append(list(texts))
        return real(self, texts, *a, **k)

    monkeypatch.setattr(ftbert.Encoder, "encode", counted)
    texts = ["one two three", "four five"]
    res = bench_serve.measure_encode(str(embedder), "cpu", "float32", texts, 0.0, 0.05)
    # One warm-up call, then the counted ones, each over every text.
    assert len(calls) == res["calls"] + 1 and all(c == texts for c in calls)
    assert res["sentences_per_s"] == pytest.approx(res["calls"] * 2 / res["seconds"])


def test_a_row_without_answers_says_so(embedder, tmp_path, capsys, monkeypatch):
    # A server so slow that no request comes back within the row (the peer at 256 clients).
    monkeypatch.setattr(bench_serve, "measure", lambda *a, **k: {"requests": 0, "errors": 0, "req_per_s": 0.0})
    argv = ["--model", str(embedder), "--engines", "ftbert", "--concurrency", "2", "--lengths", "short",
            "--duration", "0.5", "--warmup", "0.2", "--client-procs", "1", "--texts", "8",
            "--out", str(tmp_path), "--name", "run"]
    assert bench_serve.main(argv) == 0
    out = capsys.readouterr().out
    assert "no request answered within the row's 0.5 s" in out and "none in 0.5 s" in out
    (row,) = json.loads((tmp_path / "run.json").read_text())["results"]
    assert row["requests"] == 0 and "p50_ms" not in row
