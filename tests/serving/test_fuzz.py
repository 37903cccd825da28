"""Schemathesis against the server's own OpenAPI document (`/openapi.json`): generated requests,
valid and not, to every route of an embedding model's server and a cross-encoder's. No request may
answer 5xx, and every 4xx answers JSON in OpenAI's error shape."""

from __future__ import annotations

import collections
import itertools

import pytest

from tests.serving._helpers import make_embedder, need_serve_extra, serve

need_serve_extra()
schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402


@pytest.fixture(scope="module", params=["embedder", "reranker"])
def live(request, tmp_path_factory):
    path = (make_embedder(tmp_path_factory.mktemp("fuzz-embedder"), seed=9) if request.param == "embedder"
            else request.getfixturevalue("reranker"))
    with serve(path) as s:
        yield s


def test_no_request_answers_5xx_and_errors_keep_their_shape(live):
    from hypothesis import given

    schema = schemathesis.openapi.from_url(f"{live.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10, [op.label for op in operations]
    calls = collections.Counter()
    for operation, mode in itertools.product(operations, list(GenerationMode)):  # valid and invalid
        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def check(case):
            response = case.call(base_url=live.url, timeout=60)
            calls[response.status_code // 100] += 1
            assert response.status_code < 500, (case.method, case.path, case.body, response.text[:500])
            if response.status_code >= 400:
                error = response.json()["error"]
                assert isinstance(error["message"], str) and error["message"]
                assert isinstance(error["type"], str) and "param" in error

        try:
            check()
        except Unsatisfiable:  # nothing in this operation can be made invalid (GET /health)
            if mode is not GenerationMode.NEGATIVE:
                raise
    assert calls[2] > 0 and calls[4] > 0, calls  # both kinds of request were made
