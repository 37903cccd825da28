"""What one server process (or one Ray replica) runs behind its routes: the encoders, one per device,
the batcher that feeds them, and the metrics. The app only talks to a Service."""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import time
from pathlib import Path

from ..text import tokenizer_lock
from .batcher import Batcher
from .metrics import Metrics
from .settings import ServeSettings

log = logging.getLogger("ftbert.serve")


class Service:
    def __init__(self, settings: ServeSettings, encoders: list, metrics: Metrics | None = None):
        self.settings = settings
        self.encoders = encoders
        self.metrics = metrics or Metrics()
        self.batcher = Batcher(encoders, settings, self.metrics)
        self.metrics.queue_depth.set_function(lambda: self.batcher.queue_depth)
        gpus = [e for e in encoders if str(e.device).startswith("cuda")]
        if gpus:
            self.metrics.count_graphs(lambda: _summed(e.graph_counts for e in gpus))
        enc = encoders[0]
        self.config = enc.config
        self.path = enc.path
        if settings.model_name:
            self.model_name = settings.model_name
        elif settings.model is None:  # the bundled checkpoint's directory is just "model"
            self.model_name = "all-MiniLM-L6-v2"
        else:
            self.model_name = Path(enc.path).name if enc.path else "ftbert"
        self.started = time.time()
        self._prompts: dict[str, str] | None = None

    @classmethod
    def load(cls, settings: ServeSettings) -> "Service":
        """Loads one encoder per device of `settings` and starts the batcher."""
        import ftbert

        model = settings.model or str(ftbert.default_model_path())
        encoders = [ftbert.Encoder.from_pretrained(model, device=d, dtype=settings.dtype, attention=settings.attention,
                                                   cuda_graphs=settings.cuda_graphs, warmup=True,
                                                   batch_invariant=settings.batch_invariant,
                                                   quantization=settings.quantization, task=settings.task)
                    for d in settings.devices]
        service = cls(settings, encoders)
        service.batcher.start()
        service.warm_up_batches()
        log.info("ftbert serve: %s on %s (%s), ready", model, ", ".join(settings.devices), settings.dtype)
        return service

    def warm_up_batches(self) -> None:
        """Readies each encoder for the batches the batcher will form (Encoder.warm_up_batches:
        the workspace at its largest; on the GPU also the GEMM tuner's picks and single-request
        CUDA graphs), so that the server answers ready only once its first requests pay none of
        that."""
        s = self.settings
        for enc in self.encoders:
            t0 = time.perf_counter()
            held = enc.warm_up_batches(s.max_batch_tokens, s.max_batch_size, max(self.batcher.limits.values()))
            graphs = f", {held} single-request CUDA graphs" if str(enc.device).startswith("cuda") else ""
            log.info("ftbert serve: %s readied for batches in %.1f s (workspace %d MiB%s)", enc.device,
                     time.perf_counter() - t0, enc.workspace_bytes >> 20, graphs)

    # ---- what the routes ask ------------------------------------------------------------------
    @property
    def head(self) -> str | None:
        return self.encoders[0].head

    @property
    def num_labels(self) -> int | None:
        return self.encoders[0].num_labels

    @property
    def labels(self) -> list[str] | None:
        return self.encoders[0].labels

    @property
    def hidden_size(self) -> int:
        return self.encoders[0].hidden_size

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])

    def info(self) -> dict:
        s, enc = self.settings, self.encoders[0]
        return {
            "model": self.model_name,
            "model_path": str(self.path) if self.path else None,
            "family": self.config.get("model_type"),
            "dtype": enc.dtype,
            "devices": list(s.devices),
            "hidden_size": enc.hidden_size,
            "max_input_length": self.batcher.limits.get("text"),
            "truncate": s.truncate,
            "long_texts": s.long_texts,
            "chunk_overlap": s.chunk_overlap,
            "pooling": self.batcher.pooling,
            "attention": enc.attention,
            "cuda_graphs": enc.cuda_graphs,
            "quantization": enc.quantization,
            "batch_invariant": enc.batch_invariant,
            "head": enc.head,
            "labels": enc.labels,
            "routes": self.routes(),
            "batching": {
                "max_batch_tokens": s.max_batch_tokens,
                "max_batch_size": s.max_batch_size,
                "max_wait_ms": s.max_wait_ms,
                "max_queue": s.max_queue,
                "max_client_batch": s.max_client_batch,
            },
            "version": _version(),
            "pid": os.getpid(),  # tells replicas (Ray, several processes) apart
        }

    @property
    def task_instruction(self) -> str | None:
        """What the text embedding routes put before every text where the request names no
        prompt: the instruction of the task the model was loaded with (`--task`; Encoder's
        task_instruction), or None."""
        return self.encoders[0].task_instruction

    @property
    def prompts(self) -> dict[str, str]:
        """The checkpoint's sentence-transformers prompts by name (config_sentence_transformers.json),
        read once; {} without any."""
        if self._prompts is None:
            self._prompts = {}
            if self.path is not None:
                try:
                    raw = json.loads((Path(self.path) / "config_sentence_transformers.json").read_text("utf-8"))
                except (OSError, ValueError):
                    raw = {}
                prompts = raw.get("prompts") if isinstance(raw, dict) else None
                if isinstance(prompts, dict):
                    self._prompts = {k: v for k, v in prompts.items() if isinstance(k, str) and isinstance(v, str)}
        return self._prompts

    def routes(self) -> list[str]:
        routes = ["/v1/embeddings"]
        if self.head == "sequence_classification":
            routes.append("/classify")
            if self.num_labels == 1:
                routes += ["/v1/rerank", "/rerank"]
            routes.append("/predict")
        else:
            routes.append("/embed")
        # A checkpoint with a masked-LM head (SPLADE) or a token projection (ColBERT).
        routes += [route for route, kind in (("/embed_sparse", "sparse"), ("/embed_multivector", "multivector"))
                   if self.output_unavailable(kind) is None]
        return routes + ["/tokenize", "/"]

    def output_unavailable(self, kind: str) -> str | None:
        """Why the model cannot give `kind` outputs ("sparse": /embed_sparse, "multivector":
        /embed_multivector), or None when it can (Encoder.unavailable_reason, as the batcher found
        it at start)."""
        return self.batcher.unavailable.get(kind, f"the server does not run {kind} outputs")

    def score_activation(self):
        """What turns a one-label cross-encoder's logits into /rerank's scores: the checkpoint's
        activation (CrossEncoder's), as a function of a float32 tensor, or None."""
        from ..cross_encoder import _resolve_activation

        return _resolve_activation(self.encoders[0], "auto")

    @contextlib.contextmanager
    def tokenizer(self):
        """The checkpoint's tokenizer (transformers'), held for the block: /tokenize's."""
        enc = self.encoders[0]
        with tokenizer_lock(enc):
            yield enc.tokenizer

    async def metrics_text(self) -> bytes:
        """GET /metrics's body (Prometheus text)."""
        return self.metrics.render()

    async def healthy(self) -> bool:
        """Whether requests are served now (/health): not while the batcher closes; a front
        process asks its engine."""
        return not self.batcher.closing

    async def attach(self) -> None:
        """The app starts serving this service (a front process connects to its engine here)."""

    async def detach(self) -> None:
        """The app has answered its last request (before `close`, where the app owns the service)."""

    def close(self) -> None:
        """Finishes every accepted request, then stops the threads."""
        self.batcher.close()
        log.info("ftbert serve: stopped after %d request(s) accepted, %d answered",
                 self.batcher.accepted, self.batcher.finished)


def freeze_heap() -> None:
    """Moves every object alive now (torch, transformers, the model's Python side: hundreds of
    thousands) out of the garbage collector's reach, for a process that serves from here on.
    Otherwise each full collection walks them all while the event loop waits: pauses of about 0.1 s
    every second or so under load, which are a server's p99 (benchmarks/results/serve-gc-pauses-2core.txt).
    Collected once first, so no garbage is frozen; what is frozen is still freed when unreferenced."""
    gc.collect()
    gc.freeze()


def _version() -> str:
    import ftbert

    return ftbert.__version__


def _summed(counts) -> dict[str, int]:
    total: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            total[k] = total.get(k, 0) + v
    return total
