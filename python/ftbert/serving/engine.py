"""`ftbert serve --workers N`: one engine process (the encoders, the batcher, the metrics) behind N
front processes (HTTP, validation, JSON), one port.

    main process ── starts the engine process, then uvicorn's N workers on the port; at shutdown
                    (SIGINT/SIGTERM) the workers finish their requests first, then the engine
                    finishes every job it accepted
    engine process ── Service.load, and a Unix socket that takes jobs from the fronts
    front process ── the same app (app.py) over a RemoteService: each job is tokenized here
                    (JobTokenizer, the batcher's own rules), goes to the engine, and its rows
                    come back

The fronts and the engine speak length-prefixed frames over a Unix socket in a private folder
(an asyncio Protocol on both sides: no thread per connection, no dependency beyond the standard
library and numpy): JSON, with numpy arrays (token ids, result rows) as raw bytes after it. Nothing
is unpickled, so a frame can only ever be data. Each side decodes every complete frame of a read at
once and writes the frames of one event-loop turn in one write. A front sends {"op": "job", "id",
"job": Job's arguments, "tokenized": its rows}; the engine answers {"id", "values", "tokens"} or
{"id", "error": (kind, fields)} from the job's future's done-callback (no task per job);
{"op": "cancel", "id"} drops a job whose client went away; {"op": "observed", "observed": [...]}
records finished requests in the engine's metrics (so /metrics counts every front's requests), summed
by the front (metrics.RequestStats) and sent every 50 ms at most; {"op": "metrics", "id"} returns the metrics' text once the engine
has asked every other front for the requests it holds ({"op": "flush", "id"} to the front, which
answers {"op": "observed", ..., "flushed": id}), so the text counts every request answered before.

If the engine process dies, the jobs in flight answer 503 at once, /health answers 503, and the main
process starts a new engine; the fronts connect to it on their next request.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import struct
import sys
import threading
import time

import numpy as np

from .batcher import (ForwardFailed, InputTooLong, Job, JobResult, JobTokenizer, NoTokens, NonFiniteOutput, PAIR,
                      QueueFull, ShuttingDown, TEXT)
from .metrics import RequestStats
from .settings import ServeSettings

log = logging.getLogger("ftbert.serve")

_HEADER = struct.Struct(">I")
# Where the front processes find what they need, set by the main process before uvicorn starts
# them (uvicorn's workers are spawned: they inherit the environment, not Python objects).
FRONT_ENV = "FTBERT_SERVE_FRONT"


def encode(obj) -> bytes:
    """`obj` (JSON values and numpy arrays) as bytes: the JSON's length and text, then each
    array's length and raw bytes, which the JSON names by index. Tuples come back as lists."""
    return b"".join(_encode_parts(obj))


# One encoder and one decoder for every frame (json.dumps / json.loads with options build a new one
# per call); what a call's arrays need (the blobs written, the frame read) is the thread's own.
_frame_state = threading.local()


def _array_out(o):
    if isinstance(o, np.ndarray):
        blobs = _frame_state.blobs_out
        blobs.append(np.ascontiguousarray(o).tobytes())
        return {"__array__": [o.dtype.str, list(o.shape), len(blobs) - 1]}
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(f"cannot send a {type(o).__name__} to the engine")


def _array_in(d: dict):
    spec = d.get("__array__")
    if spec is None or len(d) != 1:
        return d
    dtype, shape, index = spec
    data, blobs = _frame_state.data_in, _frame_state.blobs_in
    offset, size = blobs[index]
    dtype = np.dtype(dtype)
    return np.frombuffer(data, dtype=dtype, count=size // dtype.itemsize, offset=offset).reshape(shape).copy()


_ENCODER = json.JSONEncoder(separators=(",", ":"), default=_array_out, check_circular=False)
_DECODER = json.JSONDecoder()
_ARRAY_DECODER = json.JSONDecoder(object_hook=_array_in)


def _encode_parts(obj) -> list[bytes]:
    blobs: list[bytes] = []
    _frame_state.blobs_out = blobs
    try:
        text = _ENCODER.encode(obj).encode()
    finally:
        _frame_state.blobs_out = None
    parts = [_HEADER.pack(len(text)), text]
    for b in blobs:
        parts += [_HEADER.pack(len(b)), b]
    return parts


def decode(data, start: int = 0, end: int | None = None):
    """The object `encode` gave, from data[start:end] (bytes or a bytearray: arrays are copied
    out of it once, straight into their own memory)."""
    end = len(data) if end is None else end
    (n,) = _HEADER.unpack_from(data, start)
    text, at, blobs = bytes(data[start + 4:start + 4 + n]).decode(), start + 4 + n, []
    while at < end:
        (size,) = _HEADER.unpack_from(data, at)
        blobs.append((at + 4, size))
        at += 4 + size
    if not blobs:
        return _DECODER.decode(text)
    _frame_state.data_in, _frame_state.blobs_in = data, blobs
    try:
        return _ARRAY_DECODER.decode(text)
    finally:
        _frame_state.data_in = _frame_state.blobs_in = None


def frame(obj) -> list[bytes]:
    """`obj` as one frame on the socket: its encoding's length, then the encoding (as parts)."""
    parts = _encode_parts(obj)
    return [_HEADER.pack(sum(map(len, parts)))] + parts


class FrameProtocol(asyncio.Protocol):
    """One end of the socket. Reading: every complete frame in what has arrived is decoded and
    handed to `on_frame` at once (a frame may span reads, a read may hold many frames). Writing:
    frames sent during one turn of the event loop leave in one write at its end, so that a batch's
    replies, or a burst of jobs, cost one system call rather than one each."""

    def __init__(self, on_frame, on_lost=None):
        self._on_frame, self._on_lost = on_frame, on_lost
        self._buffer = bytearray()
        self._outbox: list[bytes] = []
        self.transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()

    @property
    def closing(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self._outbox.clear()
        if self._on_lost is not None:
            self._on_lost(self)

    def data_received(self, data: bytes) -> None:
        buf = self._buffer
        buf += data
        at, end = 0, len(buf)
        try:
            while end - at >= 4:
                (size,) = _HEADER.unpack_from(buf, at)
                if end - at - 4 < size:
                    break
                msg = decode(buf, at + 4, at + 4 + size)
                at += 4 + size
                self._on_frame(msg)
        finally:
            del buf[:at]

    def send(self, obj) -> None:
        """Queues `obj` for this turn's write (dropped if the connection has closed)."""
        if not self._outbox:
            self._loop.call_soon(self.flush)
        self._outbox += frame(obj)

    def flush(self) -> None:
        if self._outbox:
            data = b"".join(self._outbox)
            self._outbox.clear()
            if not self.closing:
                self.transport.write(data)

    def close(self) -> None:
        self.flush()
        if self.transport is not None:
            self.transport.close()


# ---- errors across the socket -----------------------------------------------------------------
def error_fields(e: BaseException) -> tuple:
    """A job's error as plain values: the batcher's own errors by kind, anything else by its text."""
    if isinstance(e, InputTooLong):
        return ("InputTooLong", e.index, e.tokens, e.limit)
    if isinstance(e, NoTokens):
        return ("NoTokens", e.index)
    if isinstance(e, NonFiniteOutput):
        return ("NonFiniteOutput", e.index)
    if isinstance(e, ForwardFailed):  # whether it was an out of memory decides the front's status
        return ("ForwardFailed", e.out_of_memory, e.cause, e.device, e.inputs, e.tokens)
    for kind in (QueueFull, ShuttingDown):
        if isinstance(e, kind):
            return (kind.__name__, str(e))
    if isinstance(e, ValueError):
        return ("ValueError", str(e))
    return ("RuntimeError", f"{type(e).__name__}: {e}")


def error_from_fields(fields: tuple) -> BaseException:
    kind, *rest = fields
    if kind == "InputTooLong":
        return InputTooLong(*rest)
    if kind == "NoTokens":
        return NoTokens(*rest)
    if kind == "NonFiniteOutput":
        return NonFiniteOutput(*rest)
    if kind == "ForwardFailed":
        return ForwardFailed(*rest)
    known = {"QueueFull": QueueFull, "ShuttingDown": ShuttingDown, "ValueError": ValueError}
    return known.get(kind, RuntimeError)(*rest)


# ---- the engine process -----------------------------------------------------------------------
def describe(service) -> dict:
    """What a front needs to answer without the engine: the service's static facts."""
    return {"settings": dataclasses.asdict(service.settings), "model_name": service.model_name, "head": service.head,
            "num_labels": service.num_labels, "labels": service.labels, "hidden_size": service.hidden_size,
            "vocab_size": service.vocab_size, "prompts": service.prompts,
            "task_instruction": service.task_instruction, "info": service.info(),
            "limits": dict(service.batcher.limits), "unavailable": dict(service.batcher.unavailable),
            "path": str(service.path) if service.path else None, "config": service.config,
            "started": service.started, "content_type": service.metrics.content_type}


def run_engine(settings: ServeSettings, socket_path: str, control) -> None:
    """The engine process's body: loads the service, sends ("ready", describe(...)) or ("error",
    message) on `control` (a multiprocessing Connection to the main process), serves the socket
    until the main process says "stop" there (or is gone), then finishes every accepted job and
    prints what it did."""
    from .service import Service, freeze_heap

    # Ctrl-C, and SIGTERM where a supervisor signals the whole group (systemd, timeout), reach the
    # engine too: the main process decides when it stops, after the fronts have answered.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        service = Service.load(settings)
    except Exception as e:  # noqa: BLE001 - any failure to load is reported in one line
        control.send_bytes(encode(["error", f"{e}"]))
        return
    freeze_heap()
    try:
        asyncio.run(_serve(service, socket_path, control))
    finally:
        service.close()
        b = service.batcher
        print(f"ftbert serve: engine shut down; {b.accepted} job(s) accepted, {b.finished} answered",
              file=sys.stderr, flush=True)


class _Connection(FrameProtocol):
    """The engine's end of one front's connection."""

    def __init__(self, engine: "_Engine"):
        super().__init__(self._on_message, self._on_closed)
        self._engine = engine
        self._running: dict[int, asyncio.Future] = {}  # job id -> the batcher's future
        self._flushes: dict[int, asyncio.Future] = {}  # asked the front for its observations
        self._next_flush = 0

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._engine.connections.add(self)
        self.send({"id": 0, "info": self._engine.service.info()})  # a restarted engine's own facts

    def _on_message(self, msg: dict) -> None:
        op = msg["op"]
        if op == "job":
            self._submit(msg)
        elif op == "cancel":
            fut = self._running.get(msg["id"])
            if fut is not None:
                fut.cancel()  # the batcher drops its inputs not yet forwarded
        elif op == "observed":  # finished requests, in the engine's metrics (every front's count)
            if msg["observed"] is not None:
                self._engine.service.metrics.on_requests(msg["observed"])
            waiter = self._flushes.pop(msg.get("flushed"), None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        elif op == "metrics":
            self._engine.answer_metrics(self, msg["id"])
        elif op == "ping":  # with the fronts connected now: /health waits for every one
            self.send({"id": msg["id"], "fronts": len(self._engine.connections)})

    def _submit(self, msg: dict) -> None:
        key = msg["id"]
        try:
            job = Job(**msg["job"])
            job.tokenized = msg["tokenized"]
            fut = self._engine.service.batcher.submit(job)
        except Exception as e:  # noqa: BLE001 - refused at once: answered as the batcher's error
            self.send({"id": key, "error": error_fields(e)})
            return
        self._running[key] = fut
        self._engine.in_flight.add(fut)
        # A callback, not a task per job: the reply is written where the future resolves.
        fut.add_done_callback(lambda f: self._reply(key, f))

    def _reply(self, key: int, fut: asyncio.Future) -> None:
        self._running.pop(key, None)
        self._engine.in_flight.discard(fut)
        if fut.cancelled():
            return  # the front dropped it: nobody waits for an answer
        error = fut.exception()
        if isinstance(error, asyncio.CancelledError):
            return  # (the batcher's word for a job dropped unforwarded)
        self.send({"id": key, "error": error_fields(error)} if error is not None
                  else {"id": key, "values": fut.result().values, "tokens": fut.result().tokens})

    def ask_flush(self) -> asyncio.Future:
        """Asks the front for the requests it has finished and not yet reported; resolves when it
        has sent them (or is gone)."""
        self._next_flush += 1
        waiter = self._loop.create_future()
        self._flushes[self._next_flush] = waiter
        self.send({"op": "flush", "id": self._next_flush})
        return waiter

    def _on_closed(self, _) -> None:
        self._engine.connections.discard(self)
        # The front went away: its jobs in flight have nobody to answer.
        for fut in list(self._running.values()):
            fut.cancel()
        for waiter in self._flushes.values():
            if not waiter.done():
                waiter.set_result(None)
        self._flushes.clear()


class _Engine:
    # How long /metrics waits for the other fronts' unreported requests (a hung front's are left out).
    FLUSH_WAIT_S = 2.0

    def __init__(self, service):
        self.service = service
        self.connections: set[_Connection] = set()
        self.in_flight: set[asyncio.Future] = set()
        self._tasks: set[asyncio.Task] = set()

    def answer_metrics(self, asker: _Connection, key: int) -> None:
        """The metrics' text, once every other front has reported the requests it finished (the
        asking front sent its own before asking): /metrics counts every request answered before it."""
        waits = [c.ask_flush() for c in self.connections if c is not asker]

        async def answer() -> None:
            if waits:
                await asyncio.wait(waits, timeout=self.FLUSH_WAIT_S)
            asker.send({"id": key, "text": self.service.metrics.render().decode()})

        task = asyncio.get_running_loop().create_task(answer())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self, timeout_s: float = 10.0) -> None:
        """Every job in flight answered and its reply handed to the socket."""
        while self.in_flight:
            await asyncio.wait(list(self.in_flight))
        await asyncio.sleep(0)  # the replies' callbacks, then their writes
        deadline = time.monotonic() + timeout_s
        for c in list(self.connections):
            c.flush()
            while not c.closing and c.transport.get_write_buffer_size() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)


async def _serve(service, socket_path: str, control) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_control() -> None:  # "stop" from the main process, or its end closed (it died)
        loop.remove_reader(control.fileno())
        stop.set()

    loop.add_reader(control.fileno(), on_control)
    engine = _Engine(service)
    server = await loop.create_unix_server(lambda: _Connection(engine), path=socket_path)
    os.chmod(socket_path, 0o600)
    control.send_bytes(encode(["ready", describe(service)]))
    async with server:
        await stop.wait()
        server.close()
        # The fronts have finished their requests before the main process stops the engine; what
        # is still in flight is answered before the batcher closes.
        await engine.drain()
        for c in list(engine.connections):
            c.close()


# ---- the front process's view of the engine ---------------------------------------------------
class EngineGone(ShuttingDown):
    """The engine process stopped (the app answers 503, as while shutting down)."""


class RemoteBatcher:
    """Batcher.submit's contract over the engine's socket: a future per job that resolves to its
    JobResult or raises the error the job ended with."""

    # Finished requests wait this long at most before they go to the engine's metrics in one frame
    # (or until OBSERVED_BATCH of them wait); /metrics asks every front for its own first.
    OBSERVED_FLUSH_S = 0.05
    OBSERVED_BATCH = 512

    def __init__(self, socket_path: str, tokenize, on_info=None, tokenize_now=None):
        self.socket_path = socket_path
        self._tokenize = tokenize  # a job's rows (JobTokenizer.tokenize), run in a thread
        # A job's rows on the event loop where that is cheaper than the hand-off, else None.
        self._tokenize_now = tokenize_now or (lambda job: None)
        self._on_info = on_info  # called with the engine's info as each connection opens
        self._reconnect_task: asyncio.Task | None = None
        self._detached = False
        self._conn: FrameProtocol | None = None
        self._pending: dict[int, tuple[Job, asyncio.Future]] = {}
        self._replies: dict[int, asyncio.Future] = {}  # metrics texts and pings
        self._observed = RequestStats()  # finished requests not yet sent to the engine, summed
        self._observed_n = 0
        self._observed_timer: asyncio.TimerHandle | None = None
        self._next_id = 0
        self._connecting: asyncio.Lock | None = None
        self.closing = False  # /health: the engine is not reachable (or the front is stopping)
        self.accepted = self.finished = 0

    async def connect(self) -> None:
        if self._conn is not None and not self._conn.closing:
            return  # connected: every request passes here
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._conn is not None and not self._conn.closing:
                return
            loop = asyncio.get_running_loop()
            try:
                _, conn = await loop.create_unix_connection(lambda: FrameProtocol(self._on_frame, self._on_lost),
                                                            self.socket_path)
            except OSError as e:
                self.closing = True
                raise EngineGone(f"the engine process is not running ({e.strerror or e})") from None
            if conn.closing:  # lost already (on_lost ignored it: not ours yet)
                self.closing = True
                raise EngineGone("the engine process closed the connection")
            self.closing = False
            self._conn = conn

    def _on_frame(self, msg: dict) -> None:
        key = msg["id"]
        if key == 0:
            if self._on_info is not None:
                self._on_info(msg["info"])
            return
        if msg.get("op") == "flush":  # the engine renders /metrics: our finished requests first
            self._send_observed(flushed=key)
            return
        waiter = self._replies.pop(key, None)
        if waiter is not None:
            if not waiter.done():
                waiter.set_result(msg)
            return
        job, fut = self._pending.pop(key, (None, None))
        if fut is None or fut.done():
            return
        self.finished += 1
        if "error" in msg:
            fut.set_exception(error_from_fields(msg["error"]))
        else:
            job.tokens = msg["tokens"]
            fut.set_result(JobResult(msg["values"], msg["tokens"]))

    def _on_lost(self, conn: FrameProtocol) -> None:
        if conn is not self._conn:
            return  # a connection given up on before it was ours
        # The engine is gone: every job in flight answers now, never hangs.
        self.closing = True
        self._conn = None
        gone = EngineGone("the engine process stopped; it is being restarted")
        for _, fut in self._pending.values():
            if not fut.done():
                fut.set_exception(gone)
        for fut in self._replies.values():
            if not fut.done():
                fut.set_exception(gone)
        self._pending.clear()
        self._replies.clear()
        if not self._detached:  # the main process starts a new engine: be connected when it serves
            self._reconnect_task = asyncio.get_running_loop().create_task(self._reconnect())

    async def _reconnect(self, every_s: float = 0.25) -> None:
        while not self._detached and self.closing:
            with contextlib.suppress(EngineGone):
                await self.connect()
            if self.closing:
                await asyncio.sleep(every_s)

    def _send(self, obj) -> None:
        if self._conn is None or self._conn.closing:
            raise EngineGone("the engine process stopped; it is being restarted")
        self._conn.send(obj)

    async def submit(self, job: Job) -> JobResult:
        """Tokenizes `job` here (front processes tokenize in parallel; a too long or empty input is
        refused without the engine), sends it and waits for its rows (a coroutine, where
        Batcher.submit returns a future: the app awaits either)."""
        await self.connect()
        loop = asyncio.get_running_loop()
        tokenized = self._tokenize_now(job)
        if tokenized is None:
            tokenized = await loop.run_in_executor(None, self._tokenize, job)
        self._next_id += 1
        key = self._next_id
        fut = loop.create_future()
        self._pending[key] = (job, fut)
        self._send({"op": "job", "id": key, "tokenized": tokenized, "job": {
            "kind": job.kind, "how": job.how, "inputs": job.inputs, "normalize": job.normalize,
            "truncate": job.truncate, "truncation_side": job.truncation_side, "long_texts": job.long_texts,
            "top_k": job.top_k, "attended": job.attended}})
        self.accepted += 1
        try:
            return await fut
        except asyncio.CancelledError:  # the client went away: the engine drops the job's inputs
            self._pending.pop(key, None)
            with contextlib.suppress(EngineGone):
                self._send({"op": "cancel", "id": key})
            raise

    def observe(self, *observed) -> None:
        """A finished request, for the engine's metrics: sent with others within OBSERVED_FLUSH_S,
        or when the engine asks (dropped while it is unreachable)."""
        self._observed.add(*observed)
        self._observed_n += 1
        if self._observed_n >= self.OBSERVED_BATCH:
            self._send_observed()
        elif self._observed_timer is None:
            self._observed_timer = asyncio.get_running_loop().call_later(self.OBSERVED_FLUSH_S, self._send_observed)

    def _send_observed(self, flushed: int | None = None) -> None:
        """Sends the finished requests not yet reported; `flushed`: the engine's flush request
        this answers (answered even with none)."""
        if self._observed_timer is not None:
            self._observed_timer.cancel()
            self._observed_timer = None
        if not self._observed and flushed is None:
            return
        msg = {"op": "observed", "observed": self._observed.take() if self._observed else None}
        self._observed_n = 0
        if flushed is not None:
            msg["flushed"] = flushed
        with contextlib.suppress(EngineGone):
            self._send(msg)

    async def _ask(self, op: str):
        """Sends `op` and waits for the engine's reply to it (EngineGone if the engine goes)."""
        await self.connect()
        self._next_id += 1
        key = self._next_id
        fut = asyncio.get_running_loop().create_future()
        self._replies[key] = fut
        try:
            self._send({"op": op, "id": key})
            return await fut
        finally:  # answered, or given up on (a ping's timeout): nothing left waiting
            self._replies.pop(key, None)

    async def metrics_text(self) -> str:
        await self.connect()
        self._send_observed()  # ours first, on the same connection: counted before the text is made
        return (await self._ask("metrics"))["text"]

    async def ping(self, timeout_s: float = 5.0) -> int | None:
        """How many fronts the engine has connected, this one included, if it answers now; None
        if not. A flag alone would lag: a front may answer a request before it reads that its
        connection ended (a killed engine)."""
        if self._detached:
            return None
        try:
            return (await asyncio.wait_for(self._ask("ping"), timeout_s))["fronts"]
        except (EngineGone, asyncio.TimeoutError):
            return None

    async def close(self) -> None:
        self._send_observed()  # the last requests this front answered still count
        self._detached = self.closing = True
        if self._conn is not None:
            self._conn.close()
        if self._reconnect_task is not None:
            self._reconnect_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reconnect_task


class _RemoteMetrics:
    """The app's metrics calls, forwarded: requests are counted by the engine."""

    def __init__(self, batcher: RemoteBatcher, content_type: str):
        self._batcher, self.content_type = batcher, content_type

    def on_request(self, *observed) -> None:
        self._batcher.observe(*observed)


# The largest job (characters, or token ids) a front tokenizes on its event loop rather than in a
# thread: about 500 tokens, some 0.2 ms of the loop.
INLINE_TOKENIZE_CHARS = 2048


def _job_chars(job: Job) -> int:
    """The job's characters (texts, both texts of pairs) or token ids, counted up to just past
    INLINE_TOKENIZE_CHARS."""
    n = 0
    for x in job.inputs:
        n += len(x[0]) + len(x[1]) if job.how == PAIR else len(x)
        if n > INLINE_TOKENIZE_CHARS:
            break
    return n


class RemoteService:
    """Service's face for the app in a front process: facts from the engine's description, jobs
    and metrics through the engine's socket, the tokenizer (for /tokenize) loaded here."""

    def __init__(self, description: dict, socket_path: str, workers: int):
        d = description
        self.settings = ServeSettings(**d["settings"])
        self.model_name, self.head, self.num_labels = d["model_name"], d["head"], d["num_labels"]
        self.labels, self.hidden_size, self.vocab_size = d["labels"], d["hidden_size"], d["vocab_size"]
        self.prompts, self.config, self.path, self.started = d["prompts"], d["config"], d["path"], d["started"]
        self.task_instruction = d["task_instruction"]
        self._workers = workers
        self._info = {**d["info"], "workers": workers}
        self._limits = d["limits"]
        self._unavailable = d.get("unavailable", {})
        self._tokenizer = None
        # Reentrant: _tokenize_now holds it around JobTokenizer, which takes it too.
        self._tokenizer_lock = threading.RLock()
        self._job_tokenizer: JobTokenizer | None = None
        self.batcher = RemoteBatcher(socket_path, self._tokenize, on_info=self._engine_info,
                                     tokenize_now=self._tokenize_now)
        self.metrics = _RemoteMetrics(self.batcher, d["content_type"])

    def _load_tokenizer(self) -> None:
        """The checkpoint's tokenizer, as the engine's encoder loads it (transformers')."""
        with self._tokenizer_lock:
            if self._tokenizer is None:
                from ..tokenization import load_transformers_tokenizer, server_tokenizer

                tokenizer = load_transformers_tokenizer(self.path)
                fast = server_tokenizer(self.path, self._limits[TEXT], tokenizer)
                job_tokenizer = JobTokenizer(tokenizer, self.settings, self._limits,
                                             lambda: self._tokenizer_lock, fast=fast)
                job_tokenizer.warm_up()
                # Both set once it is warm (_tokenize_now reads the second without the lock).
                self._tokenizer, self._job_tokenizer = tokenizer, job_tokenizer

    def _tokenize(self, job: Job) -> list:
        self._load_tokenizer()
        return self._job_tokenizer.tokenize(job)

    def _tokenize_now(self, job: Job) -> list | None:
        """The job's rows, tokenized on the calling thread (the event loop), for a job of at most
        INLINE_TOKENIZE_CHARS characters with the tokenizer loaded and free: a short text takes
        about 50 µs to tokenize, and the hand-off to a thread and back about 140 µs more. None
        otherwise (the caller hands the job to a thread); a job's error raises as there."""
        if self._job_tokenizer is None or _job_chars(job) > INLINE_TOKENIZE_CHARS:
            return None
        if not self._tokenizer_lock.acquire(blocking=False):  # /tokenize or a long job holds it
            return None
        try:
            return self._job_tokenizer.tokenize(job)
        finally:
            self._tokenizer_lock.release()

    def _engine_info(self, info: dict) -> None:
        self._info = {**info, "workers": self._workers}

    def info(self) -> dict:
        return dict(self._info)

    def routes(self) -> list[str]:
        return list(self._info["routes"])

    def output_unavailable(self, kind: str) -> str | None:
        return self._unavailable.get(kind, f"the engine did not say whether it runs {kind} outputs")

    def score_activation(self):
        from ..cross_encoder import auto_activation

        return auto_activation(self.config, self.num_labels)

    @contextlib.contextmanager
    def tokenizer(self):
        self._load_tokenizer()
        with self._tokenizer_lock:
            yield self._tokenizer

    async def metrics_text(self) -> str:
        return await self.batcher.metrics_text()

    async def healthy(self) -> bool:
        """The engine answers, and every front has loaded its tokenizer and connected to it. The
        fronts start side by side and some take seconds longer than others; a client that
        connected while only a few accepted would keep its connections on those few."""
        fronts = await self.batcher.ping()
        return fronts is not None and fronts >= self._workers

    async def attach(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._load_tokenizer)
        with contextlib.suppress(EngineGone):  # /health says so until the engine answers
            await self.batcher.connect()

    async def detach(self) -> None:
        await self.batcher.close()


def front_environment(description: dict, socket_path: str, workers: int) -> str:
    return json.dumps([description, socket_path, workers])


def create_front_app():
    """uvicorn's app factory in each front process (FRONT_ENV names the engine)."""
    from .app import create_app

    description, socket_path, workers = json.loads(os.environ[FRONT_ENV])
    return create_app(service=RemoteService(description, socket_path, workers), freeze_heap=True)


# ---- the main process -------------------------------------------------------------------------
class EngineSupervisor:
    """Starts the engine process, restarts it if it dies while serving, stops it at the end."""

    def __init__(self, settings: ServeSettings, socket_path: str):
        import multiprocessing

        self.settings, self.socket_path = settings, socket_path
        self._ctx = multiprocessing.get_context("spawn")  # CUDA does not survive fork
        self.process = None
        self._control = None  # the pipe to the engine: its "ready", our "stop"
        self.restarts = 0
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None

    def start(self, timeout: float = 600.0) -> dict:
        """Starts the engine and waits until it serves; returns its description. Raises
        RuntimeError with the engine's message if it cannot load."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        parent, child = self._ctx.Pipe()
        self.process = self._ctx.Process(target=run_engine, args=(self.settings, self.socket_path, child),
                                         name="ftbert-serve-engine", daemon=False)
        self.process.start()
        child.close()
        self._control = parent
        deadline = time.monotonic() + timeout
        while not parent.poll(0.2):
            if not self.process.is_alive():
                raise RuntimeError(f"the engine process ended with status {self.process.exitcode} before serving")
            if time.monotonic() > deadline:
                self.process.kill()
                raise RuntimeError(f"the engine process did not start within {timeout:.0f} s")
        try:
            status, payload = decode(parent.recv_bytes())
        except EOFError:
            status, payload = "error", f"the engine process ended with status {self.process.join() or self.process.exitcode}"
        if status != "ready":
            self.process.join()
            raise RuntimeError(payload)
        return payload

    def watch(self) -> None:
        """Restarts the engine whenever it ends while serving (in a thread of its own)."""
        def loop() -> None:
            while not self._stopping.is_set():
                self.process.join(0.5)
                if self.process.is_alive() or self._stopping.is_set():
                    continue
                log.error("ftbert serve: the engine process ended (status %s); starting a new one",
                          self.process.exitcode)
                print(f"ftbert serve: the engine process ended (status {self.process.exitcode}); "
                      "starting a new one", file=sys.stderr, flush=True)
                try:
                    self.start()
                    self.restarts += 1
                except RuntimeError as e:
                    print(f"ftbert serve: the engine could not be restarted: {e}", file=sys.stderr, flush=True)
                    return

        self._watcher = threading.Thread(target=loop, name="ftbert-serve-engine-watch", daemon=True)
        self._watcher.start()

    def stop(self, timeout: float | None = None) -> int | None:
        """Tells the engine to stop: it answers what it accepted, then exits. Returns its status."""
        self._stopping.set()
        if self._watcher is not None:
            self._watcher.join()
        if self.process is not None and self.process.is_alive():
            with contextlib.suppress(OSError):
                self._control.send_bytes(b"stop")
            self.process.join(timeout)
        return None if self.process is None else self.process.exitcode

