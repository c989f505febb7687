"""FastAPI routes: OpenAI JSON in, scheduler jobs, OpenAI JSON (or SSE chunks) out."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from specdec.config import SamplingParams, SpecConfig
from specdec.engine import Chunk
from specdec.prompting import chat_ids, encode_prompt
from specdec.server.metrics import ServerMetrics
from specdec.server.scheduler import END, Job, QueueFull, Scheduler
from specdec.server.schemas import ChatCompletionRequest, CompletionRequest, _Common


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = (
            status,
            message,
            param,
            code,
            kind,
        )

    def response(self) -> JSONResponse:
        body = {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }
        return JSONResponse(body, status_code=self.status)


def create_app(
    scheduler: Scheduler,
    model_name: str,
    default_k: int | str = "auto",
    default_drafter: str = "model",
    default_max_tokens: int = 256,
) -> FastAPI:
    app = FastAPI(title="specdec", description="OpenAI-compatible speculative decoding server")
    metrics = ServerMetrics()

    def on_queue_change(waiting: int, active: int) -> None:
        metrics.queue_length.set(waiting)
        metrics.active.set(active)

    scheduler.on_queue_change = on_queue_change
    app.state.scheduler, app.state.metrics = scheduler, metrics

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, error: ApiError):
        metrics.requests.labels("error").inc()
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError):
        metrics.requests.labels("error").inc()
        first = error.errors()[0] if error.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        message = (
            f"{where}: {first.get('msg', 'invalid request')}"
            if where
            else first.get("msg", "invalid request")
        )
        return ApiError(400, message, where, "invalid_value").response()

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": model_name}

    @app.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [{"id": model_name, "object": "model", "owned_by": "specdec", "created": 0}],
        }

    @app.get("/metrics")
    async def prometheus():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        prompt_ids = _encode(lambda: encode_prompt(scheduler.tokenizer, body.prompt_text(), "raw"))
        return await _serve(body, prompt_ids, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        messages = [m.model_dump() for m in body.messages]
        prompt_ids = _encode(lambda: chat_ids(scheduler.tokenizer, messages))
        return await _serve(body, prompt_ids, chat=True)

    def _encode(encode) -> list[int]:
        try:
            return encode()
        except ValueError as error:
            raise ApiError(400, str(error), "prompt") from None

    async def _serve(body: _Common, prompt_ids: list[int], chat: bool):
        if body.model not in (None, model_name):
            raise ApiError(
                400,
                f"model {body.model!r} is not served here; use {model_name!r}",
                "model",
                "model_not_found",
            )
        job = Job(
            prompt_ids, _params(body), _spec(body), _drafter(body), asyncio.get_running_loop()
        )
        try:
            scheduler.submit(job)
        except QueueFull as error:
            raise ApiError(
                503, f"server busy: {error}", None, "queue_full", "server_error"
            ) from None
        first = await job.queue.get()
        if isinstance(first, Exception):
            raise ApiError(400, str(first), "prompt" if "prompt" in str(first) else None)
        ttft = time.perf_counter() - job.submitted
        response_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        if body.stream:
            return StreamingResponse(
                _sse(job, first, ttft, response_id, chat), media_type="text/event-stream"
            )
        chunks = [first] + [item async for item in _rest(job)]
        return _full_response(job, chunks, ttft, response_id, chat)

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
        except ValueError as error:
            raise ApiError(400, str(error)) from None

    def _spec(body: _Common) -> SpecConfig:
        k = body.num_speculative_tokens if body.num_speculative_tokens is not None else default_k
        return SpecConfig(k=k)

    def _drafter(body: _Common) -> str:
        kind = body.drafter or default_drafter
        if kind not in scheduler.drafters:
            raise ApiError(
                400,
                f"drafter {kind!r} is not available here; use one of "
                f"{', '.join(scheduler.drafters)}",
                "drafter",
            )
        return kind

    async def _rest(job: Job) -> AsyncIterator[Chunk]:
        while True:
            item = await job.queue.get()
            if item is END:
                return
            if isinstance(item, Exception):
                raise item
            yield item

    def _finish(job: Job, chunks: list[Chunk], ttft: float, status: str) -> None:
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

    def _full_response(
        job: Job, chunks: list[Chunk], ttft: float, response_id: str, chat: bool
    ) -> dict:
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
        }

    async def _sse(
        job: Job, first: Chunk, ttft: float, response_id: str, chat: bool
    ) -> AsyncIterator[str]:
        created = int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"
        chunks: list[Chunk] = []

        def event(
            text: str | None,
            finish: str | None,
            first_delta: bool = False,
            extra: dict | None = None,
        ) -> str:
            if chat:
                delta = ({"role": "assistant", "content": ""} if first_delta else {}) | (
                    {"content": text} if text else {}
                )
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
            payload = {
                "id": response_id,
                "object": kind,
                "created": created,
                "model": model_name,
                "choices": [choice],
                **(extra or {}),
            }
            return f"data: {json.dumps(payload)}\n\n"

        finished = False
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
                    raise item
            last = chunks[-1]
            yield event(
                None,
                last.finish_reason or "length",
                extra={"usage": _usage(job, chunks), "spec_stats": last.stats.to_dict()},
            )
            yield "data: [DONE]\n\n"
            finished = True
        finally:
            if not finished:
                job.cancelled.set()  # the client went away: free the slot at the next round
            _finish(job, chunks, ttft, "ok" if finished else "disconnected")

    return app
