"""Load: 2,000 requests from 32 concurrent clients (mixed lengths, a tiny model) all answered, each
with exactly its own rows; and SIGTERM in the middle of a load loses no accepted request, in one
process and with front processes before an engine (`--workers 2`)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.serving._helpers import ThreadServer, make_embedder, need_serve_extra
from tests._vocab import random_texts

need_serve_extra()

import httpx  # noqa: E402

import ftbert  # noqa: E402
from ftbert.serving import ServeSettings, create_app  # noqa: E402

TOL = 1e-5
CLIENTS = 32
REQUESTS = 2000


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    return make_embedder(tmp_path_factory.mktemp("embedder"))


@pytest.fixture(scope="module")
def pool(embedder):
    """Texts of 1 to 120 words (past the model's 64 positions: truncated) and their embeddings
    from Encoder.encode, the expected answers."""
    rng = np.random.default_rng(1234)
    texts = random_texts(rng, 150, max_words=12) + random_texts(rng, 50, max_words=120)
    enc = ftbert.Encoder.from_pretrained(embedder)
    return texts, enc.encode(texts)


def _requests(rng, n, n_texts):
    """n request plans: lists of text indices (1 to 4), a third of them sent as one string."""
    plans = []
    for _ in range(n):
        k = 1 if rng.random() < 0.33 else int(rng.integers(1, 5))
        plans.append([int(i) for i in rng.integers(0, n_texts, k)])
    return plans


def _body(plan, texts, k):
    single = len(plan) == 1 and k % 2 == 0
    return {"input": texts[plan[0]] if single else [texts[i] for i in plan], "model": "tiny"}


async def _client(url, plans, texts, want, failures, done):
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        for k, plan in plans:
            r = await client.post("/v1/embeddings", json=_body(plan, texts, k))
            if r.status_code != 200:
                failures.append((k, r.status_code, r.text))
                continue
            got = np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)
            if got.shape != (len(plan), want.shape[1]) or np.abs(got - want[plan]).max() > TOL:
                failures.append((k, "wrong rows", plan))
            done.append(k)


def test_2000_requests_from_32_clients_each_get_their_own_results(embedder, pool, rng):
    texts, want = pool
    plans = list(enumerate(_requests(rng, REQUESTS, len(texts))))
    failures, done = [], []
    # A short wait, so that inputs of different requests meet in forwards even when a forward of
    # the tiny model is as quick as a request's trip through the event loop.
    settings = ServeSettings(model=str(embedder), model_name="tiny", max_wait_ms=5)
    with ThreadServer(create_app(settings)) as server:

        async def main():
            await asyncio.gather(*(_client(server.url, plans[c::CLIENTS], texts, want, failures, done)
                                   for c in range(CLIENTS)))

        asyncio.run(main())
        metrics = httpx.get(server.url + "/metrics").text
    assert not failures, failures[:5]
    assert sorted(done) == list(range(REQUESTS))
    # Requests were batched together: some forward held more inputs than any one request has (4).
    sizes = [float(v) for le, v in re.findall(r'ftbert_batch_size_bucket\{le="([^"]+)"\} (\S+)', metrics)
             if le == "4.0"]
    total = float(re.search(r"ftbert_batch_size_count (\S+)", metrics).group(1))
    assert sizes and sizes[0] < total, "no forward held more than 4 inputs"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_during_load_loses_no_accepted_request(embedder, pool, rng, workers):
    # workers 2: the front processes finish their requests first, then the engine its jobs.
    texts, want = pool
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ftbert", "serve", str(embedder), "--port", str(port), "--model-name", "tiny",
         "--log-level", "warning", "--workers", str(workers)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)

        answered, refused, failures = [], [], []
        plans = _requests(rng, 100_000, len(texts))  # more than the clients get through

        async def client(c):
            async with httpx.AsyncClient(base_url=url, timeout=120) as http:
                for k in range(c, len(plans), CLIENTS):
                    plan = plans[k]
                    try:
                        r = await http.post("/v1/embeddings", json=_body(plan, texts, k))
                    except httpx.TransportError as e:  # the server no longer takes connections
                        refused.append(type(e).__name__)
                        return
                    if r.status_code == 503:  # refused cleanly while shutting down: not accepted
                        refused.append("503")
                        return
                    if r.status_code != 200:
                        failures.append((r.status_code, r.text))
                        return
                    got = np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)
                    if np.abs(got - want[plan]).max() > TOL:
                        failures.append(("wrong rows", plan))
                    answered.append(k)

        async def stopper():
            # SIGTERM once 300 requests are answered (sooner if something went wrong already).
            while len(answered) < 300 and not failures and not refused:
                await asyncio.sleep(0.005)
            proc.send_signal(signal.SIGTERM)

        async def main():
            await asyncio.gather(stopper(), *(client(c) for c in range(CLIENTS)))

        asyncio.run(main())
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    # uvicorn ends the process by re-raising the signal once it has shut down.
    assert proc.returncode in (0, -signal.SIGTERM), err
    assert not failures, failures[:5]
    m = re.search(r"(\d+) (?:request|job)\(s\) accepted, (\d+) answered", err)
    assert m, err
    accepted, finished = int(m.group(1)), int(m.group(2))
    # Every request the server accepted was answered, and every answer reached its client.
    assert accepted == finished == len(answered), (accepted, finished, len(answered))
    assert len(refused) == CLIENTS
