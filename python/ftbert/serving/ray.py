"""Scale-out through Ray Serve: the same app (routes, batcher, metrics) in each replica, behind
Ray's HTTP proxy. Needs the `ray` extra (`pip install 'ftbert[ray]'`).

    from ray import serve
    from ftbert.serving import ServeSettings
    from ftbert.serving.ray import build_app

    app = build_app(ServeSettings(model="path/to/checkpoint", dtype="float16"), replicas=4, gpus_per_replica=1)
    # or autoscaling={"min_replicas": 1, "max_replicas": 8, "target_ongoing_requests": 32}
    serve.run(app, name="ftbert", route_prefix="/")

or from the command line: `ftbert serve MODEL --ray --replicas 4 --gpus-per-replica 1`.

Each replica is a Ray actor (a process) that loads its own encoder; with gpus_per_replica > 0 it
asks Ray for that share of a GPU (0.5: two replicas per GPU) and runs on "cuda", the GPU Ray gave
it. Ray routes each request to a replica; inside one, the batcher batches the requests that replica
holds, so `max_ongoing_requests` (requests per replica at once) should be well above a batch's
worth. Autoscaling (min_replicas / max_replicas / target_ongoing_requests) is Ray's own.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import threading

from .settings import ServeSettings

DEPLOYMENT_NAME = "ftbert"


def replica_settings(settings: ServeSettings, gpus_per_replica: float) -> ServeSettings:
    """A replica's settings: one device, "cuda" (the GPU Ray hands the replica is device 0 of its
    own CUDA_VISIBLE_DEVICES) when it has a GPU share, else "cpu"."""
    return dataclasses.replace(settings, devices=("cuda",) if gpus_per_replica > 0 else ("cpu",))


def deployment(
    settings: ServeSettings,
    replicas: int = 1,
    gpus_per_replica: float = 0.0,
    cpus_per_replica: float = 1.0,
    autoscaling: dict | None = None,
    max_ongoing_requests: int = 512,
):
    """The Ray Serve deployment (unbound) serving `settings`' model; `build_app` binds it.

    replicas: a fixed count, unless `autoscaling` is given (Ray's autoscaling_config:
    {"min_replicas": 1, "max_replicas": 8, "target_ongoing_requests": 32, ...}).
    gpus_per_replica: 0 runs the replicas on the CPU; a fraction shares a GPU between replicas.
    max_ongoing_requests: requests a replica holds at once (Ray's default, 5, would leave its
    batcher little to batch)."""
    from ray import serve

    if gpus_per_replica < 0 or cpus_per_replica < 0:
        raise ValueError("gpus_per_replica and cpus_per_replica must be >= 0")
    options = {
        "name": DEPLOYMENT_NAME,
        "ray_actor_options": {"num_cpus": cpus_per_replica, "num_gpus": gpus_per_replica},
        "max_ongoing_requests": max_ongoing_requests,
    }
    if autoscaling:
        options["autoscaling_config"] = dict(autoscaling)
    else:
        if replicas < 1:
            raise ValueError(f"replicas must be at least 1, got {replicas}")
        options["num_replicas"] = replicas
    fields = replica_settings(settings, gpus_per_replica).as_dict()

    def build_replica_app():
        # Runs in each replica when Ray starts it. The app's lifespan then loads the encoder and
        # starts the batcher; Ray runs the lifespan's shutdown when the replica stops.
        from ftbert.serving.app import create_app
        from ftbert.serving.settings import ServeSettings

        return create_app(ServeSettings(**fields), freeze_heap=True)

    return serve.deployment(**options)(serve.ingress(build_replica_app)())


def build_app(settings: ServeSettings, **kwargs):
    """A Ray Serve application serving `settings`' model, for `serve.run(app, route_prefix="/")`;
    keyword arguments as `deployment` takes them (replicas, gpus_per_replica, cpus_per_replica,
    autoscaling, max_ongoing_requests)."""
    return deployment(settings, **kwargs).bind()


def autoscaling_from_args(args) -> dict | None:
    """Ray's autoscaling_config from --min-replicas / --max-replicas / --target-ongoing-requests,
    or None (a fixed --replicas) when neither bound is given."""
    if args.min_replicas is None and args.max_replicas is None:
        return None
    lo = args.min_replicas if args.min_replicas is not None else 1
    hi = args.max_replicas if args.max_replicas is not None else max(lo, args.replicas)
    if hi < lo:
        raise ValueError(f"--max-replicas ({hi}) is below --min-replicas ({lo})")
    return {"min_replicas": lo, "max_replicas": hi, "target_ongoing_requests": args.target_ongoing_requests}


def run_ray(settings: ServeSettings, args) -> int:
    """`ftbert serve --ray`: starts (or joins) Ray, serves on args.host:args.port until SIGINT or
    SIGTERM, then shuts Serve down (each replica drains its requests first)."""
    try:
        import ray
        from ray import serve
    except ImportError:
        print("ftbert serve: --ray needs the 'ray' extra: pip install 'ftbert[ray]'", file=sys.stderr)
        return 2
    try:
        autoscaling = autoscaling_from_args(args)
    except ValueError as e:
        print(f"ftbert serve: error: {e}", file=sys.stderr)
        return 2
    app = build_app(settings, replicas=args.replicas, gpus_per_replica=args.gpus_per_replica,
                    cpus_per_replica=args.cpus_per_replica, autoscaling=autoscaling)
    # Handlers first: a signal while Ray starts still stops it, once serve.run has returned.
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    ray.init(address=args.ray_address)
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        serve.run(app, name=DEPLOYMENT_NAME, route_prefix="/")
        print(f"ftbert serve: serving through Ray Serve on http://{args.host}:{args.port} "
              f"({'autoscaling ' + str(autoscaling) if autoscaling else f'{args.replicas} replica(s)'})",
              file=sys.stderr, flush=True)
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0
