"""Text in, embeddings out: tokenization, batching, truncation and pooling for `Encoder.encode`.

`encode` may be called from any number of threads at once, on one encoder. A transformers fast
tokenizer is not safe to share between threads: each call writes its padding and truncation settings
into the Rust tokenizer, then tokenizes in a second step that releases the GIL, so another thread can
change the settings in between (the batch comes out truncated or padded as the other call asked), or,
with some `tokenizers` releases, the call fails with "RuntimeError: Already borrowed". And
`Encoder.tokenizer` loads on first use, so threads arriving together would each load one.

Hence one lock per encoder (`tokenizer_lock`), held while the tokenizer loads and around each
tokenizer call, never across the forward or the pooling: one thread tokenizes while other threads'
forwards run in the engine, which releases the GIL. Per-thread tokenizer copies would also let two
tokenizations overlap, which gains little (the Rust step of a batch call already runs without the GIL
and spreads the texts over all cores; the Python step holds the GIL anyway) and costs a copy per
thread per encoder (all-MiniLM-L6-v2's tokenizer: about 7 MB and 50 ms each), growing with the
caller's thread pool. Code that calls `enc.tokenizer` itself from other threads while `encode` runs
should hold `tokenizer_lock(enc)` around those calls.
"""

from __future__ import annotations

import json
import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from .weights_tools.layout import usable_seq_length

if TYPE_CHECKING:
    from .encoder import Encoder

POOLINGS = ("mean", "cls", "pooler")

_TOKENIZER_LOCKS: "weakref.WeakKeyDictionary[Encoder, threading.Lock]" = weakref.WeakKeyDictionary()
_TOKENIZER_LOCKS_GUARD = threading.Lock()


def tokenizer_lock(enc: "Encoder") -> threading.Lock:
    """The lock that serialises the use of `enc`'s tokenizer (see the module docstring)."""
    with _TOKENIZER_LOCKS_GUARD:
        lock = _TOKENIZER_LOCKS.get(enc)
        if lock is None:
            lock = _TOKENIZER_LOCKS[enc] = threading.Lock()
        return lock


def default_pooling(path: Path | None) -> str:
    """The pooling a sentence-transformers directory declares (1_Pooling/config.json), else mean."""
    if path is not None:
        cfg = Path(path) / "1_Pooling" / "config.json"
        if cfg.exists():
            try:
                p = json.loads(cfg.read_text())
            except (OSError, ValueError):
                return "mean"
            # Older sentence-transformers write pooling_mode_<mode>_token flags, newer a pooling_mode.
            if p.get("pooling_mode_cls_token") or p.get("pooling_mode") == "cls":
                return "cls"
    return "mean"


def encode_texts(
    enc: "Encoder",
    texts: str | Sequence[str],
    pooling: str | None = None,
    normalize: bool = True,
    batch_size: int = 32,
) -> np.ndarray:
    import torch

    if isinstance(texts, str):
        texts = [texts]
    texts = list(texts)
    if not texts:
        raise ValueError("encode: no texts given")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"encode: texts[{i}] is {type(t).__name__}, expected str")
    if batch_size < 1:
        raise ValueError(f"encode: batch_size must be at least 1, got {batch_size}")
    pooling = pooling or default_pooling(enc.path)
    if pooling not in POOLINGS:
        raise ValueError(f"unknown pooling {pooling!r}: expected one of {', '.join(POOLINGS)}")
    if pooling == "pooler" and not enc.config["has_pooler"]:
        raise ValueError("pooling='pooler' needs a checkpoint with a pooler; this one has none")

    lock = tokenizer_lock(enc)
    with lock:  # the first call loads the tokenizer: once, however many threads arrive together
        tok = enc.tokenizer
        pad_id = tok.pad_token_id or 0
    # Longest first, so each batch pads to similar lengths; the order is restored at the end.
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    device = enc.device if enc.device.startswith("cuda") else "cpu"
    out = np.empty((len(texts), enc.hidden_size), dtype=np.float32)
    for start in range(0, len(texts), batch_size):
        idx = order[start : start + batch_size]
        with lock:  # not held for the forward below: other threads tokenize meanwhile
            batch = tok(
                [texts[i] for i in idx],
                padding=True,
                truncation=True,
                max_length=enc.max_seq_length,
                return_tensors="pt",
            )
        ids, mask = batch["input_ids"], batch["attention_mask"]
        types = batch.get("token_type_ids")
        types = torch.zeros_like(ids) if types is None else types
        if device != "cpu":
            ids, mask, types = _pad_to_bucket(ids, mask, types, enc, pad_id)
        ids, mask, types = ids.to(device), mask.to(device), types.to(device)
        res = enc(ids, mask, types)
        if pooling == "pooler":
            emb = res.pooler_output.float()
        elif pooling == "cls":
            emb = res.last_hidden_state[:, 0].float()
        else:
            m = mask.unsqueeze(-1).to(torch.float32)
            emb = (res.last_hidden_state.float() * m).sum(1) / m.sum(1).clamp(min=1e-9)
        if normalize:
            emb = torch.nn.functional.normalize(emb, p=2, dim=1)
        out[idx] = emb.cpu().numpy()
    return out


# On the GPU, batches are padded up to a multiple of this many tokens: padded positions are masked
# out (outputs and pooling are unchanged), and the fewer distinct shapes let the encoder replay
# its recorded CUDA graphs across batches and calls instead of launching op by op.
SEQ_BUCKET = 16


def _pad_to_bucket(ids, mask, types, enc: "Encoder", pad_id: int | None = None):
    import torch

    seq = ids.shape[1]
    # Never past the positions the model has (fewer than max_position_embeddings for RoBERTa).
    padded = min(-(-seq // SEQ_BUCKET) * SEQ_BUCKET, usable_seq_length(enc.config))
    if padded <= seq:
        return ids, mask, types
    extra = (0, padded - seq)
    if pad_id is None:
        pad_id = enc.tokenizer.pad_token_id or 0
    return (torch.nn.functional.pad(ids, extra, value=pad_id),
            torch.nn.functional.pad(mask, extra, value=0),
            torch.nn.functional.pad(types, extra, value=0))
