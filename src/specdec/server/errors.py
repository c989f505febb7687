"""Errors as OpenAI shapes them: ``ApiError`` for what a request did wrong (or the server
could not do), and handlers that send every error, FastAPI's own ones included, as
``{"error": {message, type, param, code}}`` with OpenAI's status codes (400, not 422)."""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from specdec.server.guard import error_body, error_response
from specdec.server.metrics import ServerMetrics
from specdec.server.scheduler import ServerStopping

_TYPE_TAGS = {"str", "int", "float", "bool", "none", "list", "dict"}
ERROR_SCHEMA = {
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
        """OpenAI's error shape (``response`` sends it)."""
        return error_body(self.message, self.param, self.code, self.kind)

    def response(self) -> Response:
        return error_response(
            self.status, self.message, self.param, self.code, self.kind, self.headers
        )


class ClientGone(Exception):
    """The client closed the connection while its request was waiting or decoding."""


def as_api_error(error: Exception) -> ApiError:
    """What the worker reported for a job: a shutdown (503), or the engine refusing the
    request (a ValueError naming the problem: 400)."""
    if isinstance(error, ServerStopping):
        return ApiError(503, str(error), None, "shutting_down", "server_error")
    if isinstance(error, ValueError):
        message = str(error)
        param = "response_format" if message.startswith("constraint") else None
        return ApiError(400, message, "prompt" if "prompt" in message else param)
    return ApiError(500, f"internal error: {error}", None, "internal_error", "server_error")


def install_error_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
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
        if param is None:  # a check of the whole body: the field its message begins with
            return error_response(400, message, _named_first(message, error.body))
        return error_response(400, f"{param}: {message}", param)

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


def _named_first(message: str, body: Any) -> str | None:
    """The field of ``body`` that ``message`` (a check across fields) names first, as
    "top_logprobs needs logprobs: true" does; None where it begins otherwise."""
    word = re.match(r"[a-z_]+", message)
    if word is None or not isinstance(body, dict) or word.group() not in body:
        return None
    return word.group()


def _param_name(loc) -> str | None:
    """('body', 'messages', 0, 'content', 'str') -> 'messages[0].content' (pydantic's
    union tags such as 'str', 'list[str]' or a model's name, 'TokenizeChat', dropped)."""
    name = ""
    for part in list(loc)[1:]:
        if isinstance(part, int):
            name += f"[{part}]"
        elif part.lower() in _TYPE_TAGS or "[" in part or "(" in part or part[:1].isupper():
            continue
        else:
            name += f".{part}" if name else part
    return name or None


def document_400_not_422(app: FastAPI) -> None:
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
