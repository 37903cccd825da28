"""service.freeze_heap, and the servers that call it once their service is up."""

from __future__ import annotations

import gc
import weakref

import pytest

from tests.serving._helpers import ThreadServer, make_embedder, need_serve_extra

need_serve_extra()

from ftbert.serving import ServeSettings, create_app  # noqa: E402
from ftbert.serving.service import freeze_heap  # noqa: E402


@pytest.fixture
def unfreeze():
    yield
    gc.unfreeze()


class _Node:
    pass


def test_freeze_heap_takes_live_objects_out_of_collections_and_frees_garbage_first(unfreeze):
    live = {"kept": [1, 2, 3]}
    cycle = _Node()
    cycle.me = cycle
    gone = weakref.ref(cycle)
    del cycle
    assert any(o is live for o in gc.get_objects())
    freeze_heap()
    assert gone() is None  # garbage is collected, not frozen
    assert gc.get_freeze_count() > 0
    assert not any(o is live for o in gc.get_objects())  # no collection walks it any more
    assert live["kept"] == [1, 2, 3]


@pytest.mark.parametrize("freeze", [False, True])
def test_an_app_freezes_its_heap_at_startup_only_when_it_owns_the_process(tmp_path, unfreeze, freeze):
    gc.unfreeze()
    path = make_embedder(tmp_path / "m")
    app = create_app(ServeSettings(model=str(path), model_name="tiny"), freeze_heap=freeze)
    with ThreadServer(app):
        assert (gc.get_freeze_count() > 0) == freeze


def test_a_cpu_service_exports_no_graph_counts(tmp_path):
    from ftbert.serving.service import Service

    path = make_embedder(tmp_path / "embedder")
    service = Service.load(ServeSettings(model=str(path), model_name="tiny"))
    try:
        assert service.encoders[0].graph_counts == {"replayed": 0, "recorded": 0, "op_by_op": 0}
        assert "ftbert_cuda_graph_forwards" not in service.metrics.render().decode()
    finally:
        service.close()
