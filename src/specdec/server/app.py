"""FastAPI routes: OpenAI JSON in, scheduler jobs, OpenAI JSON (or SSE chunks) out.

Order of work per request, cheapest first: the guard (Host, API key, body size) before the
body is read; pydantic's strict parse; the model, drafter, k and stop limits; sampling
parameters; then tokenization in a worker thread (never on the event loop); then the prompt
length; then the scheduler. A client that leaves, streaming or not, cancels its job.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from specdec.config import SamplingParams, SpecConfig
from specdec.engine import Chunk
from specdec.prompting import chat_ids, encode_prompt
from specdec.server.guard import Guard, Limits, error_response
from specdec.server.metrics import ServerMetrics
from specdec.server.scheduler import END, Job, QueueFull, Scheduler, ServerStopping
from specdec.server.schemas import ChatCompletionRequest, CompletionRequest, _Common

RETRY_AFTER_SECONDS = 1
_TYPE_TAGS = {"str", "int", "float", "bool", "none", "list", "dict"}
_ERROR_SCHEMA = {
    "description": "an OpenAI-shaped error: {'error': {message, type, param, code}}",
    "content": {"application/json": {}},
}


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.kind, self.headers = kind, headers

    def body(self) -> dict:
        """OpenAI's error shape (``guard.error_response`` sends it as a response)."""
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> Response:
        return error_response(
            self.status, self.message, self.param, self.code, self.kind, self.headers
        )


class ClientGone(Exception):
    """The client closed the connection while its request was waiting or decoding."""


def create_app(
    scheduler: Scheduler,
    model_name: str,
    default_k: int | str = "auto",
    default_drafter: str = "model",
    default_max_tokens: int = 256,
    limits: Limits | None = None,
    api_key: str | None = None,
    allowed_hosts: tuple[str, ...] | None = None,
    replica: str | None = None,
) -> FastAPI:
    """``replica`` names this process among several (Ray Serve): responses carry it as
    OpenAI's ``system_fingerprint`` and /metrics as ``specdec_replica_info``."""
    limits = limits or Limits()
    metrics = ServerMetrics(replica)
    scheduler.on_queue_change = metrics.set_queue
    scheduler.on_batched_pass = metrics.batch_requests.observe
    scheduler.on_prefix_reused = metrics.prefix_reused.inc

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        scheduler.cancel_all()  # shutting down: every waiting handler returns at once

    app = FastAPI(
        title="specdec",
        description="OpenAI-compatible speculative decoding server",
        lifespan=lifespan,
    )
    app.add_middleware(Guard, limits=limits, api_key=api_key, allowed_hosts=allowed_hosts)
    app.state.scheduler, app.state.metrics = scheduler, metrics
    _install_error_handlers(app, metrics)
    responses: dict[int | str, dict[str, Any]] = {
        400: _ERROR_SCHEMA,
        401: _ERROR_SCHEMA,
        413: _ERROR_SCHEMA,
        503: _ERROR_SCHEMA,
    }
    streamed: dict[int | str, dict[str, Any]] = {
        200: {
            "description": "the completion, or server-sent events when stream is true",
            "content": {"application/json": {}, "text/event-stream": {}},
        },
        **responses,
    }

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": model_name}

    @app.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [{"id": model_name, "object": "model", "owned_by": "specdec", "created": 0}],
        }

    @app.get(
        "/metrics",
        response_class=Response,
        responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus"}},
    )
    async def prometheus():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/completions", responses=streamed)
    async def completions(body: CompletionRequest, request: Request):
        _check_cheap(body)
        text = body.prompt_text()
        return await _serve(body, lambda: encode_prompt(scheduler.tokenizer, text, "raw"), request)

    @app.post("/v1/chat/completions", responses=streamed)
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        _check_cheap(body)
        messages = [m.as_template_message() for m in body.messages]
        return await _serve(body, lambda: chat_ids(scheduler.tokenizer, messages), request)

    def _check_cheap(body: _Common) -> None:
        if body.model not in (None, model_name):
            message = f"model {body.model!r} is not served here; use {model_name!r}"
            raise ApiError(400, message, "model", "model_not_found")
        kind = body.drafter or default_drafter
        if not scheduler.offers(kind):
            available = ", ".join(scheduler.drafters)
            raise ApiError(400, f"drafter {kind!r} is not available; use {available}", "drafter")
        k = body.num_speculative_tokens
        if isinstance(k, int) and k > limits.max_k:
            message = f"num_speculative_tokens must be <= {limits.max_k} (or 'auto'), got {k}"
            raise ApiError(400, message, "num_speculative_tokens")
        if "/" in kind and (default_k if k is None else k) not in ("auto", 0):
            message = (
                f"drafter {kind!r} is a choice made from measured rounds, as k is: "
                "num_speculative_tokens must be 'auto'"
            )
            raise ApiError(400, message, "num_speculative_tokens")
        stop = body.stop_strings()
        if len(stop) > limits.max_stop or any(len(s) > limits.max_stop_chars for s in stop):
            message = (
                f"stop: at most {limits.max_stop} strings of at most "
                f"{limits.max_stop_chars} characters"
            )
            raise ApiError(400, message, "stop")

    def _params(body: _Common) -> SamplingParams:
        try:
            return SamplingParams(
                max_tokens=body.token_budget(default_max_tokens),
                temperature=body.temperature,
                top_k=body.top_k,
                top_p=body.top_p,
                seed=body.seed,
                stop=body.stop_strings(),
            )
        except ValueError as error:  # SamplingParams' messages start with the field's name
            raise ApiError(400, str(error), str(error).split()[0]) from None

    def _spec(body: _Common) -> SpecConfig:
        k = body.num_speculative_tokens
        return SpecConfig(k=default_k if k is None else k, verification=body.verification)

    async def _serve(body: _Common, encode, request: Request):
        params, spec = _params(body), _spec(body)
        try:
            prompt_ids = await run_in_threadpool(encode)
        except ValueError as error:
            raise ApiError(400, str(error), "prompt") from None
        _check_length(prompt_ids, params)
        loop = asyncio.get_running_loop()
        job = Job(prompt_ids, params, spec, body.drafter or default_drafter, loop)
        try:
            scheduler.submit(job)
        except QueueFull as error:
            raise ApiError(
                503,
                f"server busy: {error}",
                None,
                "queue_full",
                "server_error",
                {"Retry-After": str(RETRY_AFTER_SECONDS)},
            ) from None
        try:
            first = await _next(job, request)
        except ClientGone:
            return _gone(job, [])
        if isinstance(first, Exception):
            raise _as_api_error(first)
        ttft = time.perf_counter() - job.submitted
        chat = isinstance(body, ChatCompletionRequest)
        response_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        if body.stream:
            return StreamingResponse(
                _sse(job, first, ttft, response_id, chat), media_type="text/event-stream"
            )
        chunks = [first]
        try:
            while chunks[-1].finish_reason is None:
                item = await _next(job, request)
                if item is END:
                    break
                if isinstance(item, Exception):
                    raise _as_api_error(item)
                chunks.append(item)
        except ClientGone:
            return _gone(job, chunks)
        return _full_response(job, chunks, ttft, response_id, chat)

    def _check_length(prompt_ids: list[int], params: SamplingParams) -> None:
        limit = limits.max_prompt_tokens
        if limit is not None and len(prompt_ids) > limit:
            message = f"prompt has {len(prompt_ids)} tokens; this server takes at most {limit}"
            raise ApiError(400, message, "prompt", "context_length_exceeded")

    async def _next(job: Job, request: Request):
        """The job's next item; ClientGone (and the job cancelled) if the client left.
        The connection is looked at every 0.2 s, however fast items arrive."""
        getter = asyncio.ensure_future(job.queue.get())
        while True:
            now = time.perf_counter()
            if now - job.checked >= 0.2:
                job.checked = now
                if await request.is_disconnected():
                    getter.cancel()
                    scheduler.cancel(job)
                    raise ClientGone
            done, _ = await asyncio.wait({getter}, timeout=0.2)
            if done:
                return getter.result()

    def _gone(job: Job, chunks: list[Chunk]) -> Response:
        _finish(job, chunks, None, "disconnected")
        return Response(status_code=499)  # nobody reads it: the client has gone

    def _finish(job: Job, chunks: list[Chunk], ttft: float | None, status: str) -> None:
        if chunks:
            metrics.record(chunks[-1].stats, time.perf_counter() - job.submitted, ttft)
        metrics.requests.labels(status).inc()

    def _usage(job: Job, chunks: list[Chunk]) -> dict:
        completion = sum(len(c.token_ids) for c in chunks)
        return {
            "prompt_tokens": len(job.prompt_ids),
            "completion_tokens": completion,
            "total_tokens": len(job.prompt_ids) + completion,
        }

    def _full_response(job, chunks: list[Chunk], ttft: float, response_id: str, chat: bool):
        _finish(job, chunks, ttft, "ok")
        text = "".join(c.text for c in chunks)
        finish = chunks[-1].finish_reason or "length"
        choice = (
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
            if chat
            else {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
        )
        return {
            "id": response_id,
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": [choice],
            "usage": _usage(job, chunks),
            "spec_stats": chunks[-1].stats.to_dict(),
            "system_fingerprint": replica,
        }

    async def _sse(
        job: Job, first: Chunk, ttft: float, response_id: str, chat: bool
    ) -> AsyncIterator[str]:
        created = int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"
        chunks: list[Chunk] = []

        def event(text: str | None, finish: str | None, first_delta=False, extra=None) -> str:
            if chat:
                delta = {"role": "assistant", "content": ""} if first_delta else {}
                delta |= {"content": text} if text else {}
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
            payload = {
                "id": response_id,
                "object": kind,
                "created": created,
                "model": model_name,
                "choices": [choice],
                "system_fingerprint": replica,
                **(extra or {}),
            }
            return f"data: {json.dumps(payload)}\n\n"

        status = "disconnected"  # until the stream ends as it should
        try:
            if chat:
                yield event(None, None, first_delta=True)
            item = first
            while True:
                chunks.append(item)
                if item.text:
                    yield event(item.text, None)
                if item.finish_reason is not None:
                    break
                item = await job.queue.get()
                if item is END:
                    break
                if isinstance(item, Exception):
                    # The status line went out with the first chunk: the error is an event
                    # of the stream, which then ends as every stream does (vLLM's shape).
                    yield f"data: {json.dumps(_as_api_error(item).body())}\n\n"
                    yield "data: [DONE]\n\n"
                    status = "error"
                    return
            last = chunks[-1]
            extra = {"usage": _usage(job, chunks), "spec_stats": last.stats.to_dict()}
            yield event(None, last.finish_reason or "length", extra=extra)
            yield "data: [DONE]\n\n"
            status = "ok"
        finally:
            if status == "disconnected":
                scheduler.cancel(job)  # the client went away: free the slot at the next round
            _finish(job, chunks, ttft, status)

    _document_400_not_422(app)
    return app


def _as_api_error(error: Exception) -> ApiError:
    """What the worker reported for a job: a shutdown (503), or the engine refusing the
    request (a ValueError naming the problem: 400)."""
    if isinstance(error, ServerStopping):
        return ApiError(503, str(error), None, "shutting_down", "server_error")
    if isinstance(error, ValueError):
        return ApiError(400, str(error), "prompt" if "prompt" in str(error) else None)
    return ApiError(500, f"internal error: {error}", None, "internal_error", "server_error")


def _install_error_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
    """Every error leaves as an OpenAI-shaped body, FastAPI's own ones included."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, error: ApiError):
        metrics.requests.labels("error").inc()
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError):
        metrics.requests.labels("error").inc()
        first = error.errors()[0] if error.errors() else {}
        if first.get("type") == "json_invalid":
            return error_response(400, "the body is not valid JSON", None, "invalid_json")
        param = _param_name(first.get("loc", ()))
        message = first.get("msg", "invalid request").removeprefix("Value error, ")
        if first.get("type") == "extra_forbidden":
            message = "not supported by this server"
        return error_response(400, f"{param}: {message}" if param else message, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, error: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code)
        return error_response(error.status_code, str(error.detail), None, code)

    @app.exception_handler(Exception)
    async def _internal(request: Request, error: Exception):
        # A fault of the server's, never of the request: still OpenAI's JSON, not plain text.
        metrics.requests.labels("error").inc()
        message = f"internal error: {type(error).__name__}: {error}"
        return error_response(500, message, None, "internal_error", "server_error")


def _param_name(loc) -> str | None:
    """('body', 'messages', 0, 'content', 'str') -> 'messages[0].content' (pydantic's
    union tags such as 'str' or 'list[str]' dropped)."""
    name = ""
    for part in list(loc)[1:]:
        if isinstance(part, int):
            name += f"[{part}]"
        elif part.lower() in _TYPE_TAGS or "[" in part or "(" in part:
            continue
        else:
            name += f".{part}" if name else part
    return name or None


def _document_400_not_422(app: FastAPI) -> None:
    """Bad input is answered 400 (OpenAI's code); FastAPI documents 422 on its own."""
    build = app.openapi

    def openapi():
        if app.openapi_schema is None:
            schema = build()
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented override
