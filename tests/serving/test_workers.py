"""`ftbert serve --workers N` (serving/engine.py): front processes before one engine process, as a
user runs it (a subprocess on a free port). Results equal the single-process server's, from many
clients at once; /metrics counts every front's requests; the engine's errors keep their statuses;
an engine killed mid-service answers 503 at once and is replaced; SIGTERM ends it cleanly."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.serving._helpers import (MAX_POS, OVERFLOW_ID, make_embedder, make_overflowing_embedder, metric,
                                    need_serve_extra, post_and_leave, serve)

need_serve_extra()
httpx = pytest.importorskip("httpx")

from ftbert.serving.batcher import InputTooLong, NoTokens, QueueFull, ShuttingDown  # noqa: E402
from ftbert.serving.engine import decode, encode, error_fields, error_from_fields  # noqa: E402

START_TIMEOUT = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WorkersServer:
    def __init__(self, model, *flags: str, workers: int = 2):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ftbert", "serve", str(model), "--model-name", "tiny", "--workers",
             str(workers), "--port", str(self.port), "--log-level", "warning", *flags],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.client = httpx.Client(base_url=self.url, timeout=60)
        self.wait_healthy(START_TIMEOUT)

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.communicate()[1][-3000:]
            try:
                if self.client.get("/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"the server was not healthy within {timeout} s")

    def stop(self) -> tuple[int, str]:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            _, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return self.proc.returncode, err


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    return make_embedder(tmp_path_factory.mktemp("embedder"), seed=5)


@pytest.fixture(scope="module")
def single(embedder):
    with serve(embedder) as s:
        yield s


def embed(client, texts):
    r = client.post("/v1/embeddings", json={"input": texts})
    assert r.status_code == 200, r.text
    return np.array([row["embedding"] for row in r.json()["data"]])


TEXTS = [f"sentence number {i} " + "word " * (i % 9) for i in range(40)]


def test_fronts_answer_as_one_process_does_from_many_clients(embedder, single):
    server = WorkersServer(embedder)
    try:
        info = server.client.get("/info").json()
        assert info["workers"] == 2 and info["model"] == "tiny"
        want = {t: embed(httpx.Client(base_url=single.url), [t])[0] for t in TEXTS}

        def one(i):
            with httpx.Client(base_url=server.url, timeout=60) as c:
                texts = [TEXTS[(i + j) % len(TEXTS)] for j in range(1 + i % 3)]
                return texts, embed(c, texts)

        with ThreadPoolExecutor(16) as pool:
            done = list(pool.map(one, range(64)))
        for texts, got in done:
            for t, row in zip(texts, got):
                np.testing.assert_allclose(row, want[t], rtol=0, atol=1e-6)
        # Every front's requests, counted in one place (the engine's metrics).
        text = server.client.get("/metrics").text
        line = next(x for x in text.splitlines()
                    if x.startswith('ftbert_requests_total{route="/v1/embeddings",status="200"}'))
        assert float(line.split()[-1]) == 64
        # The engine's refusals keep their statuses through the socket.
        r = server.client.post("/embed", json={"inputs": "word " * (MAX_POS + 7), "truncate": False})
        assert r.status_code == 413, r.text
        assert "tokens, more than the limit" in r.text
    finally:
        status, err = server.stop()
    assert status == 0, err[-3000:]
    assert "engine shut down" in err


def test_long_texts_in_windows_tokenized_by_the_fronts_match_one_process(embedder):
    # The fronts cut long texts into windows themselves (JobTokenizer); the engine combines the
    # windows' rows. The same embedding as the single-process server's with the same setting.
    long_text = " ".join(f"word{i % 50} token" for i in range(3 * MAX_POS))
    server = WorkersServer(embedder, "--long-texts", "chunk", "--chunk-overlap", "8")
    try:
        with serve(embedder, long_texts="chunk", chunk_overlap=8) as one:
            want = embed(httpx.Client(base_url=one.url, timeout=60), [long_text, "short one"])
        got = embed(server.client, [long_text, "short one"])
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    finally:
        status, err = server.stop()
    assert status == 0, err[-3000:]


def test_a_client_that_goes_away_has_its_inputs_dropped_in_the_engine(embedder):
    """As in one process (test_app): the front cancels the job, the engine drops its input before
    the forward that max_wait_ms holds back, and /metrics (the engine's) counts the 499."""
    server = WorkersServer(embedder, "--max-wait-ms", "1500")
    try:
        post_and_leave(server.url, "/v1/embeddings", {"input": "a text that waits"}, after_s=0.4)
        time.sleep(2.0)
        text = server.client.get("/metrics").text
        assert metric(text, "ftbert_batch_size_count") == 0
        assert metric(text, 'ftbert_requests_total{route="/v1/embeddings",status="499"}') == 1
        embed(server.client, ["a text that waits"])
        assert metric(server.client.get("/metrics").text, "ftbert_batch_size_count") == 1
    finally:
        server.stop()


def test_a_killed_engine_answers_503_at_once_and_is_replaced(embedder):
    server = WorkersServer(embedder)
    try:
        before = embed(server.client, TEXTS[:3])
        engine = server.client.get("/info").json()["pid"]
        os.kill(engine, signal.SIGKILL)
        t0 = time.monotonic()
        r = server.client.post("/v1/embeddings", json={"input": TEXTS[:3]})
        if r.status_code != 200:  # answered before the new engine serves: at once, in OpenAI's shape
            assert r.status_code == 503, r.text
            assert r.json()["error"]["type"] == "unavailable"
            assert time.monotonic() - t0 < 10
        server.wait_healthy(START_TIMEOUT)
        np.testing.assert_allclose(embed(server.client, TEXTS[:3]), before, rtol=0, atol=1e-6)
        assert server.client.get("/info").json()["pid"] != engine
    finally:
        status, err = server.stop()
    assert status == 0, err[-3000:]
    assert "the engine process ended" in err


def test_an_output_with_nan_crosses_the_socket_as_a_500(tmp_path):
    server = WorkersServer(make_overflowing_embedder(tmp_path / "m"))
    try:
        r = server.client.post("/v1/embeddings", json={"input": [[2, 8, 3], [2, OVERFLOW_ID, 3]]})
        assert r.status_code == 500, r.text
        assert "input[1] holds NaN or Inf" in r.json()["error"]["message"]
        embed(server.client, ["a sentence that is fine"])  # served after it
    finally:
        status, err = server.stop()
    assert status == 0, err[-3000:]


def test_a_model_that_cannot_load_is_one_line_and_status_1(tmp_path):
    done = subprocess.run([sys.executable, "-m", "ftbert", "serve", str(tmp_path / "missing"), "--workers", "2",
                           "--port", str(free_port())], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("ftbert serve: error:"), done.stderr[-2000:]


def test_frames_carry_json_values_and_arrays_exactly():
    rng = np.random.default_rng(0)
    obj = {"op": "job", "id": 7, "inputs": [["a", "b"], "ç ✓"], "none": None, "weight": 0.25,
           "rows": [[0, rng.integers(0, 99, 11).astype(np.int32), None, None]],
           "values": rng.standard_normal((3, 5)).astype(np.float32), "empty": np.zeros((0, 4), np.float32)}
    back = decode(encode(obj))
    assert back["inputs"] == [["a", "b"], "ç ✓"] and back["none"] is None and back["weight"] == 0.25
    for got, want in ((back["rows"][0][1], obj["rows"][0][1]), (back["values"], obj["values"]),
                      (back["empty"], obj["empty"])):
        assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
    assert back["values"].flags.writeable
    with pytest.raises(TypeError, match="cannot send a object"):
        encode({"x": object()})


@pytest.mark.parametrize("argv,words", [(["--workers", "0"], "--workers must be at least 1, got 0"),
                                        (["--ray", "--workers", "2"], "with --ray, scale with --replicas")])
def test_bad_workers_are_usage_errors(capsys, argv, words):
    from ftbert.serving.server import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert words in capsys.readouterr().err


@pytest.mark.parametrize("error", [InputTooLong(3, 90, 64), NoTokens(2), QueueFull("the queue holds 5 inputs"),
                                   ShuttingDown("the server is shutting down"), ValueError("bad kind"),
                                   KeyError("x")])
def test_errors_cross_the_socket_as_what_they_were(error):
    back = error_from_fields(decode(encode(error_fields(error))))  # plain values only
    if isinstance(error, KeyError):
        assert type(back) is RuntimeError and "KeyError" in str(back)
        return
    assert type(back) is type(error) and str(back) == str(error)
    assert vars(back) == vars(error)


def test_uvicorn_gives_a_busy_front_a_minute_before_killing_it(monkeypatch):
    # uvicorn's supervisor kills a front that misses its health ping for timeout_worker_healthcheck
    # seconds (5 by default), with its requests in flight; serve_workers asks for a minute.
    import inspect

    import uvicorn

    from ftbert.serving import engine as engine_module
    from ftbert.serving import server
    from ftbert.serving.settings import ServeSettings

    if "timeout_worker_healthcheck" not in inspect.signature(uvicorn.Config).parameters:
        pytest.skip(f"uvicorn {uvicorn.__version__} has no worker health check")
    seen = {}

    class Engine:  # the engine process is not what this checks
        def __init__(self, settings, socket_path):
            self.socket_path = socket_path

        def start(self):
            return {}

        def watch(self):
            pass

        def stop(self):
            return 0

    monkeypatch.setattr(engine_module, "EngineSupervisor", Engine)
    monkeypatch.setattr(engine_module, "front_environment", lambda *args: "{}")
    monkeypatch.setenv(engine_module.FRONT_ENV, "")  # serve_workers sets it; restored afterwards
    monkeypatch.setattr(uvicorn, "run", lambda *args, **kwargs: seen.update(kwargs))
    assert server.serve_workers(ServeSettings(model="unused"), workers=2) == 0
    assert seen["workers"] == 2 and seen["timeout_worker_healthcheck"] == server.FRONT_HEALTHCHECK_S >= 30
    assert seen["timeout_graceful_shutdown"] is None


def test_a_ping_the_engine_never_answers_is_none_and_leaves_nothing_waiting(tmp_path):
    # An engine that accepts the connection but never replies (hung): /health's ping gives up.

    from ftbert.serving.engine import RemoteBatcher

    async def hang(reader, writer):  # reads until the client leaves, never answers
        await reader.read()
        writer.close()

    async def main():
        # (Python 3.12's Server.wait_closed waits for every connection: the handler closes its own.)
        server = await asyncio.start_unix_server(hang, path=str(tmp_path / "s"))
        async with server:
            batcher = RemoteBatcher(str(tmp_path / "s"), tokenize=None)
            answered = await batcher.ping(timeout_s=0.2)
            left = dict(batcher._replies)
            await batcher.close()
            return answered, left

    answered, left = asyncio.run(main())
    assert answered is None and left == {}


def test_health_waits_until_every_front_has_connected_to_the_engine(tmp_path):
    # The engine's answer to a ping counts the fronts connected: a front is healthy only once all
    # of them are, and is no more once one of them goes.
    from ftbert.serving.engine import RemoteBatcher, RemoteService, _Connection, _Engine

    def service(batcher, workers):
        svc = RemoteService.__new__(RemoteService)  # only what healthy() reads
        svc.batcher, svc._workers = batcher, workers
        return svc

    async def main():
        engine = _Engine(_FakeService())
        loop = asyncio.get_running_loop()
        server = await loop.create_unix_server(lambda: _Connection(engine), path=str(tmp_path / "s"))
        seen = []
        async with server:
            fronts = [RemoteBatcher(str(tmp_path / "s"), tokenize=None) for _ in range(3)]
            for k, front in enumerate(fronts):
                await front.connect()
                seen.append([await f.ping() for f in fronts[:k + 1]])
                seen.append([await service(f, 3).healthy() for f in fronts[:k + 1]])
            await fronts[1].close()
            await asyncio.sleep(0.2)
            seen.append([await fronts[0].ping(), await fronts[1].ping()])
            seen.append([await service(fronts[0], 3).healthy(), await service(fronts[0], 2).healthy()])
            for front in (fronts[0], fronts[2]):
                await front.close()
        return seen

    assert asyncio.run(main()) == [[1], [False], [2, 2], [False, False], [3, 3, 3], [True, True, True],
                                   [2, None], [False, True]]


def test_the_fronts_listening_socket_has_tcp_nodelay():
    # uvicorn binds the fronts' shared socket with protocol 0, where asyncio sets no TCP_NODELAY:
    # a response's body would wait on the client's delayed ACK. Accepted connections inherit it.
    import uvicorn

    from ftbert.serving.server import nodelay_listening_sockets

    config = uvicorn.Config(lambda *a: None, host="127.0.0.1", port=0)
    with nodelay_listening_sockets(uvicorn.Config):
        listener = config.bind_socket()
    try:
        listener.listen()
        with socket.create_connection(listener.getsockname()):
            accepted, _ = listener.accept()
            with accepted:
                assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        listener.close()
    assert uvicorn.Config.bind_socket is not None and "nodelay" not in uvicorn.Config.bind_socket.__qualname__


class _Transport:
    """What FrameProtocol writes, write by write."""

    def __init__(self):
        self.writes, self.closed = [], False

    def write(self, data):
        self.writes.append(bytes(data))

    def is_closing(self):
        return self.closed

    def close(self):
        self.closed = True


def _random_message(rng, i):
    n = int(rng.integers(0, 4))
    return {"op": "job", "id": i, "text": "ç" * int(rng.integers(0, 5)),
            "rows": [[k, rng.integers(0, 1000, int(rng.integers(0, 9))).astype(np.int32), None, 0.5] for k in range(n)],
            "values": rng.standard_normal((int(rng.integers(0, 3)), 3)).astype(np.float32)}


def _assert_same_message(got, want):
    assert got["op"] == want["op"] and got["id"] == want["id"] and got["text"] == want["text"]
    assert len(got["rows"]) == len(want["rows"])
    for g, w in zip(got["rows"], want["rows"]):
        assert g[0] == w[0] and g[2:] == w[2:] and g[1].dtype == w[1].dtype and np.array_equal(g[1], w[1])
    assert got["values"].dtype == want["values"].dtype and np.array_equal(got["values"], want["values"])


def test_frames_sent_in_one_turn_leave_in_one_write_and_read_back_across_any_split():
    from ftbert.serving.engine import FrameProtocol

    rng = np.random.default_rng(int(np.random.default_rng().integers(1 << 30)))
    sent = [_random_message(rng, i) for i in range(int(rng.integers(5, 40)))]

    async def main():
        out = FrameProtocol(on_frame=None)
        out.connection_made(transport := _Transport())
        for msg in sent:
            out.send(msg)
        assert transport.writes == []  # not yet: at the end of this turn of the loop
        await asyncio.sleep(0)
        assert len(transport.writes) == 1
        data = transport.writes[0]
        got = []
        back = FrameProtocol(on_frame=got.append)
        back.connection_made(_Transport())
        # Cut anywhere: inside a length, inside a frame, several frames in one read.
        cuts = np.sort(rng.choice(np.arange(1, len(data)), size=min(len(data) - 1, 25), replace=False))
        for piece in np.split(np.frombuffer(data, np.uint8), cuts):
            back.data_received(piece.tobytes())
        assert len(back._buffer) == 0
        return got

    got = asyncio.run(main())
    assert len(got) == len(sent)
    for g, w in zip(got, sent):
        _assert_same_message(g, w)
        assert all(row[1].flags.writeable for row in g["rows"])


class _FakeBatcher:
    def __init__(self):
        self.jobs = []

    def submit(self, job):
        fut = asyncio.get_running_loop().create_future()
        self.jobs.append((job, fut))
        return fut


class _FakeService:
    def __init__(self):
        from ftbert.serving.metrics import Metrics

        self.metrics = Metrics()
        self.batcher = _FakeBatcher()

    def info(self):
        return {"routes": []}


def _requests_counted(text: str) -> float:
    return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith("ftbert_requests_total{"))


def test_metrics_count_every_front_s_finished_requests_without_waiting_for_their_batches(tmp_path):
    # Fronts send finished requests to the engine in batches; a /metrics read on any front makes
    # every front send what it holds first, so it counts every request answered before it.
    from ftbert.serving.engine import RemoteBatcher, _Connection, _Engine

    rng = np.random.default_rng()
    counts = [int(rng.integers(1, 40)) for _ in range(3)]

    async def main():
        engine = _Engine(_FakeService())
        loop = asyncio.get_running_loop()
        server = await loop.create_unix_server(lambda: _Connection(engine), path=str(tmp_path / "s"))
        async with server:
            fronts = [RemoteBatcher(str(tmp_path / "s"), tokenize=None) for _ in counts]
            for front, n in zip(fronts, counts):
                front.OBSERVED_FLUSH_S = 3600  # only a /metrics read sends them
                await front.connect()
                for _ in range(n):
                    front.observe("/v1/embeddings", 200, float(rng.random()), 1)
            texts = [await front.metrics_text() for front in fronts]
            for front in fronts:
                front.observe("/v1/rerank", 200, 0.01, 2)
            closing = fronts.pop()
            await closing.close()  # a front that stops sends what it holds
            await asyncio.sleep(0.2)
            texts.append(await fronts[0].metrics_text())
            for front in fronts:
                await front.close()
            return texts

    texts = asyncio.run(main())
    assert [_requests_counted(t) for t in texts] == [sum(counts)] * 3 + [sum(counts) + 3]


def test_the_engine_answers_cancels_and_drops_jobs_by_callback(tmp_path):
    from ftbert.serving.batcher import Job, JobResult, QueueFull
    from ftbert.serving.engine import RemoteBatcher, _Connection, _Engine

    async def main():
        service = _FakeService()
        engine = _Engine(service)
        loop = asyncio.get_running_loop()
        server = await loop.create_unix_server(lambda: _Connection(engine), path=str(tmp_path / "s"))
        async with server:
            rows = [[0, np.arange(3, dtype=np.int32), None, None]]
            front = RemoteBatcher(str(tmp_path / "s"), tokenize=lambda job: rows)
            tasks = [loop.create_task(front.submit(Job("embed", "text", [f"t{i}"]))) for i in range(3)]
            while len(service.batcher.jobs) < 3:
                await asyncio.sleep(0.01)
            (j0, f0), (j1, f1), (j2, f2) = service.batcher.jobs
            assert np.array_equal(j0.tokenized[0][1], np.arange(3))
            values = np.random.default_rng().standard_normal((1, 4)).astype(np.float32)
            f0.set_result(JobResult(values, 3))
            f1.set_exception(QueueFull("full"))
            got = await tasks[0]
            assert np.array_equal(got.values, values) and got.tokens == 3
            with pytest.raises(QueueFull, match="full"):
                await tasks[1]
            tasks[2].cancel()  # the client went away: the engine's future is cancelled
            while not f2.cancelled():
                await asyncio.sleep(0.01)
            assert not engine.in_flight
            # A front that goes away cancels its jobs in flight.
            task = loop.create_task(front.submit(Job("embed", "text", ["x"])))
            while len(service.batcher.jobs) < 4:
                await asyncio.sleep(0.01)
            await front.close()
            while not service.batcher.jobs[3][1].cancelled():
                await asyncio.sleep(0.01)
            task.cancel()
            return True

    assert asyncio.run(main())


def test_small_jobs_are_tokenized_on_the_loop_and_the_rest_in_a_thread(embedder, rng):
    # A front tokenizes a small job on its event loop (cheaper than the hand-off to a thread), with
    # the same rows and errors as the thread's; a large job, or one that finds the tokenizer busy,
    # goes to a thread (None here).
    import threading

    from tests._vocab import random_texts

    from ftbert.serving.batcher import Job, JobTokenizer
    from ftbert.serving.engine import INLINE_TOKENIZE_CHARS, RemoteService
    from ftbert.serving.settings import ServeSettings
    from ftbert.tokenization import load_transformers_tokenizer

    svc = RemoteService.__new__(RemoteService)  # its tokenizer only: no engine behind it
    svc._tokenizer_lock = threading.RLock()
    svc._tokenizer = load_transformers_tokenizer(embedder)
    svc._job_tokenizer = JobTokenizer(svc._tokenizer, ServeSettings(model=str(embedder)),
                                      {"text": 48, "pair": 48, "ids": 48}, lambda: svc._tokenizer_lock)

    def same(a, b):
        return len(a) == len(b) and all(x[0] == y[0] and np.array_equal(x[1], y[1]) for x, y in zip(a, b))

    texts = random_texts(rng, int(rng.integers(1, 6)), max_words=12)
    pairs = [[a, b] for a, b in zip(random_texts(rng, 3, max_words=8), random_texts(rng, 3, max_words=8))]
    for job in (Job("embed", "text", texts), Job("score", "pair", pairs), Job("embed", "ids", [[5, 6, 7]])):
        now = svc._tokenize_now(job)
        assert now is not None and same(now, svc._job_tokenizer.tokenize(job)), job.how
    assert svc._tokenize_now(Job("embed", "text", ["a" * (INLINE_TOKENIZE_CHARS + 1)])) is None
    assert svc._tokenize_now(Job("embed", "text", ["word"] * (INLINE_TOKENIZE_CHARS // 4 + 1))) is None
    words = " ".join(random_texts(rng, 1, max_words=1) * 80)  # 80 tokens at least, under 2,048 characters
    too_long = Job("embed", "text", [words[:INLINE_TOKENIZE_CHARS]], truncate=False)
    with pytest.raises(InputTooLong):
        svc._tokenize_now(too_long)
    held, release = threading.Event(), threading.Event()

    def hold():
        with svc._tokenizer_lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    try:
        assert svc._tokenize_now(Job("embed", "text", texts)) is None  # busy: a thread waits, not the loop
    finally:
        release.set()
        holder.join()
    assert svc._tokenize_now(Job("embed", "text", texts)) is not None
