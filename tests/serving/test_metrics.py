"""The request metrics, summed by RequestStats (in the server, and in each front of `--workers N`
before the engine merges them), export what prometheus_client's own Counter and Histograms give
for the same requests."""

import random

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ftbert.serving.metrics import LATENCY_BUCKETS, SIZE_BUCKETS, Metrics, RequestStats

REQUEST_METRICS = ("ftbert_requests", "ftbert_request_duration_seconds", "ftbert_request_inputs")


def _requests(seed: int, n: int) -> list[tuple]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        # Values on the bucket bounds too: a bound belongs to its own bucket (le).
        seconds = rng.choice([rng.uniform(0, 40), rng.choice(LATENCY_BUCKETS), rng.expovariate(50)])
        inputs = rng.choice([None, rng.randint(1, 3000), rng.choice(SIZE_BUCKETS)])
        out.append((rng.choice(["/v1/embeddings", "/rerank", "/embed"]), rng.choice([200, 200, 400, 503]),
                    seconds, inputs))
    return out


def _samples(text: bytes) -> dict:
    """The request metrics' samples (without the _created timestamps), by name and labels."""
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        if family.name in REQUEST_METRICS:
            for s in family.samples:
                if not s.name.endswith("_created"):
                    out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _reference(requests) -> dict:
    r = CollectorRegistry()
    count = Counter("ftbert_requests", "", ["route", "status"], registry=r)
    seconds = Histogram("ftbert_request_duration_seconds", "", ["route"], buckets=LATENCY_BUCKETS, registry=r)
    inputs = Histogram("ftbert_request_inputs", "", buckets=SIZE_BUCKETS, registry=r)
    for route, status, s, n in requests:
        count.labels(route, str(status)).inc()
        seconds.labels(route).observe(s)
        if n is not None:
            inputs.observe(n)
    return _samples(generate_latest(r))


@pytest.mark.parametrize("seed,n", [(0, 1), (1, 7), (2, 333)])
def test_request_metrics_equal_prometheus_clients_own(seed, n):
    requests = _requests(seed, n)
    m = Metrics()
    for r in requests:
        m.on_request(*r)
    got, want = _samples(m.render()), _reference(requests)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-12), key


def test_fronts_sums_merged_in_the_engine_equal_one_servers_count():
    requests = _requests(3, 500)
    direct = Metrics()
    for r in requests:
        direct.on_request(*r)
    engine = Metrics()
    fronts = [RequestStats() for _ in range(3)]
    for i, r in enumerate(requests):
        fronts[i % 3].add(*r)
        if i % 97 == 0:  # reports at odd moments, some of a front with nothing new
            engine.on_requests(fronts[i % 3].take())
            engine.on_requests(fronts[(i + 1) % 3].take())
    for f in fronts:
        engine.on_requests(f.take())
        assert not f and f.take()["counts"] == []  # taken is reset
    got, want = _samples(engine.render()), _samples(direct.render())
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-12), key


def test_no_requests_export_no_request_series_but_the_inputs_histogram():
    assert {name for name, _ in _samples(Metrics().render())} == {
        "ftbert_request_inputs_bucket", "ftbert_request_inputs_count", "ftbert_request_inputs_sum"}


def test_graph_counts_are_exported_as_a_counter_by_how():
    counts = {"replayed": 7, "recorded": 2, "op_by_op": 1}
    m = Metrics()
    assert "ftbert_cuda_graph_forwards" not in m.render().decode()  # only where an encoder is on a GPU
    m.count_graphs(lambda: counts)
    samples = {s.labels["how"]: s.value for f in text_string_to_metric_families(m.render().decode())
               for s in f.samples if s.name == "ftbert_cuda_graph_forwards_total"}
    assert samples == {"replayed": 7, "recorded": 2, "op_by_op": 1}
    counts["replayed"] = 9  # read at each render
    assert "ftbert_cuda_graph_forwards_total{how=\"replayed\"} 9.0" in m.render().decode()
