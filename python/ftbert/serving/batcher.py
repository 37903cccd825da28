"""Dynamic batching: requests from many clients in, packed forwards out, each request's own rows back.

    batcher = Batcher([encoder, ...], settings)      # one forward thread per encoder
    batcher.start()
    result = await batcher.submit(Job(EMBED, "text", ["a text", ...]))   # on the event loop
    batcher.close()                                  # finishes every accepted job, then stops

The path of a request (a *job*: its inputs are texts, text pairs or token-id lists):
1. `submit` (event loop) counts its inputs against `max_queue` (over it: QueueFull, the server's
   429) and hands the job to the tokenizer thread. Nothing heavier runs on the event loop. A job
   that comes tokenized (`Job.tokenized`: a front process of `ftbert serve --workers` ran
   JobTokenizer) is checked against the limits and queued for the forward threads right there.
2. The tokenizer thread takes every job waiting, tokenizes each kind of input in one tokenizer call
   (the Rust tokenizer spreads a batch call over the cores), applies the length limit (truncate, or
   fail the job with InputTooLong; or, under long_texts "chunk", cut each text to embed into
   windows, text.chunk_windows), and appends one entry per input (or window) to the forward
   queue. It runs
   while the forward threads compute (the engine releases the GIL), so tokenizing overlaps them.
3. A forward thread, one per encoder, each owning its encoder, takes inputs from the head of the
   queue while they fit the token budget: at most `max_batch_size` sequences whose count x longest
   (what the engine's workspace holds for a packed batch) is within `max_batch_tokens`. When the
   queue holds less than a full batch it waits up to `max_wait_ms` after its oldest input arrived
   for more to come. Inputs of different requests and kinds share a forward: one packed forward
   (`Encoder.forward_packed`, only real tokens computed) gives the pooled embedding and the
   sequence head's logits of every input, and each input takes what its job asked for; SPARSE and
   MULTIVECTOR inputs' hidden states go on through the encoder's masked-LM head or token
   projection (`Encoder.sparse_from_packed`, `multivector_from_packed`), theirs only.
4. Each row is written into its job's result at the input's own index (a window's pooled row is
   added into its text's, weighted by the tokens it holds, and the sum divided and normalized
   with the last); the thread that writes a job's last row resolves the job's asyncio future,
   the jobs a forward finishes together in one `loop.call_soon_threadsafe`.

A job's inputs may be split over several forwards (and forward threads); a forward may hold inputs
of many jobs. An error in a forward (the device out of memory, a CUDA or engine error) fails the
jobs whose inputs were in it with ForwardFailed, and nothing else: the thread goes on with the next
batch.
`close` refuses new jobs (ShuttingDown), lets the threads finish every job accepted so far, and
joins them.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, NamedTuple, Sequence

import numpy as np

from ..cross_encoder import _truncation_length
from ..encoder import MULTIVECTOR, OUTPUT_HEADS, SPARSE, keep_top_k
from ..text import (chunk_windows, default_pooling, forward_packed_batch, pack_sequences, pool_packed,
                    special_tokens, tokenizer_lock)
from ..tokenization import server_tokenizer

if TYPE_CHECKING:
    from ..encoder import Encoder
    from .settings import ServeSettings

log = logging.getLogger("ftbert.serve")

# What a job wants from the forward: the pooled, normalized embedding, or the sequence head's logits;
# or, through a head of the checkpoint run after the encoder, SPLADE's sparse vector (SPARSE: per
# input (indices, values)) or ColBERT's token vectors (MULTIVECTOR: per input [tokens, dim]).
EMBED = "embed"
SCORE = "score"
KINDS = (EMBED, SCORE, SPARSE, MULTIVECTOR)
# How a job's inputs become token ids: single texts, (text, text) pairs, or ids given as they are.
TEXT, PAIR, IDS = "text", "pair", "ids"

# Jobs the tokenizer thread takes into one round (one tokenizer call per kind of input).
TOKENIZE_ROUND = 256


# ---- errors a job can end with (the app turns them into HTTP statuses) -------------------------
class BatcherError(Exception):
    pass


class QueueFull(BatcherError):
    """The queue holds `max_queue` inputs already."""


class ShuttingDown(BatcherError):
    """The batcher is closing (or closed) and takes no new jobs."""


class InputTooLong(BatcherError):
    def __init__(self, index: int, tokens: int, limit: int):
        self.index, self.tokens, self.limit = index, tokens, limit
        super().__init__(f"input {index} has {tokens} tokens, more than the limit of {limit} "
                         "(inputs are not truncated)")


class NoTokens(BatcherError):
    def __init__(self, index: int):
        self.index = index
        super().__init__(f"input {index} gives no tokens, so there is nothing to encode")


class NonFiniteOutput(BatcherError):
    """A job's output holds NaN or Inf (the checkpoint's weights drive the activations out of range
    for that input): it cannot be returned as JSON numbers, nor trusted."""

    def __init__(self, index: int):
        self.index = index
        super().__init__(f"the model's output for input {index} holds NaN or Inf")


class ForwardFailed(BatcherError):
    """A forward that held some of the job's inputs raised. out_of_memory: the device (or the host)
    ran out of memory, which a later, smaller batch may not; else a fault of the model or the
    engine. cause: the error as "Type: message"; device, inputs, tokens: the forward's."""

    def __init__(self, out_of_memory: bool, cause: str, device: str, inputs: int, tokens: int):
        self.out_of_memory, self.cause, self.device, self.inputs, self.tokens = (out_of_memory, cause, device,
                                                                                 inputs, tokens)
        what = "ran out of memory" if out_of_memory else "failed"
        super().__init__(f"the forward on {device} that held this request's inputs ({_count(inputs, 'input')} "
                         f"of all requests in it, {_count(tokens, 'token')}) {what}: {cause}")


# How an out of memory reads where it is no MemoryError or torch.OutOfMemoryError: torch's before
# 1.13, this engine's cudaMalloc and cuBLAS checks (cuda_check.h).
_OUT_OF_MEMORY_WORDS = ("out of memory", "cudaerrormemoryallocation", "cublas_status_alloc_failed")


def is_out_of_memory(e: BaseException) -> bool:
    """Whether a forward's error is the device (or host) running out of memory."""
    if isinstance(e, MemoryError) or any(c.__name__ == "OutOfMemoryError" for c in type(e).__mro__):
        return True  # by name: torch.OutOfMemoryError without importing torch here
    text = str(e).lower()
    return any(w in text for w in _OUT_OF_MEMORY_WORDS)


# ---- jobs -------------------------------------------------------------------------------------
@dataclass
class JobResult:
    # float32 [N, H] unit-norm embeddings (EMBED) or [N, num_labels] logits (SCORE); a list of N
    # (indices int64 [n], values float32 [n]) pairs (SPARSE) or of float32 [tokens, dim] (MULTIVECTOR).
    values: np.ndarray | list
    tokens: int  # tokens forwarded for the job (after truncation): its usage


class Job:
    """One request's inputs. kind: EMBED or SCORE; how: TEXT, PAIR or IDS; inputs: a list of str,
    of (str, str) pairs, or of token-id lists (already checked against the vocabulary).
    normalize: EMBED rows of unit norm (else as pooled); truncate: cut inputs past the limit (None:
    the server's setting) or refuse them; truncation_side: which end is cut ("right" or "left");
    long_texts: "truncate" or "chunk" for texts to embed past the limit (None: the server's).
    top_k: SPARSE only, the largest values kept per input (None: all). normalize applies to
    MULTIVECTOR's token vectors too. attended: MULTIVECTOR token ids only, per input how many of
    its first tokens attend to one another; the rest (a ColBERT query's [MASK] expansion) attend to
    those and are attended by none, so such an input runs in a padded forward of its own
    (Encoder.multivector_from_sequences) rather than in the packed ones (None: every token
    attends)."""

    def __init__(self, kind: str, how: str, inputs: Sequence, normalize: bool = True,
                 truncate: bool | None = None, truncation_side: str = "right",
                 long_texts: str | None = None, top_k: int | None = None,
                 attended: Sequence[int] | None = None):
        if kind not in KINDS or how not in (TEXT, PAIR, IDS):
            raise ValueError(f"unknown job kind {kind!r} / input kind {how!r}")
        if attended is not None:
            attended = list(attended)
            if kind != MULTIVECTOR or how != IDS or len(attended) != len(inputs):
                raise ValueError(f"attended must give one count per input of a multivector job of token ids; "
                                 f"got {len(attended)} for {len(inputs)} inputs ({kind}, {how})")
            for i, (a, ids) in enumerate(zip(attended, inputs)):
                if isinstance(a, bool) or not isinstance(a, int) or not 1 <= a <= len(ids):
                    raise ValueError(f"attended[{i}] must be an int from 1 to its input's {len(ids)} tokens, "
                                     f"got {a!r}")
        self.attended = attended
        if top_k is not None and (kind != SPARSE or isinstance(top_k, bool) or not isinstance(top_k, int)
                                  or top_k < 1):
            raise ValueError(f"top_k must be a positive integer, for sparse jobs only; got {top_k!r} ({kind})")
        self.top_k = top_k
        if not inputs:
            raise ValueError("a job needs at least one input")
        if truncation_side not in ("right", "left"):
            raise ValueError(f"truncation_side must be 'right' or 'left', got {truncation_side!r}")
        if long_texts not in (None, "truncate", "chunk"):
            raise ValueError(f"long_texts must be 'truncate' or 'chunk', got {long_texts!r}")
        self.long_texts = long_texts
        self.kind, self.how, self.inputs = kind, how, list(inputs)
        self.normalize, self.truncate, self.truncation_side = normalize, truncate, truncation_side
        self.tokens = 0
        # Its inputs' token ids, where a front process tokenized them (JobTokenizer.tokenize's
        # rows); None: the batcher's tokenizer thread does.
        self.tokenized: list | None = None
        self.cancelled = False
        self._out: np.ndarray | list | None = None  # JobResult.values, filled row by row
        self._remaining = len(self.inputs)  # rows (inputs, or windows of chunked texts) not yet written
        self._chunks: tuple[np.ndarray, np.ndarray] | None = None  # chunked: (sums [n, H], weights [n])
        self._settled = False
        self._future: asyncio.Future | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __len__(self) -> int:
        return len(self.inputs)


class _Seq(NamedTuple):
    job: Job
    slot: int  # the input's index in its job
    ids: np.ndarray  # [L] int32
    types: np.ndarray | None  # [L] int32, or None where the tokenizer gives no token types
    arrived: float  # when it entered the forward queue (perf_counter)
    weight: float | None = None  # a window of a chunked text: the tokens it holds; else None
    attended: int | None = None  # fewer than len(ids) tokens attend (Job.attended): a padded forward


class JobTokenizer:
    """Jobs' inputs as token ids, as the server's settings say: the input limits (`limits` by input
    kind), truncation (the job's or the server's, either side), long texts cut into windows. The
    batcher's tokenizer thread runs it, and so does each front process of `ftbert serve --workers`
    (engine.py), whose jobs then reach the batcher tokenized. `lock()` guards the tokenizer (a
    context manager: the same tokenizer object is never called from two threads at once)."""

    def __init__(self, tokenizer, settings: "ServeSettings", limits: dict[str, int], lock: Callable,
                 fast=None):
        self._tok, self.settings, self.limits, self._lock = tokenizer, settings, limits, lock
        self._specials: tuple[list[int], list[int]] | None = None  # around a window (long_texts "chunk")
        # `fast`: the checkpoint's tokenizer.json as a `tokenizers.Tokenizer` where it gives
        # transformers' ids (tokenization.server_tokenizer), of this JobTokenizer's own (its
        # truncation is set per call). Single texts go through it without transformers' wrapper
        # and without offsets: a short text 22 against 32 us, a 250-word one 330 against 410.
        self._fast = fast
        self._fast_encode = None if fast is None else getattr(fast, "encode_batch_fast", fast.encode_batch)
        self._fast_truncation: tuple | None = ()  # what is set on it: (max_length, side), None for none
        # ASCII texts of a BERT-style tokenizer skip its normalizer (tokenization.AsciiShortcut).
        from ..tokenization import AsciiShortcut

        self._ascii = None if fast is None else AsciiShortcut.of(fast)
        if self._ascii is not None:
            bare = self._ascii.bare
            self._ascii_encode = getattr(bare, "encode_batch_fast", bare.encode_batch)

    def warm_up(self) -> None:
        """Tokenizes one short text as a request's would be: the first call's own costs (the
        truncation set on the tokenizer, first calls through each step: 140 against 25-35 us on a
        2-core VM) land at start, not in the first request."""
        try:
            self.tokenize(Job(EMBED, TEXT, ["Warm up, the tokenizer."]))
        except BatcherError:  # too long for a tiny --max-input-length: tokenized all the same
            pass

    def tokenize(self, job: Job) -> list:
        """One job's rows [(slot, ids, types, weight)], checked against the limits; raises the
        job's InputTooLong or NoTokens."""
        rows = (self.tokenize_windows([job])[0] if self.chunks(job)
                else self.tokenize_group(job.how, [job], self.truncates(job), job.truncation_side)[0])
        error = self.check_lengths(job.how, rows, self.truncates(job) or self.chunks(job))
        if error is not None:
            raise error
        return rows

    def chunks(self, job: Job) -> bool:
        """Whether the job's texts are embedded in windows (long_texts "chunk")."""
        mode = self.settings.long_texts if job.long_texts is None else job.long_texts
        return mode == "chunk" and job.kind == EMBED and job.how == TEXT

    def window_width(self) -> int:
        if self._specials is None:
            with self._lock():
                self._specials = special_tokens(self._tok)
        prefix, suffix = self._specials
        width = self.limits[TEXT] - len(prefix) - len(suffix)
        if self.settings.chunk_overlap >= width:
            raise ValueError(f"chunk_overlap {self.settings.chunk_overlap} must be less than a window's "
                             f"{width} tokens (the input limit less the special tokens)")
        return width

    def tokenize_windows(self, group: list[Job]) -> list[list]:
        """Each job's texts as windows (text.chunk_windows): [(slot, ids, None, weight)] per job."""
        width, overlap = self.window_width(), self.settings.chunk_overlap
        prefix, suffix = self._specials
        flat = [x for job in group for x in job.inputs]
        with self._lock():
            if self._fast is not None:
                content = self._fast_ids(flat, None, "right", special_tokens=False)
            else:
                content = self._tok(flat, add_special_tokens=False, return_attention_mask=False)["input_ids"]
        out, k = [], 0
        for job in group:
            rows = []
            for slot in range(len(job)):
                ids = content[k + slot]
                windows = chunk_windows(ids, prefix, suffix, width, overlap)
                rows.extend((slot, np.asarray(w, dtype=np.int32), None, float(weight)) for w, weight in windows)
            out.append(rows)
            k += len(job)
        return out

    def truncates(self, job: Job) -> bool:
        return self.settings.truncate if job.truncate is None else job.truncate

    def tokenize_group(self, how: str, group: list[Job], truncate: bool, side: str) -> list[list]:
        limit = self.limits[how]
        if how == IDS:
            cut = (lambda ids: ids[:limit]) if side == "right" else (lambda ids: ids[max(0, len(ids) - limit):])
            return [[(slot, np.asarray(cut(ids) if truncate else ids, dtype=np.int32), None, None)
                     for slot, ids in enumerate(job.inputs)] for job in group]
        flat = [x for job in group for x in job.inputs]
        if how == TEXT and self._fast is not None:
            with self._lock():
                ids = self._fast_ids(flat, limit if truncate else None, side)
            out, k = [], 0
            for job in group:  # single texts: type 0 throughout, as the IDS rows
                out.append([(slot, np.asarray(ids[k + slot], dtype=np.int32), None, None)
                            for slot in range(len(job))])
                k += len(job)
            return out
        opts = dict(return_attention_mask=False)
        if truncate:
            opts.update(truncation=True if how == TEXT else "longest_first", max_length=limit)
        with self._lock():
            # The tokenizer's side is its own setting: set for this call, put back after.
            before = getattr(self._tok, "truncation_side", "right")
            if side != before:
                self._tok.truncation_side = side
            try:
                if how == TEXT:
                    enc = self._tok(flat, **opts)
                else:
                    enc = self._tok([a for a, _ in flat], [b for _, b in flat], **opts)
            finally:
                if side != before:
                    self._tok.truncation_side = before
        ids, types = enc["input_ids"], enc.get("token_type_ids")
        out, k = [], 0
        for job in group:
            out.append([(slot, np.asarray(ids[k + slot], dtype=np.int32),
                         None if types is None else np.asarray(types[k + slot], np.int32), None)
                        for slot in range(len(job))])
            k += len(job)
        return out

    def _fast_ids(self, texts: list, max_length: int | None, side: str, special_tokens: bool = True) -> list:
        """Single texts' ids through `fast`, cut at max_length from `side` (None: not cut). The
        caller holds the lock: the truncation is the tokenizer's state."""
        setting = None if max_length is None else (max_length, side)
        if setting != self._fast_truncation:
            for tok in (self._fast,) if self._ascii is None else (self._fast, self._ascii.bare):
                if setting is None:
                    tok.no_truncation()
                else:
                    tok.enable_truncation(max_length=max_length, direction=side)
            self._fast_truncation = setting
        if self._ascii is not None:
            normalized = [self._ascii.normalized(t) if isinstance(t, str) else None for t in texts]
            if None not in normalized:
                pieces = self._ascii.word_pieces
                if pieces is not None and pieces.takes(normalized):
                    return [pieces.ids(t, max_length, side, special_tokens) for t in normalized]
                return [e.ids for e in self._ascii_encode(normalized, add_special_tokens=special_tokens)]
        return [e.ids for e in self._fast_encode(texts, add_special_tokens=special_tokens)]

    def check_lengths(self, how: str, seqs: list, truncate: bool) -> BatcherError | None:
        for slot, ids, _, _ in seqs:
            if len(ids) == 0:
                return NoTokens(slot)
            if not truncate and len(ids) > self.limits[how]:
                return InputTooLong(slot, len(ids), self.limits[how])
        return None


class Batcher:
    def __init__(self, encoders: Sequence["Encoder"], settings: "ServeSettings", metrics=None):
        if not encoders:
            raise ValueError("the batcher needs at least one encoder")
        self.encoders = list(encoders)
        self.settings = settings
        self.metrics = metrics
        first = self.encoders[0]
        self.hidden_size = first.hidden_size
        self.num_labels = first.num_labels
        self.pooling = settings.pooling or default_pooling(first.path)
        self._tok_enc = first  # every encoder holds the same checkpoint: one tokenizer serves all
        self.limits: dict[str, int] = {}
        self.tokenizer: JobTokenizer | None = None  # set by start()
        # Why the encoders cannot run SPARSE / MULTIVECTOR jobs (OUTPUT_HEADS kinds), None where
        # they can; set by start().
        self.unavailable: dict[str, str | None] = {}

        self._lock = threading.Lock()  # guards the counters below and each job's remaining count
        self._waiting = 0  # inputs accepted and not yet taken into a forward
        self._closing = False
        self.accepted = 0  # jobs accepted
        self.finished = 0  # jobs resolved (result or error)
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()  # to the tokenizer thread; None ends it
        self._cond = threading.Condition()  # guards the forward queue and _tokenized_all
        self._queue: collections.deque[_Seq] = collections.deque()
        self._tokenized_all = False  # the tokenizer thread has ended: no more inputs will come
        self._threads: list[threading.Thread] = []

    # ---- life cycle --------------------------------------------------------------------------
    def start(self) -> None:
        """Loads the tokenizer and starts the threads (the tokenizer's, one forward thread per
        encoder)."""
        enc = self._tok_enc
        with tokenizer_lock(enc):
            tok = enc.tokenizer
        model_limit = enc.max_seq_length
        pair_limit = _truncation_length(enc, tok)
        cap = self.settings.max_input_length
        self.limits = {
            TEXT: min(model_limit, cap) if cap else model_limit,
            IDS: min(model_limit, cap) if cap else model_limit,
            PAIR: min(pair_limit, cap) if cap else pair_limit,
        }
        self.tokenizer = JobTokenizer(tok, self.settings, self.limits, lambda: tokenizer_lock(enc),
                                      fast=server_tokenizer(enc.path, self.limits[TEXT], tok))
        self.tokenizer.warm_up()
        for kind in OUTPUT_HEADS:
            reason = enc.unavailable_reason(kind)
            if reason is None:
                # Read now, on every encoder, so that no forward thread stops to read a head from disk.
                try:
                    for e in self.encoders:
                        e.load_output_head(kind)
                except ValueError as err:  # a head that is there but cannot be used (NaN, shapes)
                    reason = str(err)
            self.unavailable[kind] = reason
        if self.settings.long_texts == "chunk":
            self.tokenizer.window_width()  # refuses an overlap the limit leaves no room for, at start
        self._threads = [threading.Thread(target=self._tokenize_loop, name="ftbert-serve-tokenize", daemon=True)]
        for i, e in enumerate(self.encoders):
            self._threads.append(threading.Thread(target=self._forward_loop, args=(e,),
                                                  name=f"ftbert-serve-forward-{i}", daemon=True))
        for t in self._threads:
            t.start()

    def close(self, timeout: float | None = None) -> None:
        """Refuses new jobs, finishes every accepted one, and joins the threads."""
        with self._lock:
            if self._closing:
                already = True
            else:
                already, self._closing = False, True
        if not already:
            self._jobs.put(None)
        for t in self._threads:
            t.join(timeout)

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def queue_depth(self) -> int:
        """Inputs accepted and not yet taken into a forward (being tokenized or queued)."""
        return self._waiting

    # ---- the event loop's side ---------------------------------------------------------------
    def submit(self, job: Job) -> asyncio.Future:
        """Queues `job` and returns a future (of the running loop) that resolves to its JobResult,
        or to the BatcherError (or forward error) it ended with. Raises QueueFull or ShuttingDown
        at once when it cannot take the job."""
        loop = asyncio.get_running_loop()
        job._loop, job._future = loop, loop.create_future()
        job._future.add_done_callback(_mark_cancelled(job))
        if job.kind in OUTPUT_HEADS:
            if self.unavailable.get(job.kind):
                raise ValueError(self.unavailable[job.kind])
            job._out = [None] * len(job)
        else:
            width = self.hidden_size if job.kind == EMBED else self.num_labels
            if job.kind == SCORE and not width:
                raise ValueError("score jobs need an encoder with a sequence-classification head")
            job._out = np.empty((len(job), width), dtype=np.float32)
        if job.tokenized is not None:
            return self._submit_tokenized(job)
        with self._lock:
            self._accept(job)
            # Put under the lock: close() puts the end marker under it too, so no job lands after it.
            self._jobs.put(job)
        return job._future

    def _accept(self, job: Job) -> None:
        """Counts the job in, or raises ShuttingDown or QueueFull (holding _lock)."""
        if self._closing:
            raise ShuttingDown("the server is shutting down")
        if self._waiting + len(job) > self.settings.max_queue:
            raise QueueFull(f"the queue holds {self._waiting} inputs; {len(job)} more would pass "
                            f"its limit of {self.settings.max_queue}")
        self._waiting += len(job)
        self.accepted += 1

    def _submit_tokenized(self, job: Job) -> asyncio.Future:
        """A job a front process tokenized goes straight to the forward queue: handing it to the
        tokenizer thread, which has nothing to do for it, would cost a thread wake-up per job."""
        t = self.tokenizer
        error = t.check_lengths(job.how, job.tokenized, t.truncates(job) or t.chunks(job))
        seqs = [] if error is not None else self._queued(job, job.tokenized, time.perf_counter())
        # _cond before _lock, as the forward threads take them; the queue is filled under _cond
        # with _closing checked: the tokenizer thread ends (close()) only after, so the forward
        # threads see these inputs before they stop.
        with self._cond:
            with self._lock:
                self._accept(job)
                if error is None:
                    self._waiting += len(seqs) - len(job)  # windows of chunked texts
            if error is None:
                self._queue.extend(seqs)
                self._cond.notify()
        if error is not None:
            self._fail_unqueued(job, error)
        return job._future

    # ---- the tokenizer thread ----------------------------------------------------------------
    def _tokenize_loop(self) -> None:
        end = False
        while not end:
            first = self._jobs.get()
            jobs = [] if first is None else [first]
            end = first is None
            while not end and len(jobs) < TOKENIZE_ROUND:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    end = True
                else:
                    jobs.append(job)
            if jobs:
                t0 = time.perf_counter()
                try:
                    seqs = self._tokenize(jobs)
                except Exception as e:  # never leave the thread: later jobs would wait forever
                    for job in jobs:
                        if not job._settled:
                            self._fail_unqueued(job, e)
                    continue
                if self.metrics is not None:
                    self.metrics.on_tokenize(time.perf_counter() - t0, sum(len(j) for j in jobs))
                with self._cond:
                    self._queue.extend(seqs)
                    self._cond.notify_all()
        with self._cond:
            self._tokenized_all = True
            self._cond.notify_all()

    def _tokenize(self, jobs: list[Job]) -> list[_Seq]:
        """The jobs' inputs as forward-queue entries, in job order; a job that fails here (too
        long, no tokens, a tokenizer error) is resolved with its error and left out."""
        tokenized: dict[int, list] = {}  # id(job) -> [(ids, types)] per input
        failed: set[int] = set()
        # One tokenizer call per kind of input and way of truncating.
        groups: dict[tuple, list[Job]] = {}
        t = self.tokenizer
        for j in jobs:
            if j.cancelled:
                continue
            groups.setdefault((j.how, t.truncates(j), j.truncation_side, t.chunks(j)), []).append(j)
        for (how, truncate, side, chunk), group in groups.items():
            try:
                rows = (t.tokenize_windows(group) if chunk
                        else t.tokenize_group(how, group, truncate, side))
                for job, seqs in zip(group, rows):
                    tokenized[id(job)] = seqs
            except Exception as e:  # a tokenizer error fails these jobs only
                for job in group:
                    tokenized.pop(id(job), None)
                    failed.add(id(job))
                    self._fail_unqueued(job, e)
        now = time.perf_counter()
        out: list[_Seq] = []
        for job in jobs:
            seqs = tokenized.get(id(job))
            if seqs is None:
                if job.cancelled and id(job) not in failed:
                    self._fail_unqueued(job, asyncio.CancelledError())
                continue
            error = t.check_lengths(job.how, seqs, t.truncates(job) or t.chunks(job))
            if error is not None:
                self._fail_unqueued(job, error)
                continue
            queued = self._queued(job, seqs, now)
            if len(queued) != len(job):  # windows: each is a row to write and an input queued
                with self._lock:
                    self._waiting += len(queued) - len(job)
            out.extend(queued)
        return out

    def _queued(self, job: Job, seqs: list, now: float) -> list[_Seq]:
        """A tokenized job's forward-queue entries (its rows [(slot, ids, types, weight)])."""
        job.tokens = sum(len(ids) for _, ids, _, _ in seqs)
        if self.tokenizer.chunks(job):  # windows: each is a row to write and an input queued
            job._chunks = (np.zeros((len(job), self.hidden_size)), np.zeros(len(job)))
            job._remaining = len(seqs)
        return [_Seq(job, slot, ids, types, now, weight, _unattended_from(job, slot, len(ids)))
                for slot, ids, types, weight in seqs]

    # ---- the forward threads -----------------------------------------------------------------
    def _forward_loop(self, enc: "Encoder") -> None:
        gpu = None
        if enc.device.startswith("cuda"):
            import torch

            gpu = torch.device(enc.device)
        while True:
            with self._cond:
                batch = self._next_batch()
            if batch is None:
                return
            try:
                self._run(enc, batch, gpu)
                continue
            except BaseException as e:  # the forward's jobs end with the error; the thread goes on
                error = self._forward_failed(enc, batch, e)
            # Out of the except block, the error's traceback (the forward's frames and their device
            # tensors) is gone: nothing of the failed forward is held while its jobs answer.
            if self.metrics is not None:  # counted before any client hears of it
                self.metrics.on_forward_error("out_of_memory" if error.out_of_memory else "other")
            for job in {id(s.job): s.job for s in batch}.values():
                self._fail(job, error)
            if error.out_of_memory and gpu is not None:
                import torch

                # Hand torch's cached blocks back to the device, for the next forward and whatever
                # else allocates there; never at the cost of the thread (later jobs would hang).
                try:
                    torch.cuda.empty_cache()
                except Exception:  # noqa: BLE001 - the next forward reports a device that is broken
                    pass

    def _forward_failed(self, enc: "Encoder", batch: list[_Seq], e: BaseException) -> "ForwardFailed":
        """The error a failed forward's jobs end with (plain values, no traceback), logged once."""
        oom = is_out_of_memory(e)
        error = ForwardFailed(oom, f"{type(e).__name__}: {e}", str(enc.device), len(batch),
                              sum(len(s.ids) for s in batch))
        what = (f"ftbert serve: a forward on {error.device} of {_count(error.inputs, 'input')} "
                f"({_count(error.tokens, 'token')}) "
                f"{'ran out of memory' if oom else 'failed'}: {error.cause}; its requests answer "
                f"{503 if oom else 500}, the server goes on")
        if oom:  # the batch's size is the story; a traceback adds nothing
            log.warning("%s", what)
        else:
            log.error("%s", what, exc_info=e)
        return error

    def _fits(self) -> int:
        """How many inputs from the head of the queue make one batch within the budget."""
        budget, most = self.settings.max_batch_tokens, self.settings.max_batch_size
        n, longest = 0, 0
        for seq in self._queue:
            length = len(seq.ids)
            if n and (n == most or (n + 1) * max(longest, length) > budget):
                break
            n, longest = n + 1, max(longest, length)
        return n

    def _next_batch(self) -> list[_Seq] | None:
        """Called holding _cond. Waits for inputs, then for a full batch or the oldest input's
        max_wait, and takes the batch from the queue; None once every input has been taken and
        the tokenizer thread has ended."""
        max_wait = self.settings.max_wait_ms / 1e3
        while True:
            while self._queue and self._queue[0].job.cancelled:
                self._drop(self._queue.popleft())
            if not self._queue:
                if self._tokenized_all:
                    return None
                self._cond.wait()
                continue
            n = self._fits()
            left = self._queue[0].arrived + max_wait - time.perf_counter()
            # A full batch, closing, or the oldest input has waited long enough: take it.
            if n < len(self._queue) or self._closing or left <= 0:
                taken = [self._queue.popleft() for _ in range(n)]
                with self._lock:
                    self._waiting -= n
                batch = [s for s in taken if not s.job.cancelled]
                for s in taken:
                    if s.job.cancelled:
                        self._settle(s.job, None, asyncio.CancelledError())
                if batch:
                    return batch
                continue
            self._cond.wait(left)

    def _run(self, enc: "Encoder", batch: list[_Seq], gpu) -> None:
        import torch

        t0 = time.perf_counter()
        # Inputs with unattended tokens run padded, beside the packed forward of the others.
        unattended = [i for i, s in enumerate(batch) if s.attended is not None]
        at = {i: j for j, i in enumerate(i for i, s in enumerate(batch) if s.attended is None)}  # row in `packed`
        rows = _unattended_rows(enc, batch, unattended) if unattended else {}
        tokens = sum(len(batch[i].ids) for i in unattended)
        emb = raw = logits = None
        if at:
            sub = [batch[i] for i in at]
            packed = pack_sequences([s.ids for s in sub], [s.types for s in sub])
            res, offsets = forward_packed_batch(enc, packed, gpu)
            tokens += int(packed.cu_seqlens[-1])
            if any(s.job.kind == EMBED for s in sub):
                # Pooled, then normalized as pool_packed would: the same bits as encode()'s.
                pooled = pool_packed(res.last_hidden_state, res.pooler_output, offsets, self.pooling, False)
                emb = torch.nn.functional.normalize(pooled, p=2, dim=1).cpu().numpy()
                if any(s.job.kind == EMBED and (not s.job.normalize or s.weight is not None) for s in sub):
                    raw = pooled.cpu().numpy()
            if any(s.job.kind == SCORE for s in sub):
                logits = torch.as_tensor(res.logits).float().cpu().numpy()
            head_rows = _head_rows(enc, sub, res.last_hidden_state, packed.cu_seqlens)  # SPARSE, MULTIVECTOR
            rows.update({i: head_rows[j] for i, j in at.items() if j in head_rows})
        forward_s = time.perf_counter() - t0
        if self.metrics is not None:
            self.metrics.on_batch(len(batch), tokens, t0 - min(s.arrived for s in batch), forward_s)
        # The batch's jobs are resolved together, one wake-up of each event loop per forward rather
        # than one per job (posted in `finally`: a job marked settled is never left unresolved).
        settled: list = []
        try:
            for i, s in enumerate(batch):
                job = s.job
                if job._settled:  # failed in another forward meanwhile
                    continue
                if job.kind in OUTPUT_HEADS:
                    job._out[s.slot] = rows[i]
                elif s.weight is None:
                    job._out[s.slot] = (emb if job.normalize else raw)[at[i]] if job.kind == EMBED else logits[at[i]]
                with self._lock:
                    if s.weight is not None:  # a window: into its text's weighted sum
                        job._chunks[0][s.slot] += raw[at[i]] * s.weight
                        job._chunks[1][s.slot] += s.weight
                    job._remaining -= 1
                    last = job._remaining == 0
                if last:
                    if job._chunks is not None:
                        job._out[:] = _combine_windows(*job._chunks, job.normalize)
                    finite = _finite_rows(job)
                    if finite.all():
                        self._settle(job, JobResult(job._out, job.tokens), None, settled)
                    else:
                        self._settle(job, None, NonFiniteOutput(int(np.argmin(finite))), settled)
        finally:
            self._resolve(settled)

    def _drop(self, seq: _Seq) -> None:
        """A queued input of a cancelled or failed job, taken out unforwarded (holding _cond)."""
        with self._lock:
            self._waiting -= 1
        self._settle(seq.job, None, asyncio.CancelledError())

    # ---- resolving jobs ----------------------------------------------------------------------
    def _fail_unqueued(self, job: Job, error: BaseException) -> None:
        """Ends a job that failed before any of its inputs was queued (in the tokenizer thread)."""
        with self._lock:
            self._waiting -= len(job)
        self._settle(job, None, error)

    def _fail(self, job: Job, error: BaseException) -> None:
        """Ends a job whose forward failed; its inputs still queued are dropped, unforwarded."""
        job.cancelled = True
        self._settle(job, None, error)

    def _settle(self, job: Job, result: JobResult | None, error: BaseException | None,
                settled: list | None = None) -> None:
        """Resolves the job's future on its loop, once: later calls for the same job do nothing.
        With `settled`, the resolution is added to it, for `_resolve` to post with others."""
        with self._lock:
            if job._settled:
                return
            job._settled = True
            self.finished += 1
        if settled is None:
            self._resolve([(job, result, error)])
        else:
            settled.append((job, result, error))

    @staticmethod
    def _resolve(settled: list) -> None:
        """Sets the jobs' futures, one call_soon_threadsafe per event loop."""
        by_loop: dict = {}
        for job, result, error in settled:
            by_loop.setdefault(job._loop, []).append((job._future, result, error))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_set_futures, items)
            except RuntimeError:  # the loop has closed: nobody waits for these jobs any more
                pass


def _set_futures(items: list) -> None:
    for fut, result, error in items:
        if fut.done():  # cancelled by the caller meanwhile
            continue
        if error is None:
            fut.set_result(result)
        else:
            fut.set_exception(error)


def _mark_cancelled(job: Job) -> Callable[[asyncio.Future], None]:
    def done(fut: asyncio.Future) -> None:
        if fut.cancelled():
            job.cancelled = True

    return done


def _combine_windows(sums: np.ndarray, weights: np.ndarray, normalize: bool) -> np.ndarray:
    """Each text's embedding from its windows' weighted sum (float64 [n, H]) and total weight
    [n]: their mean, normalized if asked, as encode(long_texts="chunk") combines them."""
    out = sums / weights[:, None]
    if normalize:
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
    return out.astype(np.float32)


def _unattended_from(job: Job, slot: int, length: int) -> int | None:
    """The input's attended count where some of its (possibly truncated) tokens are unattended."""
    if job.attended is None or job.attended[slot] >= length:
        return None
    return job.attended[slot]


def _unattended_rows(enc: "Encoder", batch: list[_Seq], picks: list[int]) -> dict[int, np.ndarray]:
    """The MULTIVECTOR rows of the inputs `picks` of `batch` that have unattended tokens, from
    padded forwards (Encoder.multivector_from_sequences: calls with padded=True), by place in batch."""
    from ..encoder import ColbertSequence

    rows: dict[int, np.ndarray] = {}
    for normalize in sorted({batch[i].job.normalize for i in picks}):
        group = [i for i in picks if batch[i].job.normalize == normalize]
        seqs = [ColbertSequence(batch[i].ids, batch[i].types, batch[i].attended, None) for i in group]
        rows.update(zip(group, enc.multivector_from_sequences(seqs, normalize)))
    return rows


def _head_rows(enc: "Encoder", batch: list[_Seq], hidden, cu_seqlens: np.ndarray) -> dict[int, object]:
    """The SPARSE and MULTIVECTOR rows of a forward, by the input's place in `batch`: each kind's
    inputs' hidden states (hidden [T, H] packed, cu_seqlens [B + 1]) through the encoder's head,
    the other inputs' left out."""
    rows: dict[int, object] = {}
    for kind in OUTPUT_HEADS:
        picks = [i for i, s in enumerate(batch) if s.job.kind == kind]
        if not picks:
            continue
        sub_hidden, sub_cu = _select_sequences(hidden, cu_seqlens, picks)
        if kind == SPARSE:
            # One pass at the largest top_k asked (all values if any job wants all), each job's cut after.
            ks = [batch[i].job.top_k for i in picks]
            got = enc.sparse_from_packed(sub_hidden, sub_cu, top_k=None if None in ks else max(ks))
            for i, (idx, val) in zip(picks, got):
                k = batch[i].job.top_k
                rows[i] = (idx, val) if k is None else keep_top_k(idx, val, k)
        else:
            for normalize in sorted({batch[i].job.normalize for i in picks}):
                group = [j for j, i in enumerate(picks) if batch[i].job.normalize == normalize]
                h, cu = _select_sequences(sub_hidden, sub_cu, group)  # all of them: as they are
                for j, vectors in zip(group, enc.multivector_from_packed(h, cu, normalize)):
                    rows[picks[j]] = vectors
    return rows


def _select_sequences(hidden, cu_seqlens: np.ndarray, picks: list[int]):
    """Sequences `picks` of a packed output (hidden [T, H], cu_seqlens [B + 1]) as a packed output
    of their own: (hidden [T', H], cu_seqlens [len(picks) + 1])."""
    import torch

    cu = np.asarray(cu_seqlens, dtype=np.int64)
    if len(picks) == len(cu) - 1:
        return hidden, cu
    lengths = np.diff(cu)[picks]
    tokens = np.concatenate([np.arange(cu[i], cu[i + 1]) for i in picks]) if picks else np.zeros(0, np.int64)
    hidden = torch.as_tensor(hidden)
    sub = hidden[torch.from_numpy(tokens).to(hidden.device)]
    return sub, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _finite_rows(job: Job) -> np.ndarray:
    """Whether each of a finished job's rows is finite (bool [N])."""
    if job.kind == SPARSE:
        return np.array([np.isfinite(values).all() for _, values in job._out])
    if job.kind == MULTIVECTOR:
        return np.array([np.isfinite(vectors).all() for vectors in job._out])
    return np.isfinite(job._out).all(axis=1)
