"""One server's configuration, and how it becomes a running scheduler and an app.

Shared by ``specdec serve`` in one process and by every Ray Serve replica
(``server/cluster.py``), so both load the pair and build the app the same way.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field

from fastapi import FastAPI

from specdec.config import (
    DEFAULT_MAX_QUEUE,
    DEFAULT_MAX_ROWS,
    DEFAULT_PREFILL_ROWS,
    DEFAULT_PREFIX_CACHE_MB,
)
from specdec.server.app import create_app
from specdec.server.guard import Limits
from specdec.server.scheduler import Scheduler


@dataclass(frozen=True)
class ServerConfig:
    target: str
    draft: str | None
    dtype: str | None = None  # both models' transformers precision; None: chosen (auto)
    target_runtime: str = "auto"  # a runtime value (specdec.runtime), or auto: as generate
    draft_runtime: str = "auto"  # auto: int8 or int4, measured (passes that batch)
    draft_vocab: str = "auto"  # auto, full or a vocabulary file (runtime.draft_vocabulary)
    cache_dir: str | None = None
    drafter: str = "model"
    k: int | str = "auto"
    max_active: int = 8
    max_queue: int = DEFAULT_MAX_QUEUE
    max_rows: int = DEFAULT_MAX_ROWS  # rows one batched target pass may score
    batching: bool = True  # int8/int4: one target pass per step for every active request
    prefix_sharing: bool = True  # batched: copy a prompt prefix another request's cache holds
    prefix_cache_mb: int = DEFAULT_PREFIX_CACHE_MB  # batched: ended requests' caches kept, a model
    prefill_rows: int | None = DEFAULT_PREFILL_ROWS  # batched: a joiner's prefill a step, a model
    threads: int | None = None  # torch threads (None: torch's default)
    limits: Limits = field(default_factory=Limits)
    api_key: str | None = None
    allowed_hosts: tuple[str, ...] | None = None
    model_name: str | None = None  # as clients name it (default: target)


def load_scheduler(config: ServerConfig, progress=None) -> Scheduler:
    """``build_scheduler`` on a thread of its own that ends once the pair is loaded, so that
    the only OpenMP thread pool left is the one the scheduler's worker makes when it decodes.

    Why: libgomp keeps a pool of worker threads for every thread that ran a parallel region,
    for as long as that thread lives, and once its pools hold more threads than the machine
    has CPUs it stops letting idle workers spin between regions (they sleep, and each of a
    step's many regions waits for them to wake). Models loaded on the main thread left a pool
    there, and the worker decoded markedly slower than the same engine on the loading thread
    (bench/openmp_pools.py; bench/results/2026-12-03-serve-one-client-openmp-xeon-amx)."""
    done: dict = {}

    def load() -> None:
        try:
            done["scheduler"] = build_scheduler(config, progress)
        except BaseException as error:  # raised again in the caller's thread
            done["error"] = error

    loader = threading.Thread(target=load, name="specdec-load", daemon=True)
    loader.start()
    loader.join()
    if "error" in done:
        raise done["error"]
    return done["scheduler"]


def build_scheduler(config: ServerConfig, progress=None) -> Scheduler:
    """Load the pair (the draft only when the default drafter uses it) into a scheduler,
    not started yet."""
    import torch

    from specdec.backends.hf import source_of
    from specdec.runtime import choose_target_runtime, load_draft, parse_runtime

    if config.threads:
        torch.set_num_threads(config.threads)
    extra = [progress] if progress is not None else []
    target_on = choose_target_runtime(
        config.target_runtime, config.target, config.cache_dir, progress, config.dtype
    )
    target = parse_runtime(target_on, config.dtype or "int8").load(
        config.target, config.cache_dir, *extra
    )
    default_drafter = config.drafter
    if default_drafter == "auto":
        from specdec.heads.load import auto_recipe

        can_choose = config.draft is not None and config.k == "auto"
        default_drafter, why = auto_recipe(
            target, config.cache_dir, config.target, can_choose, lookup_in_front=False
        )
        sys.stderr.write(f"specdec: drafter auto -> {default_drafter} ({why})\n")
    draft = None
    if config.draft is not None and "model" in default_drafter:
        loaded, _ = load_draft(
            config.draft, config.draft_runtime, config.cache_dir, progress, config.dtype,
            target_on, config.draft_vocab, batched=True,
        )  # fmt: skip
        draft = source_of(loaded)  # the scheduler makes each request's sequences of it
    scheduler = Scheduler(
        source_of(target),
        target.tokenizer,
        draft,
        config.max_active,
        config.max_queue,
        heads=load_trained_heads(target, config.cache_dir, config.target, default_drafter),
        max_rows=config.max_rows,
        batching=config.batching,
        prefix_sharing=config.prefix_sharing,
        prefill_rows=config.prefill_rows,
        prefix_cache_mb=config.prefix_cache_mb,
    )
    scheduler.default_drafter = default_drafter
    return scheduler


def load_trained_heads(target, cache_dir: str | None, target_name: str, required: str) -> dict:
    """Every kind of heads trained for the target; those the ``required`` recipe names
    must be there."""
    from specdec.drafters.recipe import parse_recipe
    from specdec.heads.load import load_heads
    from specdec.heads.nets import KINDS

    heads = {}
    for kind in KINDS:
        try:
            heads[kind] = load_heads(kind, target, cache_dir, target_name)
        except ValueError:
            if kind in parse_recipe(required):
                raise
    return heads


def build_app(config: ServerConfig, scheduler: Scheduler, replica: str | None = None) -> FastAPI:
    return create_app(
        scheduler,
        model_name=config.model_name or config.target,
        default_k=config.k,
        default_drafter=scheduler.default_drafter or config.drafter,
        limits=config.limits,
        api_key=config.api_key,
        allowed_hosts=config.allowed_hosts,
        replica=replica,
    )
