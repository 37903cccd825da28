"""Shared pieces of the serving tests: tiny checkpoints with tokenizers, and a real uvicorn server
on the loopback address in a thread of the test process."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest
import torch

from tests._models import make_bert, make_model
from tests._tokenizers import write_wordpiece_tokenizer
from tests._vocab import write_vocab

# The tiny models' position limit: inputs past it are truncated (or refused), so tests reach it
# with ordinary texts.
MAX_POS = 64
VOCAB = 157


def need_serve_extra():
    """Skips the calling module when the `serve` extra is not installed."""
    from ftbert.serving import missing_serve_extra

    message = missing_serve_extra()
    if message:
        pytest.skip(message, allow_module_level=True)


def make_embedder(path: Path, seed: int = 0) -> Path:
    """A random 1-layer BERT (hidden 32) with a WordPiece vocabulary: an embedding model."""
    make_bert(path, hidden=32, heads=2, layers=1, vocab=211, max_pos=MAX_POS, seed=seed)
    write_vocab(path, 211)
    return path


# A token id whose embedding row overflows make_overflowing_embedder's forwards to NaN.
OVERFLOW_ID = 7


def make_overflowing_embedder(path: Path) -> Path:
    """make_embedder's model with word embedding row OVERFLOW_ID at ±3e38 (finite, so it loads):
    the embeddings' LayerNorm overflows, and any input holding that id comes out NaN."""
    from safetensors.torch import load_file, save_file

    make_embedder(path)
    weights = path / "model.safetensors"
    tensors = load_file(weights)
    name = next(n for n in tensors if n.endswith("word_embeddings.weight"))
    tensors[name][OVERFLOW_ID] = 3e38
    tensors[name][OVERFLOW_ID][::2] = -3e38
    save_file(tensors, weights, metadata={"format": "pt"})
    return path


def make_cross_encoder(path: Path, num_labels: int = 1, seed: int = 0) -> Path:
    """A random BertForSequenceClassification (hidden 32, 1 layer) with a trained WordPiece
    tokenizer; its Linear weights are redrawn at unit gain so the logits move with the input."""
    model = make_model(path, "bert", kind="cls", num_labels=num_labels, hidden=32, heads=2, layers=1,
                       vocab=VOCAB, max_pos=MAX_POS, seed=seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embeddings" not in name:
                p.normal_(0.0, p.shape[1] ** -0.5)
    model.save_pretrained(path)
    write_wordpiece_tokenizer(path, VOCAB, model_max_length=MAX_POS)
    return path


def serve(path, **settings) -> "ThreadServer":
    """A ThreadServer of the app over the checkpoint at `path` (model name "tiny"), with `settings`
    (ServeSettings fields)."""
    from ftbert.serving import ServeSettings, create_app

    return ThreadServer(create_app(ServeSettings(model=str(path), model_name="tiny", **settings)))


class ThreadServer:
    """uvicorn serving `app` on 127.0.0.1 (a free port) in a thread; the context manager starts it,
    waits until it accepts connections, and on exit shuts it down as SIGTERM would (graceful)."""

    def __init__(self, app, start_timeout: float = 60.0):
        self.app, self.start_timeout = app, start_timeout

    def __enter__(self) -> "ThreadServer":
        import uvicorn

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(self.app, lifespan="on", log_level="warning", timeout_graceful_shutdown=None)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + self.start_timeout
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the server thread ended before it started (see the log above)")
            if time.monotonic() > deadline:
                raise TimeoutError("the server did not start in time")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 60.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the server did not shut down"

    def __exit__(self, *exc) -> None:
        if self.thread.is_alive():
            self.stop()
        self.sock.close()


def post_and_leave(url: str, route: str, body: dict, after_s: float) -> None:
    """Sends a POST of `body` as JSON on a connection of its own and closes it `after_s` later,
    without reading the answer: a client that goes away."""
    import json
    from urllib.parse import urlsplit

    u = urlsplit(url)
    data = json.dumps(body).encode()
    with socket.create_connection((u.hostname, u.port), timeout=10) as s:
        s.sendall(f"POST {route} HTTP/1.1\r\nHost: {u.hostname}\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        time.sleep(after_s)


def metric(text: str, series: str) -> float:
    """The value of one series of a /metrics text (0 where it is absent)."""
    for line in text.splitlines():
        if line.startswith(series + " ") or (line.startswith(series) and series.endswith("}")
                                              and line[len(series):].startswith(" ")):
            return float(line.split()[-1])
    return 0.0
