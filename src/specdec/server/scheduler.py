"""One worker thread decodes every request, a round at a time, round-robin.

Design: the models are shared and only this thread runs them. Each request gets its own
Engine over fresh backend wrappers (its own KV caches), so requests never see each other's
state, and active requests advance one speculative round each in turn: a long request
cannot starve a short one, and time to first token stays bounded by the number of active
requests. At most ``max_active`` requests are decoded at once and ``max_queue`` wait; more
are refused (the app answers 503). A request whose client went away is dropped at its next
round, freeing its slot. Adaptive-k controllers are shared per drafter kind: what one
request teaches about acceptance and costs helps the next.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from specdec.backends.hf import HFModel
from specdec.config import SamplingParams, SpecConfig
from specdec.controller import AdaptiveK
from specdec.drafters import Drafter, ModelDrafter, PromptLookupDrafter
from specdec.drafters.recipe import available_recipes, build_drafter
from specdec.engine import Chunk, Engine

END = None  # marks the end of a job's output queue


class QueueFull(Exception):
    pass


class ServerStopping(Exception):
    pass


@dataclass
class Job:
    prompt_ids: list[int]
    params: SamplingParams
    spec: SpecConfig
    drafter: str  # a recipe: "none", "model", "lookup", "lookup+model", "eagle", ...
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.perf_counter)
    checked: float = 0.0  # when the handler last looked whether the client is still there

    def put(self, item: Chunk | Exception | None) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


class Scheduler:
    def __init__(
        self,
        target_model,
        tokenizer,
        draft_model=None,
        max_active: int = 4,
        max_queue: int = 16,
        on_queue_change: Callable[[int, int], None] | None = None,
        heads: dict | None = None,
    ):
        """``heads``: loaded ``specdec.heads.load.Heads`` by kind (medusa, eagle) for the
        target model; each request gets its own drafter over its own backend."""
        self.target_model, self.tokenizer, self.draft_model = target_model, tokenizer, draft_model
        self.heads = heads or {}
        self.default_drafter: str | None = None  # the recipe "auto" resolved to, if it was
        self.max_active, self.max_queue = max_active, max_queue
        self.on_queue_change = on_queue_change or (lambda waiting, active: None)
        self.controllers: dict[str, AdaptiveK] = {}
        self._pending: collections.deque[Job] = collections.deque()
        self._active: list[tuple[Job, Iterator[Chunk]]] = []
        self._admitted = 0  # waiting + active, guarded by _wake
        self._wake = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="specdec-scheduler", daemon=True)

    @property
    def drafters(self) -> list[str]:
        """The drafter recipes requests may ask for."""
        model = ["model"] if self.draft_model is not None else []
        return available_recipes(["lookup", *model, *sorted(self.heads)])

    @property
    def max_length(self) -> int | None:
        return getattr(self.target_model.config, "max_position_embeddings", None)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Cancel every job and end the worker; bounded by one round of the models."""
        with self._wake:
            self._stopped = True
            self._wake.notify()
        self.cancel_all()
        self._thread.join(timeout=10)

    def cancel_all(self) -> None:
        """Every admitted job ends: waiting handlers get an error at once, and the worker
        drops them at its next round."""
        with self._wake:
            jobs = list(self._pending) + [job for job, _ in self._active]
        for job in jobs:
            job.cancelled.set()
            job.put(ServerStopping("the server is shutting down"))

    def submit(self, job: Job) -> None:
        with self._wake:
            if self._admitted >= self.max_active + self.max_queue:
                raise QueueFull(
                    f"{self.max_active} requests are decoding and {len(self._pending)} "
                    "waiting; try again later"
                )
            self._admitted += 1
            self._pending.append(job)
            self._wake.notify()

    # ---- the worker thread --------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._pending and not self._active and not self._stopped:
                    self._wake.wait()
                if self._stopped:
                    return
                while self._pending and len(self._active) < self.max_active:
                    job = self._pending.popleft()
                    self._active.append((job, self._start(job)))
                self.on_queue_change(len(self._pending), len(self._active))
            for entry in list(self._active):
                self._advance(*entry)

    def _release(self, job: Job) -> None:
        """Free the job's slot. Called BEFORE its last item is sent, so a client that sends
        its next request as soon as this one ends never finds the slot still taken."""
        with self._wake:
            self._active = [entry for entry in self._active if entry[0] is not job]
            self._admitted -= 1
            self.on_queue_change(len(self._pending), len(self._active))

    def _start(self, job: Job) -> Iterator[Chunk]:
        controller = None
        if job.spec.adaptive:  # one controller per drafter recipe: what one request learns helps
            key = f"{job.drafter}/{job.spec.max_k}"
            controller = self.controllers.setdefault(key, AdaptiveK(max_k=job.spec.max_k))
        target = HFModel(self.target_model, self.tokenizer)
        engine = Engine(target, self._drafter(job.drafter, target), controller)
        return engine.stream(job.prompt_ids, job.params, job.spec)

    def _drafter(self, recipe: str, target: HFModel) -> Drafter | None:
        factories: dict[str, Callable[[], Drafter]] = {"lookup": PromptLookupDrafter}
        if self.draft_model is not None:
            factories["model"] = lambda: ModelDrafter(HFModel(self.draft_model))
        for kind, heads in self.heads.items():
            factories[kind] = functools.partial(heads.drafter, target)
        return build_drafter(recipe, factories)

    def _advance(self, job: Job, rounds: Iterator[Chunk]) -> None:
        """One round of one job; a job that is over (done, failed or abandoned) leaves."""
        if job.cancelled.is_set():
            self._release(job)
            return
        try:
            chunk = next(rounds)
        except StopIteration:
            self._release(job)
            job.put(END)
            return
        except Exception as error:  # reported to that request; the server keeps serving
            self._release(job)
            job.put(error)
            return
        if chunk.finish_reason is not None:
            self._release(job)
            job.put(chunk)
            job.put(END)
            return
        job.put(chunk)
