"""A forward that raises (the GPU out of memory for one batch, a CUDA or engine error) fails the
requests whose inputs were in that forward with a 5xx naming the cause, and nothing else: an out of
memory is a 503 with Retry-After (the same request may fit a later batch), any other error a 500;
requests of other batches are answered, the server goes on serving, and /metrics counts the failed
forwards. In one process and with --workers 2 (the error crosses the engine's socket).

No GPU is needed: the batcher's forward is wrapped to raise for batches holding chosen token ids,
in the test process or, through a sitecustomize.py on PYTHONPATH, in the engine process."""

from __future__ import annotations

import inspect
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from tests.serving._helpers import make_embedder, need_serve_extra, serve

need_serve_extra()
httpx = pytest.importorskip("httpx")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from ftbert.serving import batcher as batcher_module  # noqa: E402
from ftbert.serving.batcher import ForwardFailed, is_out_of_memory  # noqa: E402
from ftbert.serving.engine import decode, encode, error_fields, error_from_fields  # noqa: E402
from tests.serving.test_workers import WorkersServer  # noqa: E402

# Token ids (make_embedder's vocabulary has 211) that steer the wrapped forward: a batch holding
# HOLD waits at a gate the test opens; the first batch holding OOM (BROKEN) raises an out of memory
# (a cuBLAS failure), and later ones run.
HOLD, OOM, BROKEN = 11, 13, 17
FAULT_ENV = "FTBERT_TEST_FORWARD_FAULT"
OOM_TEXT = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB"
BROKEN_TEXT = "cuBLAS error in cublasLtMatmul: CUBLAS_STATUS_EXECUTION_FAILED"


def faulty_forward(spec: dict):
    """The batcher's forward (forward_packed_batch), wrapped as the module comment says. spec:
    {"hold", "held" (a file made when a forward starts waiting), "gate" (a file it waits on),
    "oom", "broken"}. Self-contained: its source is what the engine process runs too."""
    import os
    import threading
    import time

    import numpy as np
    import torch

    from ftbert.serving import batcher

    real = batcher.forward_packed_batch
    faults = {spec["oom"]: "oom", spec["broken"]: "broken"}
    lock = threading.Lock()

    def forward(enc, packed, gpu):
        ids = set(np.asarray(packed.input_ids).tolist())
        if spec["hold"] in ids:
            open(spec["held"], "w").close()
            deadline = time.monotonic() + 120  # a gate a failed test left behind never hangs the server
            while os.path.exists(spec["gate"]) and time.monotonic() < deadline:
                time.sleep(0.01)
        with lock:  # each fault once: a retry of the same input then runs
            kind = next((faults.pop(t) for t in sorted(ids & faults.keys())), None)
        if kind == "oom":
            oom = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
            raise oom(spec["oom_text"])
        if kind == "broken":
            raise RuntimeError(spec["broken_text"])
        return real(enc, packed, gpu)

    return forward


def fault_spec(folder: Path) -> dict:
    return {"hold": HOLD, "held": str(folder / "held"), "gate": str(folder / "gate"), "oom": OOM,
            "broken": BROKEN, "oom_text": OOM_TEXT, "broken_text": BROKEN_TEXT}


def metric(client, name: str, **labels) -> float:
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    raise AssertionError(f"/metrics has no {name}{labels}")


def wait_until(what: str, check, timeout: float = 60.0) -> None:
    # Polls instead of sleeping a guessed time; the deadline only turns a hang into a failure.
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.02)


def post(url: str, inputs):
    with httpx.Client(base_url=url, timeout=120) as c:
        return c.post("/v1/embeddings", json={"input": inputs})


def rows(r) -> np.ndarray:
    assert r.status_code == 200, r.text
    return np.array([d["embedding"] for d in r.json()["data"]])


def assert_forward_error(r, status: int, *words: str) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["type"] == "server_error" and err["code"] == status and err["param"] is None, err
    for w in words:
        assert w in err["message"], err


def check_forward_errors(url: str, spec: dict) -> None:
    """The scenario, the same in both modes: a request held in a forward (A) while two others (B,
    C) queue up behind it; C's forward, which B shares, runs out of memory; then a request whose
    forward fails otherwise (D)."""
    gate = Path(spec["gate"])
    client = httpx.Client(base_url=url, timeout=120)
    try:
        before = rows(client.post("/v1/embeddings", json={"input": [[2, 8, 3]]}))
        assert metric(client, "ftbert_forward_errors_total", error="out_of_memory") == 0
        gate.touch()
        with ThreadPoolExecutor(3) as pool:
            a = pool.submit(post, url, [[2, HOLD, 3]])
            wait_until("A's forward holds", Path(spec["held"]).exists)
            b = pool.submit(post, url, [[2, 8, 3], [4, 5, 6, 3]])
            c = pool.submit(post, url, [[2, OOM, 3]])
            # B's 2 inputs and C's 1 wait behind A's forward: the next forward takes all three.
            wait_until("B and C queued", lambda: metric(client, "ftbert_queue_depth") == 3)
            gate.unlink()
            a, b, c = a.result(), b.result(), c.result()
        assert rows(a).shape == (1, 32)  # another batch: answered
        for r in (b, c):  # every request of the failing forward, C's neighbour B too
            assert_forward_error(r, 503, "ran out of memory", OOM_TEXT, "retry")
            assert r.headers["retry-after"] == "1"
        assert metric(client, "ftbert_forward_errors_total", error="out_of_memory") == 1

        assert client.get("/health").status_code == 200
        again = rows(client.post("/v1/embeddings", json={"input": [[2, OOM, 3]]}))  # the retry fits now
        assert np.isfinite(again).all()

        d = client.post("/v1/embeddings", json={"input": [[2, BROKEN, 3], [2, 9, 3]]})
        assert_forward_error(d, 500, "failed", f"RuntimeError: {BROKEN_TEXT}")
        assert "retry-after" not in d.headers
        assert metric(client, "ftbert_forward_errors_total", error="other") == 1
        assert metric(client, "ftbert_forward_errors_total", error="out_of_memory") == 1

        # Served as before the failures, to the same values.
        np.testing.assert_allclose(rows(client.post("/v1/embeddings", json={"input": [[2, 8, 3]]})), before,
                                   rtol=0, atol=1e-6)
        assert client.get("/health").status_code == 200
    finally:
        gate.unlink(missing_ok=True)
        client.close()


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    return make_embedder(tmp_path_factory.mktemp("embedder"), seed=3)


def test_a_failed_forward_fails_its_requests_only_in_one_process(embedder, tmp_path, monkeypatch):
    spec = fault_spec(tmp_path)
    monkeypatch.setattr(batcher_module, "forward_packed_batch", faulty_forward(spec))
    with serve(embedder) as server:
        check_forward_errors(server.url, spec)


def test_a_failed_forward_crosses_the_engine_socket_with_workers(embedder, tmp_path, monkeypatch):
    # sitecustomize.py runs at every interpreter's start: the engine process (spawned) wraps its
    # own batcher's forward. The fronts and the main process wrap theirs too, unused.
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import json\nimport os\n\n" + inspect.getsource(faulty_forward)
        + f"\n\nif os.environ.get({FAULT_ENV!r}):\n"
        + "    from ftbert.serving import batcher\n\n"
        + f"    batcher.forward_packed_batch = faulty_forward(json.loads(os.environ[{FAULT_ENV!r}]))\n")
    spec = fault_spec(tmp_path)
    monkeypatch.setenv(FAULT_ENV, json.dumps(spec))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    server = WorkersServer(embedder)
    try:
        check_forward_errors(server.url, spec)
    finally:
        status, err = server.stop()
    assert status == 0, err[-3000:]
    assert "engine shut down" in err  # the engine process lived through both failures


@pytest.mark.parametrize("error,oom", [
    (RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"), True),  # torch's, before OutOfMemoryError
    (RuntimeError("CUDA error in cudaMalloc(&ptr, bytes): cudaErrorMemoryAllocation (out of memory)"), True),
    (RuntimeError("cuBLAS error in cublasCreate(&h): CUBLAS_STATUS_ALLOC_FAILED (resource allocation failed)"),
     True),
    (MemoryError(), True),  # the host's (std::bad_alloc through pybind11)
    (RuntimeError(BROKEN_TEXT), False),
    (RuntimeError("CUDA error in kernel: cudaErrorIllegalAddress (an illegal memory access was encountered)"),
     False),
    (ValueError("cu_seqlens must start at 0"), False),
])
def test_out_of_memory_is_told_from_other_errors(error, oom):
    assert is_out_of_memory(error) is oom


def test_torch_out_of_memory_is_out_of_memory():
    torch = pytest.importorskip("torch")
    oom = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    assert is_out_of_memory(oom("no message to go by"))


@pytest.mark.parametrize("error", [ForwardFailed(True, f"OutOfMemoryError: {OOM_TEXT}", "cuda:1", 37, 4096),
                                   ForwardFailed(False, f"RuntimeError: {BROKEN_TEXT}", "cpu", 1, 3)])
def test_a_failed_forward_crosses_the_socket_as_what_it_was(error):
    back = error_from_fields(decode(encode(error_fields(error))))  # plain values only
    assert type(back) is ForwardFailed and str(back) == str(error) and vars(back) == vars(error)
