"""The server's Prometheus metrics (`GET /metrics`), in a registry of each app's own, so that several
apps in one process (tests, several devices) do not share counters.

Requests:  ftbert_requests_total{route, status}, ftbert_request_duration_seconds{route} (histogram),
           ftbert_request_inputs (histogram: inputs per request).
Queue:     ftbert_queue_depth (inputs accepted and not yet in a forward),
           ftbert_queue_wait_seconds (histogram: oldest input of a batch, queued to forward).
Forwards:  ftbert_batch_size (histogram: sequences per forward), ftbert_batch_tokens (histogram:
           tokens per forward), ftbert_forward_duration_seconds (histogram),
           ftbert_tokenize_duration_seconds (histogram: one tokenizer round),
           ftbert_tokens_total (counter: graph rate(ftbert_tokens_total[1m]) for tokens/s) and
           ftbert_tokens_per_second (gauge: tokens forwarded over the last 10 s, per second).
Failures:  ftbert_forward_errors_total{error} (counter: forwards that raised, error "out_of_memory"
           (their requests answered 503) or "other" (500)).
Graphs:    ftbert_cuda_graph_forwards_total{how} (counter, GPU encoders only: forwards with CUDA graphs
           on that "replayed" a held recording, "recorded" a new one, or ran "op_by_op";
           Encoder.graph_counts summed over the devices).
"""

from __future__ import annotations

import bisect
import collections
import threading
import time
from typing import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

# Latency buckets from 1 ms to 30 s (a GPU forward of a small batch is ~1 ms; a long queue, seconds).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
RATE_WINDOW_S = 10.0
FORWARD_ERRORS = ("out_of_memory", "other")


class RequestStats:
    """The three request metrics as plain sums: what `Metrics` exports, and what each front of
    `ftbert serve --workers N` adds up between its reports to the engine (`take` there, `merge`
    in the engine), so that the engine's cost per request is not a Prometheus update.

    counts: {(route, status): n}; latency: {route: [count per LATENCY_BUCKETS bucket and one past
    the last, sum of seconds]}; inputs: [count per SIZE_BUCKETS bucket and one past, sum]."""

    def __init__(self):
        self.counts: dict[tuple[str, str], int] = {}
        self.latency: dict[str, list] = {}
        self.inputs: list = [0] * (len(SIZE_BUCKETS) + 2)

    def add(self, route: str, status: int, seconds: float, inputs: int | None = None) -> None:
        key = (route, str(status))
        self.counts[key] = self.counts.get(key, 0) + 1
        row = self.latency.get(route)
        if row is None:
            row = self.latency[route] = [0] * (len(LATENCY_BUCKETS) + 2)
        row[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1  # le: a value on a bound is inside it
        row[-1] += seconds
        if inputs is not None:
            self.inputs[bisect.bisect_left(SIZE_BUCKETS, inputs)] += 1
            self.inputs[-1] += inputs

    def __bool__(self) -> bool:
        return bool(self.counts)

    def take(self) -> dict:
        """The sums as JSON values, and a fresh start."""
        out = {"counts": [[r, s, n] for (r, s), n in self.counts.items()], "latency": self.latency,
               "inputs": self.inputs}
        self.__init__()
        return out

    def merge(self, taken: dict) -> None:
        """Adds another's `take()`."""
        for route, status, n in taken["counts"]:
            key = (route, status)
            self.counts[key] = self.counts.get(key, 0) + n
        for route, row in taken["latency"].items():
            mine = self.latency.setdefault(route, [0] * len(row))
            for i, v in enumerate(row):
                mine[i] += v
        for i, v in enumerate(taken["inputs"]):
            self.inputs[i] += v


class _RequestCollector:
    """Exports a RequestStats in the exposition prometheus_client's Counter and Histograms give."""

    def __init__(self, stats: RequestStats, lock: threading.Lock):
        self._stats, self._lock = stats, lock

    def collect(self):
        with self._lock:
            counts = dict(self._stats.counts)
            latency = {r: list(row) for r, row in self._stats.latency.items()}
            inputs = list(self._stats.inputs)
        requests = CounterMetricFamily("ftbert_requests", "HTTP requests by route and status",
                                       labels=["route", "status"])
        for (route, status), n in counts.items():
            requests.add_metric([route, status], n)
        seconds = HistogramMetricFamily("ftbert_request_duration_seconds", "Request latency, received to answered",
                                        labels=["route"])
        for route, row in latency.items():
            seconds.add_metric([route], _cumulative(LATENCY_BUCKETS, row), row[-1])
        sizes = HistogramMetricFamily("ftbert_request_inputs", "Inputs per request")
        sizes.add_metric([], _cumulative(SIZE_BUCKETS, inputs), inputs[-1])
        return [requests, seconds, sizes]


class _GraphCollector:
    def __init__(self, counts: Callable[[], dict[str, int]]):
        self._counts = counts

    def collect(self):
        family = CounterMetricFamily("ftbert_cuda_graph_forwards", "Forwards with CUDA graphs on, by what they "
                                     "did: replayed a held recording, recorded a new one, or ran op by op",
                                     labels=["how"])
        for how, n in self._counts().items():
            family.add_metric([how], n)
        return [family]


def _cumulative(bounds, row) -> list[tuple[str, float]]:
    out, total = [], 0
    for bound, n in zip(list(bounds) + [float("inf")], row[:-1]):
        total += n
        out.append(("+Inf" if bound == float("inf") else repr(float(bound)), total))
    return out


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, queue_depth: Callable[[], float] | None = None):
        r = self.registry = CollectorRegistry()
        self._requests = RequestStats()
        self._requests_lock = threading.Lock()
        r.register(_RequestCollector(self._requests, self._requests_lock))
        self.queue_depth = Gauge("ftbert_queue_depth", "Inputs accepted and not yet in a forward", registry=r)
        if queue_depth is not None:
            self.queue_depth.set_function(queue_depth)
        self.queue_wait = Histogram("ftbert_queue_wait_seconds", "Wait of a batch's oldest input before its forward",
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram("ftbert_batch_size", "Sequences per forward", buckets=SIZE_BUCKETS, registry=r)
        self.batch_tokens = Histogram("ftbert_batch_tokens", "Tokens per forward", buckets=TOKEN_BUCKETS, registry=r)
        self.forward_seconds = Histogram("ftbert_forward_duration_seconds", "One packed forward with its pooling",
                                         buckets=LATENCY_BUCKETS, registry=r)
        self.tokenize_seconds = Histogram("ftbert_tokenize_duration_seconds", "One tokenizer round",
                                          buckets=LATENCY_BUCKETS, registry=r)
        self.tokens = Counter("ftbert_tokens", "Tokens forwarded", registry=r)
        self.tokens_per_second = Gauge("ftbert_tokens_per_second",
                                       f"Tokens forwarded over the last {RATE_WINDOW_S:g} s, per second", registry=r)
        self.forward_errors = Counter("ftbert_forward_errors", "Forwards that raised, by error (their requests "
                                      "answered 503 for out_of_memory, 500 for other)", ["error"], registry=r)
        for error in FORWARD_ERRORS:  # at 0 from the start: a rate or an alert needs the series
            self.forward_errors.labels(error)
        self._recent: collections.deque[tuple[float, int]] = collections.deque()
        self._recent_lock = threading.Lock()
        self.tokens_per_second.set_function(self._rate)

    def count_graphs(self, counts: Callable[[], dict[str, int]]) -> None:
        """Exports `counts()` (Encoder.graph_counts' form) as ftbert_cuda_graph_forwards_total."""
        self.registry.register(_GraphCollector(counts))

    # ---- hooks the batcher calls from its threads --------------------------------------------
    def on_batch(self, sequences: int, tokens: int, wait_s: float, forward_s: float) -> None:
        self.batch_size.observe(sequences)
        self.batch_tokens.observe(tokens)
        self.queue_wait.observe(wait_s)
        self.forward_seconds.observe(forward_s)
        self.tokens.inc(tokens)
        now = time.monotonic()
        with self._recent_lock:
            self._recent.append((now, tokens))
            self._trim(now)

    def on_tokenize(self, seconds: float, inputs: int) -> None:
        self.tokenize_seconds.observe(seconds)

    def on_forward_error(self, error: str) -> None:
        """A forward raised; error: one of FORWARD_ERRORS."""
        self.forward_errors.labels(error).inc()

    # ---- the app's side ----------------------------------------------------------------------
    def on_request(self, route: str, status: int, seconds: float, inputs: int | None = None) -> None:
        with self._requests_lock:
            self._requests.add(route, status, seconds, inputs)

    def on_requests(self, taken: dict) -> None:
        """Requests a front answered, as its RequestStats.take() (the engine of `--workers N`)."""
        with self._requests_lock:
            self._requests.merge(taken)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def _trim(self, now: float) -> None:
        while self._recent and self._recent[0][0] < now - RATE_WINDOW_S:
            self._recent.popleft()

    def _rate(self) -> float:
        now = time.monotonic()
        with self._recent_lock:
            self._trim(now)
            return sum(t for _, t in self._recent) / RATE_WINDOW_S
