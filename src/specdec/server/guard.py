"""What a request must pass before any work is done: the Host header, the API key and the
body's size. A pure ASGI middleware, so an oversized body is refused before it is read
(by its Content-Length) or as soon as it grows past the limit (a chunked upload)."""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from fastapi.responses import JSONResponse

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


# What an API key guards: the model's routes (health and metrics stay open, as vLLM's).
KEYED_PATHS = ("/v1/", "/tokenize", "/detokenize", "/tokenizer_info")


@dataclass(frozen=True)
class Limits:
    """Request limits; the defaults are documented in ``specdec serve --help``."""

    max_body_bytes: int = 2 * 1024 * 1024  # a 32k-token prompt is about 130 kB of text
    max_prompt_tokens: int | None = None  # None: the target's context
    # OpenAI's API takes 4; lm-evaluation-harness's HumanEval sends 5 and the EOS text
    max_stop: int = 16
    max_stop_chars: int = 256
    max_k: int = 16  # num_speculative_tokens: one round must not stall the others


def error_response(
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    kind: str = "invalid_request_error",
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """An error response shaped as OpenAI's API shapes it."""
    return JSONResponse(error_body(message, param, code, kind), status_code=status, headers=headers)


def error_body(
    message: str, param: str | None, code: str | None, kind: str = "invalid_request_error"
) -> dict:
    """OpenAI's error body: ``{"error": {message, type, param, code}}``."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class Guard:
    """Host check (DNS rebinding), ``Authorization: Bearer`` check, body size limit."""

    def __init__(
        self,
        app,
        limits: Limits,
        api_key: str | None = None,
        allowed_hosts: tuple[str, ...] | None = None,
    ):
        self.app, self.limits, self.api_key = app, limits, api_key
        self.allowed_hosts = None if allowed_hosts is None else {h.lower() for h in allowed_hosts}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = self._refusal(scope["path"], headers)
        if refusal is not None:
            return await refusal(scope, receive, send)
        if "content-length" in headers or scope["method"] in ("GET", "HEAD"):
            # uvicorn holds the body to its Content-Length, checked above.
            return await self.app(scope, receive, send)
        # A body without a length (chunked): read it here, up to the limit, then replay it.
        messages, size = [], 0
        while True:
            message = await receive()
            messages.append(message)
            size += len(message.get("body", b""))
            if size > self.limits.max_body_bytes:
                return await self._too_large()(scope, receive, send)
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        replay = iter(messages)

        async def replayed():
            return next(replay, None) or await receive()

        await self.app(scope, replayed, send)

    def _refusal(self, path: str, headers: dict[str, str]) -> JSONResponse | None:
        if self.allowed_hosts is not None and _host_name(headers.get("host", "")) not in (
            self.allowed_hosts
        ):
            return error_response(
                400,
                "Host header not allowed by this server (see --allowed-host)",
                None,
                "invalid_host",
            )
        if self.api_key is not None and path.startswith(KEYED_PATHS):
            given = headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
                return error_response(
                    401,
                    "missing or wrong API key: send 'Authorization: Bearer KEY'",
                    None,
                    "invalid_api_key",
                )
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.limits.max_body_bytes:
            return self._too_large()
        return None

    def _too_large(self) -> JSONResponse:
        return error_response(
            413,
            f"request body over {self.limits.max_body_bytes} bytes (see --max-body-bytes)",
            None,
            "request_too_large",
        )


def _host_name(host: str) -> str:
    """'127.0.0.1:8000' -> '127.0.0.1'; '[::1]:8000' -> '::1'."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host
