"""ftbert's HTTP server: `ftbert serve` (FastAPI + uvicorn), dynamic batching, Ray Serve scale-out.

    from ftbert.serving import ServeSettings, create_app
    app = create_app(ServeSettings(model="path/to/checkpoint", devices=("cuda:0",)))  # any ASGI server

Modules: settings (ServeSettings), batcher (the queue: token-budget batches, tokenizer and forward
threads), service (encoders + batcher + metrics of one process), app (routes, schemas, errors),
metrics (Prometheus), server (`ftbert serve`), ray (the Ray Serve deployment).

FastAPI, uvicorn and prometheus-client come with the `serve` extra (`pip install 'ftbert[serve]'`),
Ray with the `ray` extra; `import ftbert` needs neither, and nothing here imports them until used.
"""

from __future__ import annotations

import importlib.util

from .settings import ServeSettings

SERVE_MODULES = ("fastapi", "uvicorn", "prometheus_client")


def missing_serve_extra() -> str | None:
    """A message naming the install command when the `serve` extra's packages are missing, else None."""
    missing = [m for m in SERVE_MODULES if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    return (f"serving needs the 'serve' extra ({', '.join(missing)} not installed): "
            "pip install 'ftbert[serve]'")


def create_app(*args, **kwargs):
    """The ASGI app (see ftbert.serving.app.create_app)."""
    from .app import create_app as _create_app

    return _create_app(*args, **kwargs)


__all__ = ["ServeSettings", "create_app", "missing_serve_extra"]
