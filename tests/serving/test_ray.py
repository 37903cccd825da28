"""Ray Serve: a real local Ray instance on the CPU serving two replicas of the app; the openai
client through Ray's HTTP proxy gets what `Encoder.encode` gives, and errors pass through as the
app answers them. Slow by nature (Ray starts a controller, a proxy and two replica processes that
each load torch and the engine): marked `slow`, and skipped without the `ray` extra. The
deployment's options are checked without a Ray instance."""

from __future__ import annotations

import random
import socket

import numpy as np
import pytest

from tests.serving._helpers import make_embedder, need_serve_extra
from tests._vocab import random_texts

need_serve_extra()
ray = pytest.importorskip("ray", reason="the 'ray' extra is not installed (pip install 'ftbert[ray]')")

import httpx  # noqa: E402

import ftbert  # noqa: E402
from ftbert.serving import ServeSettings  # noqa: E402
from ftbert.serving.ray import DEPLOYMENT_NAME, autoscaling_from_args, build_app, deployment  # noqa: E402
from ftbert.serving.server import build_parser  # noqa: E402

# Ray's own modules warn about pydantic deprecations on import.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


# ---- the deployment's options (no Ray instance needed) -----------------------------------------
def test_fixed_replicas_and_fractional_gpus():
    d = deployment(ServeSettings(model="m", devices="cuda:0,cuda:1"), replicas=3, gpus_per_replica=0.5,
                   cpus_per_replica=2)
    assert d.name == DEPLOYMENT_NAME and d.num_replicas == 3 and d.max_ongoing_requests == 512
    assert d.ray_actor_options["num_gpus"] == 0.5 and d.ray_actor_options["num_cpus"] == 2


def test_autoscaling_from_the_command_line():
    args = build_parser().parse_args(["--ray", "--min-replicas", "2", "--max-replicas", "6",
                                      "--target-ongoing-requests", "48"])
    auto = autoscaling_from_args(args)
    assert auto == {"min_replicas": 2, "max_replicas": 6, "target_ongoing_requests": 48}
    d = deployment(ServeSettings(model="m"), autoscaling=auto)
    config = d._deployment_config.autoscaling_config  # Ray keeps it here; no public accessor
    assert (config.min_replicas, config.max_replicas, config.target_ongoing_requests) == (2, 6, 48)
    assert autoscaling_from_args(build_parser().parse_args(["--ray", "--replicas", "4"])) is None
    with pytest.raises(ValueError, match="below"):
        autoscaling_from_args(build_parser().parse_args(["--min-replicas", "5", "--max-replicas", "2"]))


def test_replicas_run_on_the_gpu_ray_gives_them():
    from ftbert.serving.ray import replica_settings

    s = ServeSettings(model="m", devices="cuda:0,cuda:1", dtype="float16")
    assert replica_settings(s, 1).devices == ("cuda",) and replica_settings(s, 0).devices == ("cpu",)
    assert replica_settings(s, 0.25).dtype == "float16"


# ---- a real local Ray instance ------------------------------------------------------------------


def _free_port() -> int:
    """A free port below the kernel's ephemeral range and above Ray's worker ports (10002-19999).
    Ray starts processes that bind ephemeral ports between this choice and its proxy binding the
    port, and an ephemeral one (port 0's kind) was now and then taken first: "Failed to bind"."""
    low = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, max(20001, low))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # none free there: any free port
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_server(tmp_path_factory):
    from ray import serve

    path = make_embedder(tmp_path_factory.mktemp("ray-embedder"))
    port = _free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = build_app(ServeSettings(model=str(path), model_name="tiny"), replicas=2, cpus_per_replica=0.5)
        serve.run(app, name=DEPLOYMENT_NAME, route_prefix="/")
        yield path, f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.mark.slow
def test_two_replicas_serve_the_openai_client_through_rays_proxy(ray_server, rng):
    openai = pytest.importorskip("openai", reason="the openai client is not installed (the test extra has it)")
    from ray import serve

    path, url = ray_server
    status = serve.status().applications[DEPLOYMENT_NAME].deployments[DEPLOYMENT_NAME]
    assert status.replica_states.get("RUNNING") == 2, status

    enc = ftbert.Encoder.from_pretrained(path)
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    for fmt in ("float", None):  # None: the client's default, base64 decoded by the client
        texts = random_texts(rng, int(rng.integers(2, 9)), max_words=60)
        kwargs = {} if fmt is None else {"encoding_format": fmt}
        resp = client.embeddings.create(model="tiny", input=texts, **kwargs)
        got = np.array([d.embedding for d in resp.data], dtype=np.float32)
        np.testing.assert_allclose(got, enc.encode(texts), rtol=0, atol=1e-5)

    # Requests spread over both replicas: each reports its own process id.
    pids = {httpx.get(url + "/info", timeout=30).json()["pid"] for _ in range(40)}
    assert len(pids) == 2, pids

    r = httpx.post(url + "/v1/embeddings", json={"input": 3}, timeout=30)
    assert r.status_code == 422 and r.json()["error"]["param"] == "input"
    r = httpx.post(url + "/rerank", json={"query": "q", "texts": ["a"]}, timeout=30)
    assert r.status_code == 400 and "no task head" in r.json()["error"]["message"]
