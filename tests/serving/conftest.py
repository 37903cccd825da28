"""Checkpoints the serving tests share, a one-label cross-encoder and a three-label classifier, and
servers of them (default settings), made once per module that asks."""

import pytest

from tests.serving._helpers import make_cross_encoder, serve


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    return make_cross_encoder(tmp_path_factory.mktemp("reranker"), num_labels=1, seed=1)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    return make_cross_encoder(tmp_path_factory.mktemp("classifier"), num_labels=3, seed=2)


@pytest.fixture(scope="module")
def rerank_server(reranker):
    with serve(reranker) as s:
        yield s


@pytest.fixture(scope="module")
def classify_server(classifier):
    with serve(classifier) as s:
        yield s
