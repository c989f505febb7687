"""``specdec serve --replicas N``: the same OpenAI app, served by N Ray Serve replicas.

Why Ray Serve: one ``specdec serve`` is one process on one machine. Ray Serve gives replicas
behind one HTTP endpoint (its proxy), load balancing, health checks that replace a replica
that dies, autoscaling between bounds and rolling restarts, on one machine or a cluster
(``ray start --head`` on one host, ``ray start --address HEAD:6379`` on the others,
``specdec serve --replicas N --address auto`` on the head). Nothing here decodes: each
replica loads the pair once and runs ``create_app`` exactly as the single-process server
does, so limits, errors and metrics are the same. ``/metrics`` is answered by one replica
with that replica's counters; ``specdec_replica_info{replica=...}`` says which.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from specdec.server.guard import Limits

APP_NAME = "specdec"


@dataclass(frozen=True)
class ReplicaConfig:
    """What every replica needs to build its own models, scheduler and app."""

    target: str
    draft: str | None
    dtype: str = "int8"
    cache_dir: str | None = None
    drafter: str = "model"
    k: int | str = "auto"
    max_active: int = 4
    max_queue: int = 16
    threads: int | None = None  # torch threads per replica (None: torch's default)
    limits: Limits = field(default_factory=Limits)
    api_key: str | None = None
    allowed_hosts: tuple[str, ...] | None = None
    model_name: str | None = None  # as clients name it (default: target)


class SpecdecReplica:
    """One replica: the pair, a scheduler, the app (built by Ray through
    ``__serve_build_asgi_app__`` after the constructor)."""

    def __init__(self, config: ReplicaConfig):
        import torch

        from specdec.loading import load_backend
        from specdec.server import Scheduler

        if config.threads:
            torch.set_num_threads(config.threads)
        target = load_backend(config.target, config.dtype, config.cache_dir)
        draft = None
        if config.draft is not None and "model" in config.drafter:
            draft = load_backend(config.draft, config.dtype, config.cache_dir).model
        self.scheduler = Scheduler(
            target.model, target.tokenizer, draft, config.max_active, config.max_queue
        )
        self.scheduler.start()
        self.config = config
        self.replica = _replica_name()

    def __serve_build_asgi_app__(self):
        from specdec.server import create_app

        config = self.config
        return create_app(
            self.scheduler,
            model_name=config.model_name or config.target,
            default_k=config.k,
            default_drafter=config.drafter,
            limits=config.limits,
            api_key=config.api_key,
            allowed_hosts=config.allowed_hosts,
            replica=self.replica,
        )

    def __del__(self):
        self.scheduler.stop()


def _replica_name() -> str:
    try:
        from ray import serve

        return str(serve.get_replica_context().replica_id.unique_id)
    except Exception:  # outside a replica (tests building it by hand)
        return f"pid-{os.getpid()}"


def build_application(
    config: ReplicaConfig,
    replicas: int,
    min_replicas: int | None = None,
    max_replicas: int | None = None,
    replica_cpus: float = 1.0,
):
    """The Ray Serve application: a fixed number of replicas, or autoscaling between bounds
    (on requests in flight per replica, target ``max_active``)."""
    from ray import serve

    options: dict = {"ray_actor_options": {"num_cpus": replica_cpus}}
    if min_replicas is not None or max_replicas is not None:
        options["autoscaling_config"] = {
            "min_replicas": min_replicas if min_replicas is not None else 1,
            "initial_replicas": replicas,
            "max_replicas": max_replicas if max_replicas is not None else replicas,
            "target_ongoing_requests": config.max_active,
        }
    else:
        options["num_replicas"] = replicas
    ingress = serve.ingress()(SpecdecReplica)
    return serve.deployment(name="SpecdecReplica", **options)(ingress).bind(config)


def run(
    config: ReplicaConfig,
    replicas: int,
    host: str,
    port: int,
    address: str | None = None,
    min_replicas: int | None = None,
    max_replicas: int | None = None,
    replica_cpus: float = 1.0,
    blocking: bool = True,
):
    """Start (or join, ``address``) a Ray cluster, deploy, serve until interrupted, then
    shut Serve and Ray down."""
    import ray
    from ray import serve

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no reporting home
    ray.init(address=address, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": host, "port": port})
    app = build_application(config, replicas, min_replicas, max_replicas, replica_cpus)
    serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
    if not blocking:
        return
    try:
        import signal
        import threading

        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()
        ray.shutdown()
