"""`ftbert serve [MODEL]`: the app under uvicorn in this process, or under Ray Serve with --ray.

    ftbert serve                                  # bundled all-MiniLM-L6-v2 on the CPU, port 8000
    ftbert serve MODEL --device cuda --dtype float16 --port 8080
    ftbert serve MODEL --devices cuda:0,cuda:1    # one encoder and forward thread per GPU
    ftbert serve MODEL --device cuda --workers 8  # 8 front processes before one engine process
    ftbert serve MODEL --ray --replicas 4 --gpus-per-replica 1

Shutdown (Ctrl-C, SIGTERM): uvicorn stops accepting connections, finishes the requests in flight,
then the app drains the batcher; the last line printed counts the requests accepted and answered.
As uvicorn does, the process then ends by the signal that stopped it (status 128 + signal).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import math
import os
import socket
import sys
from pathlib import Path

from .settings import ServeSettings

DTYPES = ("float32", "float16", "bfloat16")
# Seconds a front process may miss uvicorn's health ping before its supervisor kills it (--workers).
FRONT_HEALTHCHECK_S = 60


# Fronts that paid on a 16-core H100 host (MiniLM float16, the load generator on the same cores):
# 8 gave what 10 and 12 gave, 6 and 4 less (docs/serving.md).
FRONTS_PER_GPU = 8


def default_workers(devices: str, cores: int | None = None) -> int:
    """--workers when not given, for `devices` (the --device value) on `cores` cores (default:
    usable_cores())."""
    gpus = sum(1 for d in devices.split(",") if d.strip().startswith("cuda"))
    if not gpus:
        return 1
    if cores is None:
        cores = usable_cores()
    return max(1, min(cores // 2, FRONTS_PER_GPU * gpus))


def usable_cores(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """The cores this process may run on (its CPU affinity), at most its cgroup's CPU quota rounded
    up: a container limited to 2 CPUs still sees every core of the host in its affinity."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cgroup_cpu_quota(cgroup)
    return max(1, min(cores, quota)) if quota is not None else cores


def cgroup_cpu_quota(cgroup: Path) -> int | None:
    """CPUs the cgroup's quota allows, rounded up (cgroup v2's cpu.max, else v1's cpu.cfs_quota_us
    over cpu.cfs_period_us); None without a quota or where none can be read."""
    try:
        if (cgroup / "cpu.max").exists():
            quota, period = (cgroup / "cpu.max").read_text().split()[:2]
        else:
            quota = (cgroup / "cpu" / "cpu.cfs_quota_us").read_text().strip()
            period = (cgroup / "cpu" / "cpu.cfs_period_us").read_text().strip()
        if quota == "max" or int(quota) <= 0:
            return None
        return max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError, ZeroDivisionError):
        return None


def build_parser() -> argparse.ArgumentParser:
    d = ServeSettings()
    p = argparse.ArgumentParser(prog="ftbert serve", description=(
        "Serve an encoder over HTTP: POST /v1/embeddings (OpenAI-compatible), /rerank, /classify; "
        "GET /health, /info, /metrics. Requests are batched dynamically by a token budget."))
    p.add_argument("model", nargs="?", help="HF or converted checkpoint dir (default: bundled all-MiniLM-L6-v2)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for all)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--workers", type=int,
                   help="front processes (HTTP, validation, JSON) on the port, before one engine process "
                        "that batches and runs the forwards (engine.py); 1: all in this process. Default: "
                        f"on GPUs half the cores this process may use (its CPU quota counted), at most "
                        f"{FRONTS_PER_GPU} a GPU; "
                        "on the CPU 1 (its forwards need the cores)")
    p.add_argument("--device", "--devices", dest="devices", default="cpu",
                   help="cpu, cuda, cuda:N, or a comma-separated list (one encoder and forward thread each)")
    p.add_argument("--dtype", default="float32", choices=DTYPES)
    p.add_argument("--attention", default="auto", choices=["auto", "unfused", "flash"])
    p.add_argument("--pooling", choices=["mean", "cls", "pooler"], help="default: the checkpoint's, else mean")
    p.add_argument("--model-name", help="the model name in responses and /info (default: the directory's name)")
    p.add_argument("--no-cuda-graphs", action="store_true",
                   help="run every forward op by op (batches vary in shape; see Encoder.cuda_graphs)")
    p.add_argument("--quantization", choices=["int8", "fp8"],
                   help="int8 weight GEMMs on the CPU, float32 around them; fp8 (e4m3) weight GEMMs on a "
                        "GPU of compute capability 9.0 or later, float16/bfloat16 around them "
                        "(see Encoder.quantization)")
    p.add_argument("--task", help="for a checkpoint with per-task LoRA adapters (Jina-embeddings-v3 as the "
                   "hub holds it): the task whose adapters are merged at load")
    p.add_argument("--batch-invariant", nargs="?", const="on", default="auto", choices=["off", "on", "auto"],
                   help="each input's result the same bits whatever it is batched with: auto (the default: "
                        "where the fast kernels keep it; see Encoder.batch_invariant), on (--batch-invariant "
                        "alone) or off")
    b = p.add_argument_group("dynamic batching")
    b.add_argument("--max-batch-tokens", type=int, default=d.max_batch_tokens,
                   help="tokens per forward, counted as sequences x longest (default %(default)s)")
    b.add_argument("--max-batch-size", type=int, default=d.max_batch_size, help="sequences per forward (default %(default)s)")
    b.add_argument("--max-wait-ms", type=float, default=d.max_wait_ms,
                   help="how long a batch that is not full waits for more inputs (default %(default)s)")
    lim = p.add_argument_group("limits")
    lim.add_argument("--max-queue", type=int, default=d.max_queue,
                     help="inputs queued before requests are refused with 429 (default %(default)s)")
    lim.add_argument("--max-client-batch", type=int, default=d.max_client_batch,
                     help="inputs per request; more is refused with 413 (default %(default)s)")
    lim.add_argument("--max-input-length", type=int, help="tokens per input (default: the model's limit)")
    lim.add_argument("--no-truncate", action="store_true",
                     help="refuse inputs longer than the limit with 413 instead of truncating them")
    lim.add_argument("--long-texts", choices=["truncate", "chunk"], default=d.long_texts,
                     help="texts to embed past the limit: cut them, or embed them in overlapping windows "
                          "combined by a token-weighted mean (default %(default)s)")
    lim.add_argument("--chunk-overlap", type=int, default=d.chunk_overlap,
                     help="tokens consecutive windows share under --long-texts chunk (default %(default)s)")
    lim.add_argument("--max-request-bytes", type=int, default=d.max_request_bytes, help="(default %(default)s)")
    lim.add_argument("--retry-after", type=int, default=d.retry_after_s, help="Retry-After of a 429 or 503, seconds")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    r = p.add_argument_group("Ray Serve (pip install 'ftbert[ray]')")
    r.add_argument("--ray", action="store_true", help="serve through Ray Serve: replicas behind Ray's HTTP proxy")
    r.add_argument("--replicas", type=int, default=1, help="replicas (fixed), default 1")
    r.add_argument("--min-replicas", type=int, help="autoscale from this many replicas ...")
    r.add_argument("--max-replicas", type=int, help="... to this many")
    r.add_argument("--target-ongoing-requests", type=float, default=32,
                   help="autoscaling: requests in flight per replica to aim for (default %(default)s)")
    r.add_argument("--gpus-per-replica", type=float, default=0.0,
                   help="GPUs per replica (fractions share a GPU); 0 runs replicas on the CPU")
    r.add_argument("--cpus-per-replica", type=float, default=1.0)
    r.add_argument("--ray-address", help="an existing Ray cluster (default: start a local one)")
    return p


def settings_from_args(args: argparse.Namespace) -> ServeSettings:
    return ServeSettings(
        model=args.model, model_name=args.model_name, devices=args.devices, dtype=args.dtype,
        attention=args.attention, pooling=args.pooling, cuda_graphs=not args.no_cuda_graphs,
        batch_invariant={"on": True, "off": False, "auto": "auto"}[args.batch_invariant],
        quantization=args.quantization, task=args.task,
        max_batch_tokens=args.max_batch_tokens,
        max_batch_size=args.max_batch_size, max_wait_ms=args.max_wait_ms, max_queue=args.max_queue,
        max_client_batch=args.max_client_batch, max_input_length=args.max_input_length,
        truncate=not args.no_truncate, long_texts=args.long_texts, chunk_overlap=args.chunk_overlap,
        max_request_bytes=args.max_request_bytes, retry_after_s=args.retry_after,
    )


def serve(settings: ServeSettings, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> int:
    """Runs the app under uvicorn until SIGINT/SIGTERM; returns the exit status."""
    import uvicorn

    from .app import create_app
    from .service import Service

    # The model loads before the server starts, so a bad path or option is one line, not a
    # traceback from the app's startup.
    try:
        service = Service.load(settings)
    except (ValueError, RuntimeError, FileNotFoundError, TypeError) as e:
        print(f"ftbert serve: error: {e}", file=sys.stderr)
        return 1
    app = create_app(service=service, close_service=True, freeze_heap=True)
    started = []

    def report(svc) -> None:
        # Printed from the app's shutdown: uvicorn ends the process by re-raising the signal that
        # stopped it, so nothing after server.run() would run.
        b = svc.batcher
        print(f"ftbert serve: shut down; {b.accepted} request(s) accepted, {b.finished} answered",
              file=sys.stderr, flush=True)
        started.append(svc)

    app.state.on_closed = report
    # timeout_graceful_shutdown=None: at shutdown, wait for every request in flight, however long.
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                            timeout_graceful_shutdown=None)
    uvicorn.Server(config).run()
    if not started:  # uvicorn could not start (the port in use, say): it has said why
        service.close()
        return 1
    return 0


def serve_workers(settings: ServeSettings, workers: int, host: str = "127.0.0.1", port: int = 8000,
                  log_level: str = "info") -> int:
    """Runs `workers` front processes under uvicorn and one engine process (engine.py) until
    SIGINT/SIGTERM; the fronts finish their requests, then the engine its jobs. Returns the exit
    status."""
    import os
    import tempfile

    import uvicorn

    from .engine import FRONT_ENV, EngineSupervisor, front_environment

    with tempfile.TemporaryDirectory(prefix="ftbert-serve-") as folder:  # 0700: the socket is private
        engine = EngineSupervisor(settings, os.path.join(folder, "engine.sock"))
        try:
            description = engine.start()
        except RuntimeError as e:
            print(f"ftbert serve: error: {e}", file=sys.stderr)
            return 1
        engine.watch()
        os.environ[FRONT_ENV] = front_environment(description, engine.socket_path, workers)
        # uvicorn's supervisor kills a front that misses its health ping (a thread of the front
        # that needs the GIL) for 5 s by default, losing its requests in flight: on a host whose
        # cores are all busy that can be a front at work, not a hung one. Allow a minute.
        patience = {"timeout_worker_healthcheck": FRONT_HEALTHCHECK_S} if "timeout_worker_healthcheck" in \
            inspect.signature(uvicorn.Config).parameters else {}
        try:
            with nodelay_listening_sockets(uvicorn.Config):
                uvicorn.run("ftbert.serving.engine:create_front_app", factory=True, host=host, port=port,
                            workers=workers, log_level=log_level, lifespan="on",
                            timeout_graceful_shutdown=None, **patience)
        finally:
            status = engine.stop()
        return 0 if status in (0, None) else 1


@contextlib.contextmanager
def nodelay_listening_sockets(config_class):
    """While open, the TCP sockets `config_class.bind_socket` makes (uvicorn's, for its worker
    processes) have TCP_NODELAY, which the connections they accept inherit (Linux). uvicorn makes
    that socket with protocol 0, so asyncio, which sets TCP_NODELAY only on IPPROTO_TCP sockets,
    leaves Nagle's algorithm on: a response's body, written after its headers, then waits for the
    client's delayed ACK, ~40 ms a request. A single process binds through asyncio and has it."""
    bind = config_class.bind_socket

    def bind_socket(self):
        sock = bind(self)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    config_class.bind_socket = bind_socket
    try:
        yield
    finally:
        config_class.bind_socket = bind


def main(argv: list[str]) -> int:
    from . import missing_serve_extra

    parser = build_parser()
    args = parser.parse_args(argv)
    message = missing_serve_extra()
    if message:
        print(f"ftbert serve: {message}", file=sys.stderr)
        return 2
    try:
        settings = settings_from_args(args)
    except ValueError as e:
        parser.error(str(e))
    if args.workers is None:
        args.workers = 1 if args.ray else default_workers(args.devices)
        if args.workers > 1:
            print(f"ftbert serve: {args.workers} front processes before one engine (the default for "
                  f"{args.devices}; --workers sets it)", file=sys.stderr, flush=True)
    if args.workers < 1:
        parser.error(f"--workers must be at least 1, got {args.workers}")
    if args.ray and args.workers != 1:
        parser.error("--workers runs front processes before one engine in this machine; with --ray, "
                     "scale with --replicas (each replica is a process of its own)")
    if args.ray:
        from .ray import run_ray

        return run_ray(settings, args)
    if args.workers > 1:
        return serve_workers(settings, args.workers, args.host, args.port, args.log_level)
    return serve(settings, args.host, args.port, args.log_level)
