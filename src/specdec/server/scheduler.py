"""One worker thread decodes every request, a round at a time.

Design: the models are shared and only this thread runs them. Each request gets its own
Engine over its own target sequence (its own KV cache), so requests never see each other's
state. On the int8 and int4 runtimes (``backends/batched.py``) every step is one round of
EVERY active request in one target pass (continuous batching, ``engine.step_together``):
each drafts, the target scores all of them at once, each accepts its own count; finished
requests leave and waiting ones join at the next step. ``max_rows`` caps the rows one pass
scores, split evenly, so one request's k cannot slow the others; ``prefill_rows`` caps the
prompt tokens a step prefills into each model for a joining request, so a long prompt is fed
in parts between the others' steps instead of stopping them for the whole of its prefill;
a joining prompt that begins like one ahead of it still in its prefill waits until that one
holds their common beginning, then copies it instead of computing it too.
Whether a step drafts at all is learned per batch size (``controller.BatchDrafting``): a
batch decoding plainly already uses the compute that speculation uses alone. On other
runtimes active requests advance one round each in turn. Either way a long request cannot
starve a short one. At most ``max_active`` requests are decoded at once and ``max_queue``
wait; more are refused (the app answers 503). A request whose client went away is dropped at
its next step, freeing its slot. Adaptive-k controllers are shared per drafter kind: what
one request teaches about acceptance and costs helps the next.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from specdec.backends.base import Backend, Model, common_prefix_length
from specdec.backends.batched import BatchedModel
from specdec.backends.hf import model_of
from specdec.config import (
    DEFAULT_MAX_QUEUE,
    DEFAULT_MAX_ROWS,
    DEFAULT_PREFILL_ROWS,
    DEFAULT_PREFIX_CACHE_MB,
    SamplingParams,
    SpecConfig,
)
from specdec.controller import BatchDrafting, KPolicy
from specdec.drafters import Drafter
from specdec.drafters.prediction import Prediction, PredictionDrafter
from specdec.drafters.recipe import (
    DraftSources,
    available_recipes,
    build_drafter,
    is_choice,
    is_recipe,
    parse_choice,
    parse_recipe,
)
from specdec.engine import Chunk, Engine, Run, new_controller, step_together

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
    # the request's predicted output: drafts in front of ``drafter``, whose recipe then
    # begins with "prediction" (``recipe.with_prediction``); one index for all its choices
    prediction: Prediction | None = None

    def put(self, item: Chunk | Exception | None) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


class Scheduler:
    def __init__(
        self,
        target_model,
        tokenizer,
        draft_model=None,
        max_active: int = 4,
        max_queue: int = DEFAULT_MAX_QUEUE,
        on_queue_change: Callable[[int, int], None] | None = None,
        heads: dict | None = None,
        max_rows: int = DEFAULT_MAX_ROWS,
        batching: bool = True,
        prefix_sharing: bool = True,
        prefill_rows: int | None = DEFAULT_PREFILL_ROWS,
        prefix_cache_mb: int = DEFAULT_PREFIX_CACHE_MB,
    ):
        """``target_model``, ``draft_model``: ``backends.base.Model``s (each request gets
        its own sequence of them; a transformers module is taken as ``hf.model_of`` makes
        it). ``heads``: loaded ``specdec.heads.load.Heads`` by kind (medusa, eagle) for the
        target model; each request gets its own drafter over its own backend.
        ``max_rows``: the rows one batched target pass may score. ``batching=False``:
        requests take turns even on int8 and int4 (for comparison). ``prefix_sharing``:
        batched requests copy a prompt prefix another one's cache holds, or one a request
        that ended left (at most ``prefix_cache_mb`` of those a model). ``prefill_rows``:
        batched, the prompt tokens one step prefills into each model for a joining request
        (None: each joining prompt whole)."""
        target_model, draft_model = _as_model(target_model, tokenizer), _as_model(draft_model)
        self.target_model, self.tokenizer, self.draft_model = target_model, tokenizer, draft_model
        self.batched = target_model if batching and isinstance(target_model, BatchedModel) else None
        # The draft model's passes of all requests run as one too (engine.step_together).
        self.draft_batched = (
            draft_model
            if self.batched is not None and isinstance(draft_model, BatchedModel)
            else None
        )
        for model in (self.batched, self.draft_batched):
            if model is not None:
                model.share_prefixes, model.keep_bytes = prefix_sharing, prefix_cache_mb << 20
        self.max_rows, self.prefill_rows = max_rows, prefill_rows
        self.heads = heads or {}
        self.default_drafter: str | None = None  # the recipe "auto" resolved to, if it was
        self.max_active, self.max_queue = max_active, max_queue
        self.on_queue_change = on_queue_change or (lambda waiting, active: None)
        self.on_batched_pass: Callable[[int], None] = lambda requests: None
        self.on_prefix_reused: Callable[[int], None] = lambda tokens: None
        self.controllers: dict[str, KPolicy] = {}
        self.batch_drafting = BatchDrafting()  # whether a batched step drafts, by batch size
        self._pending: collections.deque[Job] = collections.deque()
        self._active: list[_Active] = []
        self._admitted = 0  # waiting + active, guarded by _wake
        self._wake = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="specdec-scheduler", daemon=True)

    @property
    def drafters(self) -> list[str]:
        """The drafter recipes requests may ask for (a chain's members in any order too)."""
        return available_recipes(self._kinds())

    def offers(self, recipe: str) -> bool:
        """Whether a request may ask for ``recipe``: one of ``drafters``, a chain of the
        kinds served here in another order, or one of the choices in ``drafters`` with its
        chains in another order. A finite set (a choice among arbitrary chains is not
        offered), so the controllers kept per recipe stay bounded."""
        if recipe in self.drafters:
            return True
        if not is_recipe(recipe) or not set(parse_recipe(recipe)) <= set(self._kinds()):
            return False
        if not is_choice(recipe):
            return True
        offered = [set(parse_choice(r)) for r in self.drafters if is_choice(r)]
        return set(parse_choice(recipe)) in offered

    def _kinds(self) -> list[str]:
        return self._sources().kinds()

    @property
    def max_length(self) -> int | None:
        return self.target_model.max_length

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
            jobs = list(self._pending) + [entry.job for entry in self._active]
        for job in jobs:
            job.cancelled.set()
            job.put(ServerStopping("the server is shutting down"))

    def cancel(self, job: Job) -> None:
        """The job's client has gone: a waiting job gives its queue place back at once; an
        active one is dropped by the worker at its next round."""
        job.cancelled.set()
        with self._wake:
            if job in self._pending:
                self._pending.remove(job)
                self._admitted -= 1
                self.on_queue_change(len(self._pending), len(self._active))

    def submit(self, job: Job) -> None:
        with self._wake:
            if self._admitted >= self.max_active + self.max_queue:
                raise QueueFull(
                    f"{self.max_active} requests are decoding and {len(self._pending)} "
                    "waiting; try again later"
                )
            self._admitted += 1
            self._pending.append(job)
            self.on_queue_change(len(self._pending), len(self._active))  # not at the next round
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
                    self._active.append(_Active(self._pending.popleft()))
                self.on_queue_change(len(self._pending), len(self._active))
            if self.batched is not None:
                self._step_batched(list(self._active))
            else:
                for entry in list(self._active):
                    self._advance(entry)

    def _release(self, job: Job) -> None:
        """Free the job's slot. Called BEFORE its last item is sent, so a client that sends
        its next request as soon as this one ends never finds the slot still taken."""
        with self._wake:
            self._active = [entry for entry in self._active if entry.job is not job]
            self._admitted -= 1
            self.on_queue_change(len(self._pending), len(self._active))

    def _begin(self, job: Job) -> Run:
        target = self.target_model.sequence()
        # k = 0 drafts nothing: no drafter, nor a draft sequence
        drafter = None if job.spec.k == 0 else self._drafter(job, target)
        controller = None
        if job.spec.adaptive:  # one controller per drafter recipe: what one request learns helps
            key = f"{job.drafter}@{job.spec.max_k}"
            controller = self.controllers.get(key)
            if controller is None:
                controller = self.controllers[key] = new_controller(drafter, job.spec.max_k)
        engine = Engine(target, drafter, controller)
        return engine.begin(job.prompt_ids, job.params, job.spec)

    def _drafter(self, job: Job, target: Backend) -> Drafter | None:
        return build_drafter(job.drafter, self._sources(target, job))

    def _sources(self, target: Backend | None = None, job: Job | None = None) -> DraftSources:
        """What this server drafts with, for ``job`` over ``target`` (None: which kinds)."""
        draft_model: Callable[[], Backend] | None = None
        if (model := self.draft_model) is not None:
            draft_model = model.sequence
        heads = {kind: functools.partial(h.drafter, target) for kind, h in self.heads.items()}
        prediction = None
        if job is not None and job.prediction is not None:
            predicted, prompt_tokens = job.prediction, len(job.prompt_ids)
            prediction = lambda: PredictionDrafter(predicted, prompt_tokens)  # noqa: E731
        return DraftSources(draft_model=draft_model, heads=heads, prediction=prediction)

    def _advance(self, entry: _Active) -> None:
        """One round of one job; a job that is over (done, failed or abandoned) leaves."""
        job = entry.job
        if job.cancelled.is_set():
            self._release(job)
            return
        try:
            if entry.rounds is None:
                entry.rounds = self._begin(job).rounds()
            chunk = next(entry.rounds)
        except StopIteration:
            self._release(job)
            job.put(END)
            return
        except Exception as error:  # reported to that request; the server keeps serving
            self._release(job)
            job.put(error)
            return
        self._deliver(job, chunk)

    def _step_batched(self, entries: list[_Active]) -> None:
        """One round of every active job in one target pass. Each job joining is prefilled
        first, at most ``prefill_rows`` prompt tokens a step into each model's cache (a
        longer prompt goes on at the next steps; a prefix another request's cache holds is
        copied, not computed: ``ModelSequence.reuse_prefix``); a job whose prefill is done
        joins the step. Prompts that fit join in the step they come, together; one that
        begins like a job ahead of it still in its prefill waits for it (``_waits``). A long
        prompt's first token comes from its prefill's last part and goes to its client at
        once (``Run.first_token_part``), not after the others' prefills and the step."""
        assert self.batched is not None, "only with a batched model"
        jobs, runs = [], []
        reused = self.batched.reused_tokens
        # A batch that does not draft at its size now leaves the draft's prefill to the
        # first proposal (if the batch shrinks and drafts).
        prepare_drafter = self.batch_drafting.prefers_drafting(len(entries))
        prefilling: list[tuple[Job, Run]] = []  # jobs ahead whose prefill goes on
        for entry in entries:
            if entry.job.cancelled.is_set():
                self._release(entry.job)
                continue
            if not entry.started:
                if self.batched.share_prefixes and _waits(entry.job, prefilling):
                    continue
                try:
                    if entry.run is None:
                        entry.run = self._begin(entry.job)
                    first = entry.run.first_token_part(self.prefill_rows)
                    if first is not None:  # a long prompt's first token, from its prefill
                        self._deliver(entry.job, first)
                        if first.finish_reason is not None:
                            continue
                    entry.run.prefill_part(self.prefill_rows, prepare_drafter)
                except Exception as error:
                    self._release(entry.job)
                    entry.job.put(error)
                    continue
                if not entry.run.prefilled:
                    prefilling.append((entry.job, entry.run))
                    continue  # the rest at the next steps
            assert entry.run is not None, "a started job has its run"
            jobs.append(entry.job)
            runs.append(entry.run)
        if self.batched.reused_tokens > reused:
            self.on_prefix_reused(self.batched.reused_tokens - reused)
        if not runs:
            return
        results = step_together(runs, self.batched.forward_many, self.max_rows, self.batch_drafting)
        self.on_batched_pass(len(runs))
        for job, result in zip(jobs, results, strict=True):
            if isinstance(result, Exception):
                self._release(job)
                job.put(result)
            else:
                self._deliver(job, result)

    def _deliver(self, job: Job, chunk: Chunk) -> None:
        if chunk.finish_reason is not None:
            self._release(job)
            job.put(chunk)
            job.put(END)
            return
        job.put(chunk)


def _waits(job: Job, prefilling: list[tuple[Job, Run]]) -> bool:
    """Whether a joining ``job`` skips its prefill this step: a job ahead of it, still in
    its prefill, is computing a beginning of its prompt and does not hold all of it yet.
    Once it does, ``job`` copies it (``ModelSequence.reuse_prefix``, the scores with it:
    ``prefix_scores``) instead of computing the same rows beside it; as that one goes at
    a part a step, ``job`` is prefilled about as soon as it would have been, and the steps
    between cost the others less (the answers of one question sent in one request). A job
    that scores its prompt waits only for one that keeps scores like its own."""
    scores = job.params.prompt_logprobs
    for other, run in prefilling:
        if scores is not None and other.params.prompt_logprobs != scores:
            continue  # its scores are not this job's to take
        common = common_prefix_length(other.prompt_ids, job.prompt_ids)
        # a target's prefill holds all of a prompt but its last token (fed by the first round)
        common = min(common, len(other.prompt_ids) - 1, len(job.prompt_ids) - 1)
        if common_prefix_length(run.target.cached_token_ids, job.prompt_ids) < common:
            return True
    return False


def _as_model(model, tokenizer=None) -> Model | None:
    """A ``Model`` as it is; a transformers module as ``hf.model_of`` makes it."""
    if model is None or isinstance(model, Model):
        return model
    return model_of(model, tokenizer)


@dataclass
class _Active:
    """A job being decoded: its run once started (batched), or its rounds (in turn)."""

    job: Job
    run: Run | None = None
    rounds: Iterator[Chunk] | None = None

    @property
    def started(self) -> bool:
        """Batched: its prefill is done and it steps with the others."""
        return self.run is not None and self.run.prefilled
