"""A real uvicorn server on a loopback port over tiny models, for the server's tests: the
models on each runtime, a running server, and requests as a client sends them."""

import json
import socket
import threading
import time
import urllib.error
import urllib.request

import uvicorn

from helpers import backend
from specdec import Engine, SamplingParams, SpecConfig
from specdec.drafters import ModelDrafter
from specdec.server import Scheduler, create_app

MODEL = "tiny-test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Running:
    def __init__(
        self,
        target,
        draft,
        tokenizer,
        limits=None,
        api_key=None,
        allowed_hosts=None,
        **scheduler_options,
    ):
        self.scheduler = Scheduler(target, tokenizer, draft, **scheduler_options)
        self.scheduler.start()
        self.app = create_app(
            self.scheduler,
            MODEL,
            default_k=3,
            limits=limits,
            api_key=api_key,
            allowed_hosts=allowed_hosts,
        )
        self.port = free_port()
        self.server = uvicorn.Server(
            uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started:
            assert time.time() < deadline, "server did not start"
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}"

    def close(self):
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.scheduler.stop()


def alone(
    models,
    prompt: str,
    max_tokens: int,
    k,
    seed=None,
    temperature=0.0,
    stop=(),
    logprobs=None,
    **fields,
):
    """What the engine gives for this request by itself (``fields``: more of its
    ``SamplingParams``)."""
    target, draft, tokenizer = models
    engine = Engine(backend(target, tokenizer), ModelDrafter(backend(draft)))
    params = SamplingParams(
        max_tokens=max_tokens, temperature=temperature, seed=seed, stop=stop, logprobs=logprobs,
        **fields,
    )  # fmt: skip
    return engine.generate(tokenizer.encode(prompt), params, SpecConfig(k=k))


def post(server, path, body: bytes | dict):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(
        server.url + path, data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())
