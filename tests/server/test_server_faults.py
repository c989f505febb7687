"""Issue 45's server items against a real uvicorn server on loopback: no input gives a 500,
a failure mid-stream ends the stream properly, drafter recipes are a bounded set, and a
client that leaves while queued gives its place back."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.request

import pytest

from helpers import backend
from servers import Running, post
from specdec import Engine, SamplingParams
from specdec.engine import Run


@pytest.fixture(scope="module")
def server(models):
    running = Running(*models, max_active=2, max_queue=8)
    yield running
    running.close()


def test_a_temperature_float32_cannot_divide_by_is_greedy(server, models):
    # Issue 45.1: 1e-300 is 0 in float32; the server answered 500 every time.
    target, _, tokenizer = models
    greedy = Engine(backend(target, tokenizer)).generate(
        tokenizer.encode("hello"), SamplingParams(max_tokens=12, temperature=0.0)
    )
    for body in (
        {"prompt": "hello", "max_tokens": 12, "temperature": 1e-300},
        {"prompt": "hello", "max_tokens": 12, "temperature": 1e-300, "seed": 3},
        {"prompt": "hello", "max_tokens": 12, "temperature": 1e-300, "stream": False, "top_k": 2},
    ):
        status, payload = post(server, "/v1/completions", body)
        assert status == 200, payload
        assert payload["choices"][0]["text"] == greedy.text


def test_drafter_recipes_are_a_bounded_set(server):
    # Issue 45.8: any '/'-choice of chains was accepted, each building drafters and keeping
    # a controller of its own for the server's life.
    for recipe in ("lookup/model/lookup+model/model+lookup", "model+lookup/lookup"):
        status, payload = post(
            server,
            "/v1/completions",
            {"prompt": "x", "max_tokens": 2, "drafter": recipe, "num_speculative_tokens": "auto"},
        )
        assert status == 400 and payload["error"]["param"] == "drafter", recipe
    offered = server.scheduler.drafters
    for recipe in [*offered, "model+lookup"]:  # a chain in another order is still a chain
        status, _ = post(
            server,
            "/v1/completions",
            {"prompt": "x", "max_tokens": 2, "drafter": recipe, "num_speculative_tokens": "auto"},
        )
        assert status == 200, recipe
    assert len(server.scheduler.controllers) <= len(offered) + 1


@pytest.fixture(scope="module")
def refusing_template(models):
    target, draft, tokenizer = models
    tokenizer = tokenizer.__class__(tokenizer_object=tokenizer.backend_tokenizer)
    tokenizer.chat_template = (
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system turns') }}"
        "{% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    running = Running(target, draft, tokenizer)
    yield running
    running.close()


def test_a_chat_template_that_refuses_the_messages_is_a_400(refusing_template):
    # Issue 45.9: a Jinja TemplateError escaped as a plain-text 500.
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    status, payload = post(
        refusing_template, "/v1/chat/completions", {"messages": messages, "max_tokens": 2}
    )
    assert status == 400 and "no system turns" in payload["error"]["message"]
    status, _ = post(
        refusing_template, "/v1/chat/completions", {"messages": messages[1:], "max_tokens": 2}
    )
    assert status == 200


def test_a_tokenizer_without_a_chat_template_is_a_400(models):
    target, draft, tokenizer = models
    bare = tokenizer.__class__(tokenizer_object=tokenizer.backend_tokenizer)
    bare.chat_template = None
    running = Running(target, draft, bare)
    try:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        status, payload = post(running, "/v1/chat/completions", body)
        assert status == 400 and "no chat template" in payload["error"]["message"]
    finally:
        running.close()


def test_a_gguf_without_a_chat_template_and_a_template_that_raises_are_value_errors():
    # Issue 45.9: llama.cpp's tokenizer rendered a missing template as a TypeError (a 500).
    from specdec.backends.llamacpp import LlamaCppTokenizer
    from specdec.prompting import chat_ids

    tokenizer = object.__new__(LlamaCppTokenizer)
    tokenizer.encode = lambda text: [len(text)]  # type: ignore[method-assign]
    messages = [{"role": "user", "content": "hi"}]
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        chat_ids(tokenizer, messages)
    tokenizer.chat_template = "{{ raise_exception('user turns only after a system turn') }}"
    with pytest.raises(ValueError, match="refused these messages: user turns only"):
        chat_ids(tokenizer, messages)
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert chat_ids(tokenizer, messages) == [2]


@pytest.mark.parametrize("reply", ["hel", "hel  ", "  "])
def test_a_gguf_continues_the_final_message_as_transformers_does(reply):
    """continue_final_message on llama.cpp's tokenizer: the prompt transformers renders
    from the same template (cut after the last message's text, a message the template
    strips included); a message with no text to continue is a ValueError."""
    from helpers import char_tokenizer
    from specdec.backends.llamacpp import LlamaCppTokenizer

    template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] | trim }}</s>{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": reply}]
    gguf = object.__new__(LlamaCppTokenizer)
    gguf.encode = lambda text: list(text)  # type: ignore[method-assign]
    gguf.chat_template = template
    hf = char_tokenizer()
    hf.chat_template = template
    ending = dict(add_generation_prompt=False, continue_final_message=True, tokenize=False)
    if not reply.strip():
        with pytest.raises(ValueError, match="no text to continue"):
            gguf.apply_chat_template(messages, **ending)
        return
    expected = hf.apply_chat_template(messages, **ending)
    assert "".join(gguf.apply_chat_template(messages, **ending)) == expected
    assert expected.endswith("<assistant>hel")


def test_a_failure_after_the_first_event_ends_the_stream_with_an_error_event(server, monkeypatch):
    # Issue 45.10: the error was re-raised; the client saw a cut stream, no error, no [DONE].
    original = Run.finish_round

    def fails_after_two_tokens(self, *args, **kwargs):
        if self.context[:2] == [6, 1] and len(self.generated) >= 2:  # the prompt "fa..."
            raise RuntimeError("the worker failed")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Run, "finish_round", fails_after_two_tokens)
    gaps_before = _gauge(server, "specdec_chunk_gap_seconds_count")
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    # greedy: 7 tokens before its EOS on float32 and int8, 30 on int4
    body = {"prompt": "fail here", "max_tokens": 30, "stream": True, "temperature": 0}
    body["num_speculative_tokens"] = 1
    connection.request(
        "POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"}
    )
    response = connection.getresponse()
    assert response.status == 200
    events = [line for line in response.read().decode().split("\n\n") if line]
    connection.close()
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2].removeprefix("data: "))
    assert error["error"]["code"] == "internal_error" and "the worker failed" in str(error)
    assert any('"text"' in event for event in events[:-2])  # it had begun
    # a gap is the wait between two chunks: the error is no chunk (as when not streamed)
    texts = sum('"text"' in event for event in events[:-2])  # every chunk has text here
    assert _gauge(server, "specdec_chunk_gap_seconds_count") - gaps_before == texts - 1
    status, _ = post(server, "/v1/completions", {"prompt": "x", "max_tokens": 2})
    assert status == 200  # and the server keeps serving


def _gauge(running, name: str) -> float:
    with urllib.request.urlopen(running.url + "/metrics") as metrics:
        line = next(x for x in metrics.read().decode().splitlines() if x.startswith(name + " "))
    return float(line.split()[-1])


def test_a_client_that_leaves_while_queued_gives_its_place_back(models, monkeypatch):
    # Issue 45.11: a queued job kept its place until it reached an active slot, so clients
    # that left could keep the queue full and others got 503.
    original, released = Run.finish_round, threading.Event()
    prompt = "hold the slot"
    hold = models[2].encode(prompt)

    def held(self, *args, **kwargs):
        # The first request holds the only active slot until the test is done: its rounds
        # after the first wait, whatever the runtime would decode.
        if self.context[: len(hold)] == hold and self.stats.rounds >= 1:
            released.wait(timeout=30)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Run, "finish_round", held)
    running = Running(*models, max_active=1, max_queue=1)
    try:
        first = http.client.HTTPConnection("127.0.0.1", running.port, timeout=30)
        body = {"prompt": prompt, "max_tokens": 200, "stream": True, "temperature": 0}
        first.request(
            "POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        stream = first.getresponse()
        stream.fp.readline()
        queued = socket.create_connection(("127.0.0.1", running.port))
        request = json.dumps({"prompt": "x", "max_tokens": 2}).encode()
        queued.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (len(request), request)
        )
        deadline = time.time() + 10
        while _gauge(running, "specdec_queue_length") < 1:
            assert time.time() < deadline, "the second request never queued"
            time.sleep(0.05)
        queued.close()
        while _gauge(running, "specdec_queue_length") > 0:
            assert time.time() < deadline, "the abandoned queued request kept its place"
            time.sleep(0.05)
        assert _gauge(running, "specdec_active_requests") == 1  # the first is still decoding
        # a third request is queued now, not refused: no answer within a second (a 503
        # would come at once)
        third = http.client.HTTPConnection("127.0.0.1", running.port, timeout=1)
        third.request("POST", "/v1/completions", request, {"Content-Type": "application/json"})
        with pytest.raises(TimeoutError):
            third.getresponse()
        third.close()
        first.close()
    finally:
        released.set()
        running.close()


def test_the_pair_is_loaded_on_a_thread_that_ends_and_its_errors_reach_the_caller(monkeypatch):
    """``load_scheduler`` loads on a thread of its own (so that the caller's thread keeps no
    OpenMP pool to compete with the scheduler's worker, ``load_scheduler``'s docstring),
    which has ended when it returns; what loading raises is raised in the caller."""
    from specdec.models import ModelError
    from specdec.server import setup

    seen: list[threading.Thread] = []

    def loaded(config, progress=None):
        seen.append(threading.current_thread())
        if config.target == "missing":
            raise ModelError("no model named missing")
        return "a scheduler"

    monkeypatch.setattr(setup, "build_scheduler", loaded)
    assert setup.load_scheduler(setup.ServerConfig("tiny", None)) == "a scheduler"
    assert seen[0] is not threading.current_thread() and not seen[0].is_alive()
    with pytest.raises(ModelError, match="no model named missing"):
        setup.load_scheduler(setup.ServerConfig("missing", None))
