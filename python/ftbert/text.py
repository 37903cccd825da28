"""Text in, embeddings out for `Encoder.encode`: tokenization, batching by a token budget,
padding-free forwards and pooling.

One call runs a small pipeline:
1. Tokenize without padding, truncated at `enc.max_seq_length`, TOKENIZE_CHUNK texts per tokenizer
   call. This runs on a background thread of the call's own, at most PREFETCH batches ahead of the
   forwards; the engine releases the GIL, so the next batches are tokenized while a forward runs.
   Each chunk's ids are flat numpy arrays (ids one after another and offsets), never a Python list
   per text, which would keep the garbage collector's full passes busy (docs/performance.md).
2. Order the texts longest first (see TOKENIZE_CHUNK for how) and cut them, in that order, into
   batches of at most `batch_size` sequences whose sequences x longest (the engine's workspace
   for the batch; their token count is at most that) stays within `max_batch_tokens`. A text
   longer than the budget makes a batch of its own.
3. Run each batch packed (`Encoder.forward_packed`: the ids concatenated, `cu_seqlens` offsets), so
   only the real tokens are computed; no padded batch is ever built. On the GPU the packed ids go
   from pinned host memory to the GPU on torch's current stream, and the outputs stay there.
4. Pool on the packed output: "mean" sums each sequence's own rows, "cls" takes each sequence's
   first row, "pooler" is the pooler output. Normalize if asked, and write the rows back in the
   caller's order.

Threads. `encode` may be called from any number of threads at once, on one encoder. A fast
tokenizer (transformers', or tokenizer.json read directly: tokenization.py) is not safe to share
between threads: each call writes its padding and truncation
settings into the Rust tokenizer, then tokenizes in a second step that releases the GIL, so another
thread can change the settings in between (the batch comes out truncated or padded as the other call
asked), or, with some `tokenizers` releases, the call fails with "RuntimeError: Already borrowed".
And `Encoder.tokenizer` loads on first use, so threads arriving together would each load one.

Hence one lock per encoder (`tokenizer_lock`), held while the tokenizer loads and around each
tokenizer call, never across the forward or the pooling: one thread tokenizes while other threads'
forwards run in the engine. The background thread of each call takes the same lock for each of its
tokenizer calls. It is stopped and joined before `encode` returns or raises, and an exception raised
on it (by the tokenizer, say) is raised again in the caller, the same exception object. Per-thread
tokenizer copies would also let two tokenizations overlap, which gains little (the Rust step of a
batch call already runs without the GIL and spreads the texts over all cores; the Python step holds
the GIL anyway) and costs a copy per thread per encoder, growing with the caller's thread pool. Code that calls `enc.tokenizer` itself from
other threads while `encode` runs should hold `tokenizer_lock(enc)` around those calls.
"""

from __future__ import annotations

import json
import queue
import threading
import weakref
from contextlib import contextmanager
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, NamedTuple, Sequence

import numpy as np

from .weights_tools.layout import usable_seq_length

if TYPE_CHECKING:
    from .encoder import Encoder

POOLINGS = ("mean", "cls", "pooler")

# The batch limits (see _cut): the workspace stays within what the earlier padded default reached;
# the sequence cap matters for short texts only (docs/performance.md, "encode() batching").
DEFAULT_MAX_BATCH_TOKENS = 16384
DEFAULT_BATCH_SIZE = 256

# Texts per tokenizer call. Chunks rather than one call for all texts, so that the first forward
# waits for one chunk only and the tokenized ids of at most a few chunks are held at once. The
# order: the texts are sorted longest first by characters (cheap, and needs no tokens), chunked in
# that order, and each chunk sorted by its exact token counts. So the order is close to the global
# token order (only neighbours across a chunk boundary can be out of order), the first batch is the
# largest (the workspace grows once), and each batch holds sequences of similar length. The size
# keeps the Rust tokenizer's batch parallelism busy on a GPU, where tokenizing is most of the
# time (docs/performance.md, "encode() batching").
TOKENIZE_CHUNK = 2048

# Batches the background thread prepares ahead of the forwards.
PREFETCH = 2

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
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
    long_texts: str = "truncate",
    chunk_overlap: int = 32,
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
    _check_count("batch_size", batch_size)
    _check_count("max_batch_tokens", max_batch_tokens)
    pooling = pooling or default_pooling(enc.path)
    if pooling not in POOLINGS:
        raise ValueError(f"unknown pooling {pooling!r}: expected one of {', '.join(POOLINGS)}")
    if pooling == "pooler" and not enc.config["has_pooler"]:
        raise ValueError("pooling='pooler' needs a checkpoint with a pooler; this one has none")
    if long_texts not in LONG_TEXTS:
        raise ValueError(f"unknown long_texts {long_texts!r}: expected one of {', '.join(LONG_TEXTS)}")
    if long_texts == "chunk":
        return _encode_chunked(enc, texts, pooling, normalize, batch_size, max_batch_tokens, chunk_overlap)

    lock = tokenizer_lock(enc)
    with lock:  # the first call loads the tokenizer: once, however many threads arrive together
        tok = enc._text_tokenizer()
    # Longest first by characters; each chunk is then ordered by tokens (see TOKENIZE_CHUNK).
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    chunks = _tokenize(tok, lock, texts, order, enc.max_seq_length)
    batches = _cut(chunks, max_batch_tokens, batch_size)
    gpu = torch.device(enc.device) if enc.device.startswith("cuda") else None
    out = np.empty((len(texts), enc.hidden_size), dtype=np.float32)
    with _in_background(batches, PREFETCH) as ready:
        for batch in ready:
            out[batch.index] = _embed(enc, batch, pooling, normalize, gpu)
    return out


# What encode does with a text longer than max_seq_length: cut it there, or embed it in windows.
LONG_TEXTS = ("truncate", "chunk")


def _encode_chunked(enc, texts, pooling, normalize, batch_size, max_batch_tokens, overlap) -> np.ndarray:
    """long_texts="chunk": each text's tokens (without special tokens) in windows of the model's
    length less the special tokens, consecutive windows sharing `overlap` tokens, each window
    wrapped in the special tokens as the tokenizer adds them to one text; every window embedded
    (pooled, not normalized), a text's windows combined by their mean weighted by the tokens each
    holds, then normalized as asked. A text that fits is one window: its embedding is the
    truncating path's."""
    import torch

    if isinstance(overlap, (bool, np.bool_)) or not isinstance(overlap, (int, np.integer)) or overlap < 0:
        raise ValueError(f"encode: chunk_overlap must be a non-negative integer, got {overlap!r}")
    lock = tokenizer_lock(enc)
    with lock:
        tok = enc.tokenizer  # transformers': untruncated ids and the template's special tokens
        content = tok(texts, add_special_tokens=False, return_attention_mask=False)["input_ids"]
        prefix, suffix = special_tokens(tok)
    width = enc.max_seq_length - len(prefix) - len(suffix)
    if overlap >= width:
        raise ValueError(f"encode: chunk_overlap {overlap} must be less than a window's {width} tokens "
                         f"(max_seq_length {enc.max_seq_length} less the special tokens)")
    windows, owners, weights = [], [], []
    for t, ids in enumerate(content):
        if not ids and not (prefix or suffix):
            raise ValueError(f"encode: texts[{t}] gives no tokens ({texts[t]!r}), so there is nothing to pool")
        for window, weight in chunk_windows(ids, prefix, suffix, width, overlap):
            windows.append(window)
            owners.append(t)
            weights.append(weight)
    flat, _, lengths = _flatten(windows, None)
    all_windows = _longest_first(np.arange(len(windows), dtype=np.int64), flat, None, lengths)
    batches = _cut([all_windows], max_batch_tokens, batch_size)
    gpu = torch.device(enc.device) if enc.device.startswith("cuda") else None
    pooled = np.empty((len(windows), enc.hidden_size), dtype=np.float64)
    for batch in batches:
        pooled[batch.index] = _embed(enc, batch, pooling, False, gpu)
    w = np.asarray(weights, dtype=np.float64)[:, None]
    out = np.zeros((len(texts), enc.hidden_size), dtype=np.float64)
    np.add.at(out, np.asarray(owners), pooled * w)
    out /= np.bincount(owners, weights=w[:, 0], minlength=len(texts))[:, None]
    if normalize:
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
    return out.astype(np.float32)


def chunk_windows(ids: list[int], prefix: list[int], suffix: list[int], width: int,
                  overlap: int) -> list[tuple[list[int], int]]:
    """One text's content ids (no special tokens) as windows of at most `width` ids, consecutive
    windows sharing `overlap`, each wrapped in prefix and suffix: [(window ids, weight)], the
    weight being the content ids it holds (at least 1). What long_texts="chunk" embeds, in encode
    and in the server's batcher; 0 <= overlap < width."""
    return [(prefix + ids[s : s + width] + suffix, max(1, len(ids[s : s + width])))
            for s in range(0, max(1, len(ids) - overlap), width - overlap)]


def special_tokens(tok) -> tuple[list[int], list[int]]:
    """The ids the tokenizer puts before and after one text's tokens ([CLS] and [SEP] for BERT)."""
    plain = tok(["a"], add_special_tokens=False)["input_ids"][0]
    full = tok(["a"])["input_ids"][0]
    for i in range(len(full) - len(plain) + 1):
        if full[i : i + len(plain)] == plain:
            return list(full[:i]), list(full[i + len(plain) :])
    raise ValueError("encode: cannot tell the tokenizer's special tokens apart from a text's (chunking "
                     "needs them before and after the text)")


def _check_count(name: str, value) -> None:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"encode: {name} must be an integer, got {value!r}")
    if value < 1:
        raise ValueError(f"encode: {name} must be at least 1, got {value}")


# ---- the background side: tokenize, order, cut, pack ------------------------------------------
class _Batch(NamedTuple):
    index: np.ndarray  # [B]: each sequence's position in the caller's texts
    input_ids: np.ndarray  # [T] int32, the sequences one after another
    token_type_ids: np.ndarray | None  # [T] int32, or None where the tokenizer gives none
    cu_seqlens: np.ndarray  # [B + 1] int64 offsets: sequence b is input_ids[cu[b]:cu[b + 1]]


def _tokenize(tok, lock, texts, order, max_length) -> Iterator[_Batch]:
    """The texts in `order`, TOKENIZE_CHUNK per tokenizer call, each chunk as one _Batch whose
    sequences come longest first (ties in `order`'s order)."""
    for start in range(0, len(order), TOKENIZE_CHUNK):
        idx = np.asarray(order[start : start + TOKENIZE_CHUNK], dtype=np.int64)
        with lock:  # never held across a yield: the caller's forwards and other threads go on
            ids, types, lengths = _tokenize_flat(tok, [texts[i] for i in idx], max_length)
        empty = np.flatnonzero(lengths == 0)
        if empty.size:
            i = int(idx[empty[0]])
            raise ValueError(f"encode: texts[{i}] gives no tokens ({texts[i]!r}), so there is nothing "
                             "to pool")
        yield _longest_first(idx, ids, types, lengths)


def _tokenize_flat(tok, texts: list[str], max_length: int):
    """(ids int32 [T], type ids int32 [T] or None, lengths int64 [n]) of the texts, one after another."""
    if hasattr(tok, "flat"):  # tokenization.TextTokenizer: no per-sequence lists kept
        return tok.flat(texts)
    enc = tok(texts, truncation=True, max_length=max_length, return_attention_mask=False)
    return _flatten(enc["input_ids"], enc.get("token_type_ids"))


def _flatten(ids: list, types: list | None):
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    total = int(lengths.sum())
    flat = np.fromiter(chain.from_iterable(ids), dtype=np.int32, count=total)
    flat_types = None
    if types is not None:
        flat_types = np.fromiter(chain.from_iterable(types), dtype=np.int32, count=total)
    return flat, flat_types, lengths


def _longest_first(index: np.ndarray, ids: np.ndarray, types: np.ndarray | None,
                   lengths: np.ndarray) -> _Batch:
    """The sequences (index [n], their ids one after another, lengths [n]) reordered longest
    first, ties kept in order."""
    perm = np.argsort(-lengths, kind="stable")
    cu = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=cu[1:])
    sorted_lengths = lengths[perm]
    new_cu = np.zeros_like(cu)
    np.cumsum(sorted_lengths, out=new_cu[1:])
    # Token t of the new order comes from its sequence's old start plus its place in the sequence.
    gather = np.repeat(cu[:-1][perm] - new_cu[:-1], sorted_lengths) + np.arange(int(cu[-1]))
    return _Batch(index[perm], ids[gather], None if types is None else types[gather], new_cu)


def _cut(chunks: Iterable[_Batch], max_tokens: int, max_sequences: int) -> Iterator[_Batch]:
    """The chunks' sequences, in their order, grouped into batches of at most `max_sequences`
    sequences whose sequences x longest stays within `max_tokens` (so their token count does
    too); a sequence longer than `max_tokens` is a batch of its own. A chunk's last batch waits
    for the next chunk's sequences.

    The engine sizes a packed forward's workspace by sequences x longest, not by the token count:
    bounding that keeps it within the budget where a batch's lengths drop sharply (a few long
    texts, then many short ones). Longest first, the two counts are close otherwise (2,000
    mixed-length sentences: 10 batches under this rule, 9 with the token count alone)."""
    pending = None
    for chunk in chunks:
        pending = chunk if pending is None else _concat(pending, chunk)
        starts = _batch_starts(np.diff(pending.cu_seqlens).tolist(), max_tokens, max_sequences)
        for i, j in zip(starts[:-1], starts[1:]):
            yield _slice(pending, i, j)
        pending = _slice(pending, starts[-1], len(pending.index))
    if pending is not None and len(pending.index):
        yield pending


def warm_up_token_counts(max_tokens: int) -> list[int]:
    """Token counts of packed forwards that together meet every row bucket of the GPU's measured
    GEMM choice up to `max_tokens` (four an octave: gemm_tuner.h) and a few smaller sizes: what
    `Encoder.warm_up` runs, so that `encode`'s batches find their kernels loaded."""
    counts = {16, 64, 128, 256}
    top = 512
    while top // 2 < max_tokens:
        counts.update(top * eighths // 8 for eighths in (5, 6, 7, 8))
        top *= 2
    return sorted({min(c, max_tokens) for c in counts})


def _batch_starts(lengths: list[int], max_tokens: int, max_sequences: int) -> list[int]:
    """Where each batch starts in `lengths`, greedily (see _cut)."""
    starts, count, longest = [0], 0, 0
    for k, n in enumerate(lengths):
        if count and ((count + 1) * max(longest, n) > max_tokens or count == max_sequences):
            starts.append(k)
            count, longest = 0, 0
        count += 1
        longest = max(longest, n)
    return starts


def _slice(b: _Batch, i: int, j: int) -> _Batch:
    """Sequences i..j-1 of b."""
    lo, hi = int(b.cu_seqlens[i]), int(b.cu_seqlens[j])
    types = None if b.token_type_ids is None else b.token_type_ids[lo:hi]
    return _Batch(b.index[i:j], b.input_ids[lo:hi], types, b.cu_seqlens[i : j + 1] - lo)


def _concat(a: _Batch, b: _Batch) -> _Batch:
    types = None
    if a.token_type_ids is not None or b.token_type_ids is not None:
        types = np.concatenate([np.zeros(len(x.input_ids), np.int32) if x.token_type_ids is None
                                else x.token_type_ids for x in (a, b)])
    cu = np.concatenate([a.cu_seqlens, b.cu_seqlens[1:] + a.cu_seqlens[-1]])
    return _Batch(np.concatenate([a.index, b.index]), np.concatenate([a.input_ids, b.input_ids]),
                  types, cu)


@contextmanager
def _in_background(items: Iterator, depth: int):
    """Runs the iterator `items` on a thread of its own, at most `depth` items ahead of the caller,
    and gives an iterator over what it yields. An exception raised in `items` is raised again from
    that iterator (the same exception object). On leaving the block, however it is left, the thread
    is stopped (once it is done with the item in hand) and joined."""
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def put(entry) -> bool:
        # After `stop` is set, at most this one put is under way, and the queue has been emptied.
        if stop.is_set():
            return False
        ready.put(entry)
        return True

    def work():
        try:
            for item in items:
                if not put((item, None)):
                    return
        except BaseException as e:  # handed to the caller, raised there
            put((None, e))
        else:
            put((done, None))

    def results():
        while True:
            item, error = ready.get()
            if error is not None:
                raise error
            if item is done:
                return
            yield item

    thread = threading.Thread(target=work, name="ftbert-encode-tokenize", daemon=True)
    thread.start()
    try:
        yield results()
    finally:
        stop.set()
        while True:  # frees a put blocked on a full queue
            try:
                ready.get_nowait()
            except queue.Empty:
                break
        thread.join()


# ---- the caller's side: forward and pool -------------------------------------------------------
def pack_sequences(ids: Sequence[np.ndarray], types: Sequence[np.ndarray | None]) -> _Batch:
    """Sequences given one array each (the server's batcher) as one packed batch, index 0..n-1;
    type ids zeros where a sequence has none and another has."""
    cu = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum([len(a) for a in ids], out=cu[1:])
    flat_types = None
    if any(t is not None for t in types):
        flat_types = np.concatenate([np.zeros(len(a), np.int32) if t is None else t
                                     for a, t in zip(ids, types)])
    return _Batch(np.arange(len(ids), dtype=np.int64), np.concatenate(ids).astype(np.int32, copy=False),
                  flat_types, cu)


def forward_packed_batch(enc: "Encoder", batch: _Batch, gpu):
    """One packed forward of `batch`: (the encoder's outputs, cu_seqlens as a torch int64 tensor on
    the outputs' device). On the GPU the ids go from pinned host memory on torch's current stream
    and the host does not wait for the copies; the outputs stay on the GPU until pooled."""
    import torch

    if gpu is None:  # numpy in, numpy out: the host path
        return (enc.forward_packed(batch.input_ids, batch.cu_seqlens, batch.token_type_ids),
                torch.from_numpy(batch.cu_seqlens))
    ids, types, offsets = (
        None if a is None else torch.from_numpy(a).pin_memory().to(gpu, non_blocking=True)
        for a in (batch.input_ids, batch.token_type_ids, batch.cu_seqlens)
    )
    return enc.forward_packed(ids, batch.cu_seqlens, types), offsets


def _embed(enc: "Encoder", batch: _Batch, pooling: str, normalize: bool, gpu) -> np.ndarray:
    """One packed batch's embeddings, float32 [B, H]."""
    res, offsets = forward_packed_batch(enc, batch, gpu)
    emb = pool_packed(res.last_hidden_state, res.pooler_output, offsets, pooling, normalize)
    return emb.cpu().numpy()


def pool_packed(hidden, pooler_output, offsets, pooling: str, normalize: bool):
    """Sequence embeddings from a packed forward's outputs (what `encode` returns per batch, also
    used by the server's batcher): float32 torch [B, H] on the outputs' device.

    hidden: last_hidden_state [T, H]; pooler_output: [B, H] or None; offsets: cu_seqlens [B + 1]
    as a torch int64 tensor on the outputs' device. pooling: "mean", "cls" or "pooler"."""
    import torch

    if pooling == "pooler":
        emb = torch.as_tensor(pooler_output).float()
    else:
        hidden = torch.as_tensor(hidden).float()  # [T, H]
        if pooling == "cls":
            emb = hidden[offsets[:-1]]
        else:
            # Each sequence's own rows summed. segment_reduce rather than index_add_, whose atomics
            # on the GPU would let the last bits vary from call to call.
            sums = torch.segment_reduce(hidden, "sum", offsets=offsets, axis=0)
            emb = sums / offsets.diff().unsqueeze(1).to(sums.dtype)
    if normalize:
        emb = torch.nn.functional.normalize(emb, p=2, dim=1)
    return emb


# ---- padded batches on the GPU (Encoder.predict and the rerank benchmark) ----------------------
# Padded GPU batches are padded up to a multiple of this many tokens: padded positions are masked
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
