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

from specdec.server.setup import ServerConfig, build_app, load_scheduler

APP_NAME = "specdec"


class SpecdecReplica:
    """One replica: the pair, a scheduler, the app (built by Ray through
    ``__serve_build_asgi_app__`` after the constructor)."""

    def __init__(self, config: ServerConfig):
        self.scheduler = load_scheduler(config)
        self.scheduler.start()
        self.config = config
        self.replica = _replica_name()

    def __serve_build_asgi_app__(self):
        return build_app(self.config, self.scheduler, self.replica)

    def __del__(self):
        self.scheduler.stop()


def _replica_name() -> str:
    try:
        from ray import serve

        return str(serve.get_replica_context().replica_id.unique_id)
    except Exception:  # outside a replica (tests building it by hand)
        return f"pid-{os.getpid()}"


def build_application(
    config: ServerConfig,
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
    config: ServerConfig,
    replicas: int,
    host: str,
    port: int,
    address: str | None = None,
    min_replicas: int | None = None,
    max_replicas: int | None = None,
    replica_cpus: float = 1.0,
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
