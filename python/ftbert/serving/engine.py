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
(asyncio streams on both sides: no thread per connection, no dependency beyond the standard
library and numpy): JSON, with numpy arrays (token ids, result rows) as raw bytes after it. Nothing
is unpickled, so a frame can only ever be data. A front sends {"op": "job", "id", "job": Job's
arguments, "tokenized": its rows}; the engine answers
{"id", "values", "tokens"} or {"id", "error": (kind, fields)}; {"op": "cancel", "id"} drops a job
whose client went away; {"op": "request", ...} records a finished request in the engine's metrics
(so /metrics counts every front's requests); {"op": "metrics", "id"} returns the metrics' text.

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

from .batcher import (ForwardFailed, InputTooLong, Job, JobResult, JobTokenizer, NoTokens, NonFiniteOutput,
                      QueueFull, ShuttingDown)
from .settings import ServeSettings

log = logging.getLogger("ftbert.serve")

_HEADER = struct.Struct(">I")
# Where the front processes find what they need, set by the main process before uvicorn starts
# them (uvicorn's workers are spawned: they inherit the environment, not Python objects).
FRONT_ENV = "FTBERT_SERVE_FRONT"


def encode(obj) -> bytes:
    """`obj` (JSON values and numpy arrays) as bytes: the JSON's length and text, then each
    array's length and raw bytes, which the JSON names by index. Tuples come back as lists."""
    blobs: list[bytes] = []

    def array(o):
        if isinstance(o, np.ndarray):
            blobs.append(np.ascontiguousarray(o).tobytes())
            return {"__array__": [o.dtype.str, list(o.shape), len(blobs) - 1]}
        if isinstance(o, np.generic):
            return o.item()
        raise TypeError(f"cannot send a {type(o).__name__} to the engine")

    text = json.dumps(obj, default=array, separators=(",", ":")).encode()
    parts = [_HEADER.pack(len(text)), text]
    for b in blobs:
        parts += [_HEADER.pack(len(b)), b]
    return b"".join(parts)


def decode(data: bytes):
    (n,) = _HEADER.unpack_from(data, 0)
    text, at, blobs = data[4:4 + n], 4 + n, []
    while at < len(data):
        (size,) = _HEADER.unpack_from(data, at)
        blobs.append(data[at + 4:at + 4 + size])
        at += 4 + size

    def hook(d: dict):
        spec = d.get("__array__")
        if spec is None or len(d) != 1:
            return d
        dtype, shape, index = spec
        return np.frombuffer(blobs[index], dtype=np.dtype(dtype)).reshape(shape).copy()

    return json.loads(text, object_hook=hook)


async def read_frame(reader: asyncio.StreamReader):
    """The next object on the stream; None once the other side has closed it."""
    try:
        header = await reader.readexactly(_HEADER.size)
        return decode(await reader.readexactly(_HEADER.unpack(header)[0]))
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


def write_frame(writer: asyncio.StreamWriter, obj) -> None:
    data = encode(obj)
    writer.write(_HEADER.pack(len(data)) + data)


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
    from .service import Service

    # Ctrl-C, and SIGTERM where a supervisor signals the whole group (systemd, timeout), reach the
    # engine too: the main process decides when it stops, after the fronts have answered.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        service = Service.load(settings)
    except Exception as e:  # noqa: BLE001 - any failure to load is reported in one line
        control.send_bytes(encode(["error", f"{e}"]))
        return
    try:
        asyncio.run(_serve(service, socket_path, control))
    finally:
        service.close()
        b = service.batcher
        print(f"ftbert serve: engine shut down; {b.accepted} job(s) accepted, {b.finished} answered",
              file=sys.stderr, flush=True)


async def _serve(service, socket_path: str, control) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_control() -> None:  # "stop" from the main process, or its end closed (it died)
        loop.remove_reader(control.fileno())
        stop.set()

    loop.add_reader(control.fileno(), on_control)
    jobs: set[asyncio.Task] = set()

    async def run_job(msg: dict, writer, running: dict) -> None:
        try:
            job = Job(**msg["job"])
            job.tokenized = msg["tokenized"]
            fut = service.batcher.submit(job)
        except Exception as e:  # noqa: BLE001 - refused at once: answered as the batcher's error
            write_frame(writer, {"id": msg["id"], "error": error_fields(e)})
            return
        running[msg["id"]] = fut
        try:
            res = await fut
            reply = {"id": msg["id"], "values": res.values, "tokens": res.tokens}
        except asyncio.CancelledError:
            return  # the front dropped it: nobody waits for an answer
        except Exception as e:  # noqa: BLE001
            reply = {"id": msg["id"], "error": error_fields(e)}
        finally:
            running.pop(msg["id"], None)
        if not writer.is_closing():
            write_frame(writer, reply)

    async def connection(reader, writer) -> None:
        write_frame(writer, {"id": 0, "info": service.info()})  # a restarted engine's own facts
        running: dict[int, asyncio.Future] = {}
        while (msg := await read_frame(reader)) is not None:
            op = msg["op"]
            if op == "job":
                task = loop.create_task(run_job(msg, writer, running))
                jobs.add(task)
                task.add_done_callback(jobs.discard)
            elif op == "cancel":
                fut = running.get(msg["id"])
                if fut is not None:
                    fut.cancel()  # the batcher drops its inputs not yet forwarded
            elif op == "request":
                service.metrics.on_request(*msg["observed"])
            elif op == "metrics":
                write_frame(writer, {"id": msg["id"], "text": service.metrics.render().decode()})
            elif op == "ping":
                write_frame(writer, {"id": msg["id"]})
        # The front went away: its jobs in flight have nobody to answer.
        for fut in list(running.values()):
            fut.cancel()
        writer.close()

    server = await asyncio.start_unix_server(connection, path=socket_path)
    os.chmod(socket_path, 0o600)
    control.send_bytes(encode(["ready", describe(service)]))
    async with server:
        await stop.wait()
        server.close()
        # The fronts have finished their requests before the main process stops the engine; what
        # is still in flight is answered before the batcher closes.
        if jobs:
            await asyncio.wait(list(jobs))


# ---- the front process's view of the engine ---------------------------------------------------
class EngineGone(ShuttingDown):
    """The engine process stopped (the app answers 503, as while shutting down)."""


class RemoteBatcher:
    """Batcher.submit's contract over the engine's socket: a future per job that resolves to its
    JobResult or raises the error the job ended with."""

    def __init__(self, socket_path: str, tokenize, on_info=None):
        self.socket_path = socket_path
        self._tokenize = tokenize  # a job's rows (JobTokenizer.tokenize), run in a thread
        self._on_info = on_info  # called with the engine's info as each connection opens
        self._reconnect_task: asyncio.Task | None = None
        self._detached = False
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task | None = None
        self._pending: dict[int, tuple[Job, asyncio.Future]] = {}
        self._replies: dict[int, asyncio.Future] = {}  # metrics texts and pings
        self._next_id = 0
        self._connecting: asyncio.Lock | None = None
        self.closing = False  # /health: the engine is not reachable (or the front is stopping)
        self.accepted = self.finished = 0

    async def connect(self) -> None:
        if self._writer is not None and not self._writer.is_closing():
            return  # connected: every request passes here
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._writer is not None and not self._writer.is_closing():
                return
            try:
                reader, self._writer = await asyncio.open_unix_connection(self.socket_path)
            except OSError as e:
                self.closing = True
                raise EngineGone(f"the engine process is not running ({e.strerror or e})") from None
            self.closing = False
            self._reader_task = asyncio.get_running_loop().create_task(self._read(reader))

    async def _read(self, reader) -> None:
        while (msg := await read_frame(reader)) is not None:
            if msg["id"] == 0:
                if self._on_info is not None:
                    self._on_info(msg["info"])
                continue
            waiter = self._replies.pop(msg["id"], None)
            if waiter is not None:
                if not waiter.done():
                    waiter.set_result(msg.get("text"))
                continue
            job, fut = self._pending.pop(msg["id"], (None, None))
            if fut is None or fut.done():
                continue
            self.finished += 1
            if "error" in msg:
                fut.set_exception(error_from_fields(msg["error"]))
            else:
                job.tokens = msg["tokens"]
                fut.set_result(JobResult(msg["values"], msg["tokens"]))
        # The engine is gone: every job in flight answers now, never hangs.
        self.closing = True
        self._writer = None
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
        if self._writer is None or self._writer.is_closing():
            raise EngineGone("the engine process stopped; it is being restarted")
        write_frame(self._writer, obj)

    async def submit(self, job: Job) -> JobResult:
        """Tokenizes `job` here (front processes tokenize in parallel; a too long or empty input is
        refused without the engine), sends it and waits for its rows (a coroutine, where
        Batcher.submit returns a future: the app awaits either)."""
        await self.connect()
        loop = asyncio.get_running_loop()
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
        """A finished request, counted in the engine's metrics (dropped while it is unreachable)."""
        with contextlib.suppress(EngineGone):
            self._send({"op": "request", "observed": observed})

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
        return await self._ask("metrics")

    async def ping(self, timeout_s: float = 5.0) -> bool:
        """Whether the engine answers now. A flag alone would lag: a front may answer a request
        before it reads that its connection ended (a killed engine)."""
        if self._detached:
            return False
        try:
            await asyncio.wait_for(self._ask("ping"), timeout_s)
        except (EngineGone, asyncio.TimeoutError):
            return False
        return True

    async def close(self) -> None:
        self._detached = self.closing = True
        if self._writer is not None:
            self._writer.close()
        for task in (self._reader_task, self._reconnect_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


class _RemoteMetrics:
    """The app's metrics calls, forwarded: requests are counted by the engine."""

    def __init__(self, batcher: RemoteBatcher, content_type: str):
        self._batcher, self.content_type = batcher, content_type

    def on_request(self, *observed) -> None:
        self._batcher.observe(*observed)


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
        self._tokenizer_lock = threading.Lock()
        self._job_tokenizer: JobTokenizer | None = None
        self.batcher = RemoteBatcher(socket_path, self._tokenize, on_info=self._engine_info)
        self.metrics = _RemoteMetrics(self.batcher, d["content_type"])

    def _load_tokenizer(self) -> None:
        """The checkpoint's tokenizer, as the engine's encoder loads it (transformers')."""
        with self._tokenizer_lock:
            if self._tokenizer is None:
                from ..tokenization import load_transformers_tokenizer

                self._tokenizer = load_transformers_tokenizer(self.path)
                self._job_tokenizer = JobTokenizer(self._tokenizer, self.settings, self._limits,
                                                   lambda: self._tokenizer_lock)

    def _tokenize(self, job: Job) -> list:
        self._load_tokenizer()
        return self._job_tokenizer.tokenize(job)

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
        return await self.batcher.ping()

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
    return create_app(service=RemoteService(description, socket_path, workers))


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

