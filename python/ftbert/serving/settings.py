"""The server's settings: what `ftbert serve` takes on its command line, in one dataclass that the
app, the batcher, `/info` and the Ray deployment read."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass
class ServeSettings:
    # The checkpoint directory (HF or ftbert-converted); None: the bundled all-MiniLM-L6-v2.
    model: str | None = None
    # What `model` is called in responses and /info; default: the directory's name.
    model_name: str | None = None
    # One encoder (and one forward thread) per entry: "cpu", "cuda", "cuda:N".
    devices: tuple[str, ...] = ("cpu",)
    dtype: str = "float32"
    attention: str = "auto"
    # Embedding pooling ("mean", "cls", "pooler"); None: what the checkpoint declares, else mean.
    pooling: str | None = None
    # Encoder.cuda_graphs. The batcher's batches vary in shape (sequences, longest, tokens), and a
    # shape (forward_packed's: the batch and longest sequence rounded up to powers of two, the tokens
    # to sixteen buckets an octave) is recorded at its second forward, up to 128 kept: whether
    # replaying beats the recording churn depends on the traffic, hence the switch.
    cuda_graphs: bool = True
    # Encoder.batch_invariant ("auto", True, False): an input's result never depends on what else
    # was in its batch; "auto" where the fast kernels keep it.
    batch_invariant: bool | str = "auto"
    # Encoder.quantization: None, "int8" (CPU devices, float32) or "fp8" (GPUs of compute
    # capability 9.0 or later, float16/bfloat16).
    quantization: str | None = None
    # Encoder.from_pretrained's task: the per-task adapters merged at load (Jina-embeddings-v3 as the
    # hub holds it); None for a checkpoint without them.
    task: str | None = None

    # ---- dynamic batching
    # A forward holds at most this many tokens, counted as sequences x the longest one (what the
    # engine's workspace for a packed batch holds), and at most max_batch_size sequences.
    max_batch_tokens: int = 16384
    max_batch_size: int = 256
    # How long the first input of a batch may wait for more to arrive while the budget is not
    # full. 0 (the default): a free forward thread takes whatever is queued at once. Under load
    # batches form anyway, from the requests that arrive while a forward runs; a wait only adds
    # latency when a thread is idle, and pays off for bursts that arrive spread over a few ms.
    max_wait_ms: float = 0.0

    # ---- limits
    # Inputs accepted but not yet forwarded; past this a request is refused with 429.
    max_queue: int = 4096
    # Inputs (texts, pairs, token lists, rerank documents) per request; past this, 413.
    max_client_batch: int = 512
    # Tokens per input; None: the model's limit (Encoder.max_seq_length). Longer inputs are cut
    # there, or refused with 413 when truncate is False.
    max_input_length: int | None = None
    truncate: bool = True
    # Texts to embed longer than the limit: "truncate" (cut, as `truncate` says) or "chunk" (each
    # embedded in windows of the limit sharing chunk_overlap tokens, pooled, combined by their mean
    # weighted by the tokens each holds: text.chunk_windows, as encode(long_texts="chunk") does).
    # Scoring inputs (pairs) are never chunked.
    long_texts: str = "truncate"
    chunk_overlap: int = 32
    # Request bodies larger than this are refused with 413 before they are parsed.
    max_request_bytes: int = 16 * 1024 * 1024
    # The Retry-After (seconds) of a 429 (queue full) and a 503 (shutting down, out of memory).
    retry_after_s: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.devices, str):
            self.devices = tuple(d.strip() for d in self.devices.split(",") if d.strip())
        self.devices = tuple(self.devices)
        if not self.devices:
            raise ValueError("devices: give at least one device")
        for name in ("max_batch_tokens", "max_batch_size", "max_queue", "max_client_batch",
                     "max_request_bytes"):
            _positive(name, getattr(self, name))
        if self.max_input_length is not None:
            _positive("max_input_length", self.max_input_length)
        if not isinstance(self.retry_after_s, int) or self.retry_after_s < 0:
            raise ValueError(f"retry_after_s must be a whole number of seconds >= 0, got {self.retry_after_s!r}")
        if self.max_client_batch > self.max_queue:
            raise ValueError(f"max_client_batch ({self.max_client_batch}) must not exceed max_queue "
                             f"({self.max_queue}): such a request could never be queued")
        if self.long_texts not in ("truncate", "chunk"):
            raise ValueError(f"long_texts must be 'truncate' or 'chunk', got {self.long_texts!r}")
        if isinstance(self.chunk_overlap, bool) or not isinstance(self.chunk_overlap, int) or self.chunk_overlap < 0:
            raise ValueError(f"chunk_overlap must be a whole number of tokens >= 0, got {self.chunk_overlap!r}")
        if self.quantization not in (None, "int8", "fp8"):
            raise ValueError(f"quantization must be None, 'int8' or 'fp8', got {self.quantization!r}")
        if self.task is not None and not (isinstance(self.task, str) and self.task):
            raise ValueError(f"task must be None or a task name, got {self.task!r}")
        if not (isinstance(self.batch_invariant, bool) or self.batch_invariant == "auto"):
            raise ValueError(f'batch_invariant must be "auto", True or False, got {self.batch_invariant!r}')
        if not self.max_wait_ms >= 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {self.max_wait_ms!r}")

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
