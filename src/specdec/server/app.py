"""The FastAPI app: OpenAI's routes over a scheduler (``service.Service`` answers each
request), the guard in front (Host, API key, body size, before the body is read), errors in
OpenAI's shape (``errors``), Prometheus metrics.

Order of work per request, cheapest first: the guard; pydantic's strict parse; the model,
drafter, k and stop limits; sampling parameters; then tokenization in a worker thread (never
on the event loop); then the prompt length; then the scheduler. A client that leaves,
streaming or not, cancels its job.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from specdec.prompting import chat_ids
from specdec.server.errors import ERROR_SCHEMA, document_400_not_422, install_error_handlers
from specdec.server.guard import Guard, Limits
from specdec.server.metrics import ServerMetrics
from specdec.server.scheduler import Scheduler
from specdec.server.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    Detokenize,
    TokenizeBody,
)
from specdec.server.service import Service


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
    service = Service(
        scheduler=scheduler,
        model_name=model_name,
        default_k=default_k,
        default_drafter=default_drafter,
        default_max_tokens=default_max_tokens,
        limits=limits,
        metrics=metrics,
        replica=replica,
    )
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
    install_error_handlers(app, metrics)
    responses: dict[int | str, dict[str, Any]] = {
        400: ERROR_SCHEMA,
        401: ERROR_SCHEMA,
        413: ERROR_SCHEMA,
        503: ERROR_SCHEMA,
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

    card = {
        "id": model_name,
        "object": "model",
        "owned_by": "specdec",
        "created": 0,
        "max_model_len": scheduler.max_length,  # vLLM's extension
    }

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [card]}

    @app.get("/v1/models/{model_id:path}", responses={404: ERROR_SCHEMA})
    async def model(model_id: str):
        """OpenAI's retrieve: the served model's card; any other name is a 404."""
        service.check_model(model_id, 404)
        return card

    @app.get(
        "/metrics",
        response_class=Response,
        responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus"}},
    )
    async def prometheus():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/completions", responses=streamed)
    async def completions(body: CompletionRequest, request: Request):
        service.check_cheap(body)
        return await service.serve(body, service.completion_prompts(body), request)

    @app.post("/v1/chat/completions", responses=streamed)
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        service.check_cheap(body)
        messages = [m.as_template_message() for m in body.messages]
        tools, opens, continues = (
            body.template_tools(),
            body.opens_turn(),
            body.continue_final_message,
        )
        return await service.serve(
            body,
            lambda: [chat_ids(scheduler.tokenizer, messages, tools, opens, continues)],
            request,
        )

    @app.post("/tokenize", responses=responses)
    async def tokenize(body: TokenizeBody):
        """vLLM's: a prompt's (or a conversation's) token ids, as the completions give them."""
        return await service.tokenize(body)

    @app.get("/tokenizer_info", responses=responses)
    async def tokenizer_info():
        """vLLM's: the tokenizer's special tokens and chat template, the context length."""
        return service.tokenizer_info()

    @app.post("/detokenize", responses=responses)
    async def detokenize(body: Detokenize):
        """vLLM's: token ids' text."""
        return await service.detokenize(body)

    document_400_not_422(app)
    return app
