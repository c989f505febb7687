"""One request's way through the server, after the guard: the cheap checks, the sampling
parameters, tokenization in a worker thread (never on the event loop), the prompt length,
the scheduler; then the answer, whole or streamed. A client that leaves, streaming or not,
cancels its job."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, TypeVar

from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response, StreamingResponse

from specdec.adjustments import check_token_ids
from specdec.config import SEED_RANGE, Constraint, SamplingParams, SpecConfig
from specdec.drafters.prediction import Prediction, predicted_ids
from specdec.drafters.recipe import in_front, with_prediction
from specdec.engine import Chunk
from specdec.grammar import Grammar
from specdec.prompting import NO_FIM, chat_ids, checked_ids, encode_prompt, fim_ids, fim_markers
from specdec.server import responses
from specdec.server.errors import ApiError, ClientGone, as_api_error
from specdec.server.guard import Limits
from specdec.server.metrics import ServerMetrics
from specdec.server.scheduler import END, Job, QueueFull, Scheduler
from specdec.server.schemas import (
    ChatCompletionRequest,
    CompletionBody,
    CompletionRequest,
    Detokenize,
    TokenizeChat,
    TokenizeText,
)
from specdec.server.tools import HeldText, ToolUse, reply_of, tags_are_tokens

RETRY_AFTER_SECONDS = 1
T = TypeVar("T")

CLIENT_CHECK_SECONDS = 0.2  # how often a waiting handler looks whether its client is there


@dataclass
class Service:
    """What the routes share: the scheduler, the served model's name and defaults, the
    limits, the metrics and this replica's name."""

    scheduler: Scheduler
    model_name: str
    default_k: int | str
    default_drafter: str
    default_max_tokens: int
    limits: Limits
    metrics: ServerMetrics
    replica: str | None
    text_of: responses.TokenText = field(init=False)  # tokens' text and bytes, for logprobs

    def __post_init__(self) -> None:
        self.text_of = responses.TokenText(self.scheduler.tokenizer)

    def check_model(self, model: str | None, status: int = 400) -> None:
        """A request naming another model than the served one: an error of ``status``
        (400 for a field of a body; 404 for a path, OpenAI's retrieve)."""
        if model not in (None, self.model_name):
            message = f"model {model!r} is not served here; use {self.model_name!r}"
            raise ApiError(status, message, "model", "model_not_found")

    def check_cheap(self, body: CompletionBody) -> None:
        """The model, drafter, k and stop limits: before any tokenizing."""
        self.check_model(body.model)
        kind = body.drafter or self.default_drafter
        if not self.scheduler.offers(kind):
            available = ", ".join(self.scheduler.drafters)
            raise ApiError(400, f"drafter {kind!r} is not available; use {available}", "drafter")
        k = body.num_speculative_tokens
        if isinstance(k, int) and k > self.limits.max_k:
            message = f"num_speculative_tokens must be <= {self.limits.max_k} (or 'auto'), got {k}"
            raise ApiError(400, message, "num_speculative_tokens")
        if "/" in kind and (self.default_k if k is None else k) not in ("auto", 0):
            message = (
                f"drafter {kind!r} is a choice made from measured rounds, as k is: "
                "num_speculative_tokens must be 'auto'"
            )
            raise ApiError(400, message, "num_speculative_tokens")
        stop = body.stop_strings()
        limits = self.limits
        if len(stop) > limits.max_stop or any(len(s) > limits.max_stop_chars for s in stop):
            message = (
                f"stop: at most {limits.max_stop} strings of at most "
                f"{limits.max_stop_chars} characters"
            )
            raise ApiError(400, message, "stop")

    def completion_prompts(self, body: CompletionRequest) -> Callable[[], list[list[int]]]:
        """How a completion's prompts become token ids (run off the event loop): each text
        encoded, each list of ids checked against the vocabulary, or, with a ``suffix``,
        each around the model's fill-in-the-middle markers with it."""
        tokenizer, vocab = self.scheduler.tokenizer, self.scheduler.target_model.vocab_size
        suffix = body.suffix
        if suffix is not None:
            if body.echo:
                message = "echo with suffix: the prompt is not before the completion"
                raise ApiError(400, message, "echo")
            if fim_markers(tokenizer) is None:
                raise ApiError(400, NO_FIM, "suffix")

        def ids(prompt: str | list[int]) -> list[int]:
            if suffix is not None:
                return checked_ids(fim_ids(tokenizer, prompt, suffix), vocab)
            if isinstance(prompt, list):
                return checked_ids(prompt, vocab)
            return encode_prompt(tokenizer, prompt, "raw")

        return lambda: [ids(prompt) for prompt in body.prompts()]

    def params(self, body: CompletionBody, use: ToolUse | None = None) -> SamplingParams:
        """``use``: the request's tools; where it requires calls, their grammar constrains
        the output."""
        try:
            constraint = use.grammar(self.tag_tokens) if use and use.required else body.constraint()
        except ValueError as error:
            raise ApiError(400, str(error), grammar_param(use)) from None
        try:
            params = SamplingParams(
                max_tokens=body.token_budget(self.default_max_tokens),
                temperature=body.temperature,
                top_k=body.top_k,
                top_p=body.top_p,
                seed=body.seed,
                stop=body.stop_strings(),
                ignore_eos=body.ignore_eos,
                min_tokens=body.min_tokens,
                stop_token_ids=tuple(body.stop_token_ids or ()),
                logprobs=body.logprobs_wanted(),
                prompt_logprobs=body.prompt_logprobs_wanted(),
                constraint=constraint,
                logit_bias=body.bias(),
                presence_penalty=body.presence_penalty,
                frequency_penalty=body.frequency_penalty,
                repetition_penalty=body.repetition_penalty,
            )
        except ValueError as error:  # SamplingParams' messages start with the field's name
            raise ApiError(400, str(error), str(error).split()[0]) from None
        try:
            check_token_ids(params, self.scheduler.target_model.vocab_size)
        except ValueError as error:  # the message starts with the field's name
            raise ApiError(400, str(error), str(error).split()[0]) from None
        return params

    def spec(self, body: CompletionBody) -> SpecConfig:
        """The request's speculation; none where it only scores its prompt."""
        k = 0 if scores_only(body) else body.num_speculative_tokens
        return SpecConfig(k=self.default_k if k is None else k, verification=body.verification)

    async def serve(
        self, body: CompletionBody, encode: Callable[[], list[list[int]]], request: Request
    ):
        """Answer ``body`` (checked cheaply already), its prompts' ids from ``encode``: each
        prompt's choices (``n``, or ``best_of`` made) one after another, choice index = the
        prompt's place x n + its own."""
        use = body.tool_use() if isinstance(body, ChatCompletionRequest) else None
        if use is not None and use.required:  # llguidance's tokenizer, built once, off the loop
            await run_in_threadpool(lambda: self.tag_tokens)
        params, spec = self.params(body, use), self.spec(body)
        made = self.made(body)
        if made > body.n and params.logprobs is None:  # best_of ranks by them
            params = replace(params, logprobs=0)
        if params.constraint is not None:  # a grammar that does not compile is a 400 now
            await run_in_threadpool(self.check_constraint, params.constraint, grammar_param(use))
        try:
            prompts = await run_in_threadpool(encode)
        except ValueError as error:
            raise ApiError(400, str(error), "prompt") from None
        for prompt_ids in prompts:
            self.check_length(prompt_ids)
        echoes = await self.echoes(body, prompts)
        loop = asyncio.get_running_loop()
        drafter = self.recipe(body)
        prediction = None
        if body.prediction is not None and spec.k != 0:
            prediction = await run_in_threadpool(self.indexed, body.prediction.text())
            if prediction is not None:
                drafter = with_prediction(drafter)
        jobs = [
            Job(
                prompt_ids,
                replace(
                    params,
                    seed=choice_seed(params.seed, i),
                    prompt_logprobs=params.prompt_logprobs if i == 0 else None,
                ),  # an echoed prompt is scored once, by its first choice
                spec,
                drafter,
                loop,
                prediction=prediction,
            )  # fmt: skip
            for prompt_ids in prompts
            for i in range(made)
        ]
        self.submit(jobs)
        try:
            firsts = await self.each(jobs, [self.next(job, request) for job in jobs])
        except ClientGone:
            return self.gone(jobs, [[] for _ in jobs])
        failed = [first for first in firsts if isinstance(first, Exception)]
        if failed:
            self.cancel(jobs)
            raise as_api_error(failed[0])
        scores = [firsts[place * made].prompt_logprobs for place in range(len(prompts))]
        echoes = [  # each prompt scored by its first choice
            None if echo is None else replace(echo, scored=scored)
            for echo, scored in zip(echoes, scores, strict=True)
        ]
        if scores_only(body):
            firsts = [responses.prompt_only(first) for first in firsts]
        ttft = time.perf_counter() - jobs[0].submitted
        chat = isinstance(body, ChatCompletionRequest)
        role = body.reply_role() if isinstance(body, ChatCompletionRequest) else "assistant"
        response_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        prompt_tokens = sum(len(prompt_ids) for prompt_ids in prompts)
        if body.stream:  # made == n: each job one choice
            options = body.stream_options or {}
            usage_apart = bool(options.get("include_usage"))
            running = usage_apart and bool(options.get("continuous_usage_stats"))
            events = responses.StreamEvents(
                response_id,
                self.model_name,
                chat,
                self.replica,
                self.text_of,
                [echoes[i // made] for i in range(len(jobs))],
                usage_apart=usage_apart,
                running_usage=[len(prompts[i // made]) for i in range(len(jobs))]
                if running
                else None,
                role=role,
            )
            return StreamingResponse(
                self.stream(jobs, firsts, ttft, events, prompt_tokens, use),
                media_type="text/event-stream",
            )
        choices: list[list[Chunk]] = [[first] for first in firsts]
        try:
            await self.each(
                jobs,
                [
                    self.rest(job, chunks, ttft, request)
                    for job, chunks in zip(jobs, choices, strict=True)
                ],
            )
        except ClientGone:
            return self.gone(jobs, choices)
        self.finish(jobs, choices, ttft, "ok")
        returned: list[list[Chunk]] = []
        for place in range(len(prompts)):
            group = choices[place * made : (place + 1) * made]
            if made > body.n:
                group = responses.best(group, body.n, body.logprobs_wanted() is not None)
            returned.extend(group)
        return responses.completion_body(
            returned,
            prompt_tokens,
            response_id,
            self.model_name,
            chat,
            self.replica,
            self.text_of,
            use,
            [echoes[i // body.n] for i in range(len(returned))],
            choices,
            [scores[i // body.n] for i in range(len(returned))]
            if body.prompt_logprobs is not None
            else (),
            role,
        )

    async def tokenize(self, body: TokenizeText | TokenizeChat) -> dict:
        """vLLM's ``/tokenize``: the ids a completion (or a chat completion) gives this
        prompt (or conversation), their count, the context length (``max_model_len``; null
        where the model sets none) and, with ``return_token_strs``, each token's text as
        logprobs show it."""
        self.check_model(body.model)
        tokenizer = self.scheduler.tokenizer

        def encode() -> tuple[list[int], list[str] | None]:
            if isinstance(body, TokenizeChat):
                messages = [m.as_template_message() for m in body.messages]
                ids = chat_ids(
                    tokenizer,
                    messages,
                    body.template_tools(),
                    body.opens_turn(),
                    body.continue_final_message,
                )
            elif body.add_special_tokens:
                ids = encode_prompt(tokenizer, body.prompt, "raw")
            else:
                ids = list(tokenizer.encode(body.prompt, add_special_tokens=False))
            return ids, [self.text_of(t)[0] for t in ids] if body.return_token_strs else None

        try:
            ids, strs = await run_in_threadpool(encode)
        except ValueError as error:  # a chat template that refuses the messages
            raise ApiError(400, str(error), "messages") from None
        length = self.scheduler.max_length
        return {"count": len(ids), "max_model_len": length, "tokens": ids, "token_strs": strs}

    async def detokenize(self, body: Detokenize) -> dict:
        """vLLM's ``/detokenize``: the text of token ids (each in the vocabulary)."""
        self.check_model(body.model)
        try:
            ids = checked_ids(body.tokens, self.scheduler.target_model.vocab_size, "tokens")
        except ValueError as error:
            raise ApiError(400, str(error), "tokens") from None
        return {"prompt": await run_in_threadpool(self.scheduler.tokenizer.decode, ids)}

    def tokenizer_info(self) -> dict:
        """vLLM's ``/tokenizer_info``: the tokenizer's class, special tokens and chat
        template, and the context length, what lm-evaluation-harness's remote tokenizer reads
        (with ``/tokenize`` and ``/detokenize``, so that it needs no tokenizer of its own)."""
        tokenizer = self.scheduler.tokenizer
        special = ("eos_token", "bos_token", "pad_token", "unk_token", "chat_template")
        return {
            "tokenizer_class": type(tokenizer).__name__,
            **{name: getattr(tokenizer, name, None) for name in special},
            "model_max_length": self.scheduler.max_length,
        }

    def recipe(self, body: CompletionBody) -> str:
        """The request's drafter: its own, else the server's; for a fill in the middle
        (``suffix``) with prompt lookup in front, where the text after the cursor is in the
        prompt (single requests, int4: lookup+model 1.16x plain against the draft model's
        1.00x; bench/results/2026-12-07-fill-in-middle-zen4-epyc-avx512)."""
        if body.drafter is not None:
            return body.drafter
        if isinstance(body, CompletionRequest) and body.suffix is not None:
            return in_front("lookup", self.default_drafter)
        return self.default_drafter

    async def echoes(
        self, body: CompletionBody, prompts: list[list[int]]
    ) -> list[responses.Echo | None]:
        """The prompt each of a completion's choices repeats with ``echo``, one a prompt
        (None without echo): its text as given (prompt ids are decoded, off the event
        loop); a chat's, the last message's text where the reply is in its role."""
        if isinstance(body, ChatCompletionRequest):
            last = body.echoed()
            return [None if last is None else responses.Echo(last, prompts[0][0])]
        if not body.echo:
            return [None for _ in prompts]
        decode = self.scheduler.tokenizer.decode
        echoes: list[responses.Echo | None] = []
        for given, prompt_ids in zip(body.prompts(), prompts, strict=True):
            text = given if isinstance(given, str) else await run_in_threadpool(decode, prompt_ids)
            echoes.append(responses.Echo(text, prompt_ids[0]))
        return echoes

    def indexed(self, text: str) -> Prediction | None:
        """A predicted output's tokens, indexed (None for an empty one); no longer than a
        prompt may be (the output cannot be longer than the context either)."""
        token_ids = predicted_ids(self.scheduler.tokenizer, text)
        limit = self.limits.max_prompt_tokens or self.scheduler.max_length
        if limit is not None and len(token_ids) > limit:
            message = f"prediction has {len(token_ids)} tokens; this server takes at most {limit}"
            raise ApiError(400, message, "prediction")
        return Prediction(token_ids) if token_ids else None

    def made(self, body: CompletionBody) -> int:
        """How many completions the request makes: ``best_of`` (>= n; not streamed), else
        ``n``."""
        best_of = body.best_of if isinstance(body, CompletionRequest) else None
        if best_of is None:
            return body.n
        if best_of < body.n:
            raise ApiError(400, f"best_of must be >= n ({body.n}), got {best_of}", "best_of")
        if best_of > body.n and body.stream:
            message = "best_of > n is not streamed (the best are known at the end): stream: false"
            raise ApiError(400, message, "best_of")
        return best_of

    def submit(self, jobs: list[Job]) -> None:
        """Every choice's job into the scheduler, or none (503 when it is full)."""
        capacity = self.scheduler.max_active + self.scheduler.max_queue
        if len(jobs) > capacity:
            message = (
                f"this request makes {len(jobs)} completions (prompts x n, or best_of); this "
                f"server holds at most {capacity} at once (--max-active + --max-queue)"
            )
            raise ApiError(400, message, "n")
        for submitted, job in enumerate(jobs):
            try:
                self.scheduler.submit(job)
            except QueueFull as error:
                self.cancel(jobs[:submitted])
                raise ApiError(
                    503,
                    f"server busy: {error}",
                    None,
                    "queue_full",
                    "server_error",
                    {"Retry-After": str(RETRY_AFTER_SECONDS)},
                ) from None

    def cancel(self, jobs: list[Job]) -> None:
        for job in jobs:
            self.scheduler.cancel(job)

    async def each(self, jobs: list[Job], waits: list[Coroutine[Any, Any, T]]) -> list[T]:
        """One wait per choice, together; should one fail (its client gone, an error), the
        others are stopped and every job is cancelled."""
        tasks = [asyncio.ensure_future(wait) for wait in waits]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()
            self.cancel(jobs)
            raise

    async def rest(self, job: Job, chunks: list[Chunk], ttft: float, request: Request) -> None:
        """A whole choice's chunks after its first, into ``chunks``."""
        gaps = Gaps(self.metrics, since=job.submitted + ttft)
        while chunks[-1].finish_reason is None:
            item = await self.next(job, request)
            if item is END:
                break
            if isinstance(item, Exception):
                raise as_api_error(item)
            gaps.chunk()
            chunks.append(item)

    @cached_property
    def tag_tokens(self) -> bool:
        """Whether tool calls' tags are special tokens of the target's tokenizer (the first
        request with required calls builds llguidance's form of it, then it is kept)."""
        target = self.scheduler.target_model
        return tags_are_tokens(self.scheduler.tokenizer, target.vocab_size, target.eos_token_ids)

    def check_constraint(self, constraint: Constraint, param: str) -> None:
        """Compile the request's grammar once before it queues (the tokenizer's grammar form
        is built on the first such request, about a second, then kept)."""
        target = self.scheduler.target_model
        try:
            Grammar(constraint, self.scheduler.tokenizer, target.vocab_size, target.eos_token_ids)
        except ValueError as error:
            raise ApiError(400, str(error), param) from None

    def check_length(self, prompt_ids: list[int]) -> None:
        limit = self.limits.max_prompt_tokens
        if limit is not None and len(prompt_ids) > limit:
            message = f"prompt has {len(prompt_ids)} tokens; this server takes at most {limit}"
            raise ApiError(400, message, "prompt", "context_length_exceeded")

    async def next(self, job: Job, request: Request):
        """The job's next item; ClientGone (and the job cancelled) if the client left.
        The connection is looked at every ``CLIENT_CHECK_SECONDS``, however fast items
        arrive."""
        getter = asyncio.ensure_future(job.queue.get())
        while True:
            now = time.perf_counter()
            if now - job.checked >= CLIENT_CHECK_SECONDS:
                job.checked = now
                if await request.is_disconnected():
                    getter.cancel()
                    self.scheduler.cancel(job)
                    raise ClientGone
            done, _ = await asyncio.wait({getter}, timeout=CLIENT_CHECK_SECONDS)
            if done:
                return getter.result()

    def gone(self, jobs: list[Job], choices: list[list[Chunk]]) -> Response:
        self.finish(jobs, choices, None, "disconnected")
        return Response(status_code=499)  # nobody reads it: the client has gone

    def finish(
        self, jobs: list[Job], choices: list[list[Chunk]], ttft: float | None, status: str
    ) -> None:
        """One request counted; each choice's speculation and latency recorded."""
        for job, chunks in zip(jobs, choices, strict=True):
            if chunks:
                self.metrics.record(chunks[-1].stats, time.perf_counter() - job.submitted, ttft)
        self.metrics.requests.labels(status).inc()

    async def stream(
        self,
        jobs: list[Job],
        firsts: list[Chunk],
        ttft: float,
        events: responses.StreamEvents,
        prompt_tokens: int,
        use: ToolUse | None = None,
    ) -> AsyncIterator[str]:
        """The events of a streamed completion, each choice's as its chunks come (``index``
        telling them apart); the last choice's end carries the usage, or an event of its
        own does after it (``StreamEvents.usage_apart``). With
        tools (``use``), text that may be a call is held back (``HeldText``) and read as
        calls at the end of its choice: sent as one ``tool_calls`` delta, or as text if it
        is not a well-formed call."""
        choices = [
            ChoiceStream(HeldText() if use else None, Gaps(self.metrics, job.submitted + ttft))
            for job in jobs
        ]
        getters: dict[asyncio.Future, int] = {}
        status = "disconnected"  # until the stream ends as it should
        try:
            if events.chat:
                for index in range(len(jobs)):
                    yield events.event(None, None, first_delta=True, index=index)
            arrived = list(enumerate(firsts))
            while True:
                for index, item in arrived:
                    choice = choices[index]
                    if isinstance(item, Exception):
                        # The status line went out with the first chunk: the error is an
                        # event of the stream, which then ends as every stream does (vLLM's).
                        yield responses.error_event(as_api_error(item).body())
                        yield responses.DONE
                        status = "error"
                        return
                    if item is not END:
                        if choice.chunks:
                            choice.gaps.chunk()
                        if not choice.chunks and events.echo_of(index) is not None:
                            yield events.echoed(index)
                        choice.chunks.append(item)
                        events.count(index, len(item.token_ids))
                        text = choice.held.feed(item.text) if choice.held else item.text
                        if text or item.logprobs:
                            yield events.event(text, None, entries=item.logprobs, index=index)
                    if item is END or item.finish_reason is not None:
                        choice.done = True
                        last = all(c.done for c in choices)
                        ending = self.ending(choices, index, events, use, last, prompt_tokens)
                        for event in ending:
                            yield event
                    else:
                        getters[asyncio.ensure_future(jobs[index].queue.get())] = index
                if not getters:
                    break
                done, _ = await asyncio.wait(getters, return_when=asyncio.FIRST_COMPLETED)
                arrived = sorted((getters.pop(future), future.result()) for future in done)
            if events.usage_apart:
                yield events.usage(totals(choices, prompt_tokens))
            yield responses.DONE
            status = "ok"
        finally:
            for future in getters:
                future.cancel()
            if status != "ok":  # the client went away, or one choice failed: free the slots
                self.cancel(jobs)
            self.finish(jobs, [c.chunks for c in choices], ttft, status)

    def ending(
        self,
        choices: list[ChoiceStream],
        index: int,
        events: responses.StreamEvents,
        use: ToolUse | None,
        last: bool,
        prompt_tokens: int,
    ) -> list[str]:
        """The events that end choice ``index``: its tool calls or held text, then its
        finish reason, with the usage if it is the ``last`` choice to end."""
        choice = choices[index]
        out = []
        finish = choice.chunks[-1].finish_reason or "length"
        if choice.held is not None:
            reply, finish = reply_of("".join(c.text for c in choice.chunks), use, finish)
            if reply is not None:
                out.append(events.calls(reply.calls, index=index))
            elif choice.held.held:
                out.append(events.event(choice.held.held, None, index=index))
        extra = totals(choices, prompt_tokens) if last and not events.usage_apart else None
        out.append(events.event(None, finish, extra=extra, index=index))
        return out


def totals(choices: list[ChoiceStream], prompt_tokens: int) -> dict:
    """A stream's usage and ``spec_stats``, over all its choices."""
    chunk_lists = [c.chunks for c in choices]
    return {
        "usage": responses.usage(prompt_tokens, chunk_lists),
        "spec_stats": responses.spec_stats(chunk_lists),
    }


@dataclass
class ChoiceStream:
    """One choice of a streamed completion: its chunks so far, its held text (tools),
    the gaps between its chunks, whether it has ended."""

    held: HeldText | None
    gaps: Gaps
    chunks: list[Chunk] = field(default_factory=list)
    done: bool = False


def scores_only(body: CompletionBody) -> bool:
    """Whether a request only scores its prompt (a completion's ``echo`` with
    ``max_tokens`` 0)."""
    return isinstance(body, CompletionRequest) and body.scores_only()


def choice_seed(seed: int | None, index: int) -> int | None:
    """The seed of choice ``index`` of a request with ``seed`` (``n`` > 1): ``seed + index``,
    so that each choice is the request with that seed alone (``seed - index`` past the
    largest seed); None stays None (each choice draws its own)."""
    if seed is None or index == 0:
        return seed
    return seed + index if seed + index <= SEED_RANGE[1] else seed - index


def grammar_param(use: ToolUse | None) -> str:
    """The request field an output grammar came from (what its errors name)."""
    return "tools" if use is not None and use.required else "response_format"


class Gaps:
    """The times between a request's consecutive chunks, as its handler gets them, into
    ``specdec_chunk_gap_seconds`` (the wait for the first is the time to first token);
    ``since``: when the handler got the first."""

    def __init__(self, metrics: ServerMetrics, since: float) -> None:
        self.metrics, self.last = metrics, since

    def chunk(self) -> None:
        now = time.perf_counter()
        self.metrics.chunk_gap.observe(now - self.last)
        self.last = now
