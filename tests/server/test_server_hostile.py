"""A hostile or careless client against a real uvicorn server on loopback.

Every loop here is bounded in count and time; traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import openai
import pytest

from helpers import char_tokenizer, tiny_llama
from servers import MODEL, Running, post
from specdec.server.guard import Limits


@pytest.fixture(scope="module")
def server(models):
    running = Running(*models, max_active=2, max_queue=4, limits=Limits(max_body_bytes=100_000))
    yield running
    running.close()


def raw(server, method: str, path: str, body: bytes = b"", headers: dict | None = None):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    connection.request(method, path, body, {"Content-Type": "application/json", **(headers or {})})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, dict(response.getheaders()), data


def error_of(data: bytes) -> dict:
    payload = json.loads(data)
    assert set(payload) == {"error"}, payload
    assert set(payload["error"]) == {"message", "type", "param", "code"}
    return payload["error"]


def test_a_large_k_is_refused(server):
    status, payload = post(
        server, "/v1/completions", {"prompt": "x", "num_speculative_tokens": 1000}
    )
    assert status == 400 and payload["error"]["param"] == "num_speculative_tokens"
    status, _ = post(
        server, "/v1/completions", {"prompt": "x", "max_tokens": 3, "num_speculative_tokens": 16}
    )
    assert status == 200


def test_a_large_body_gets_413_at_once_and_health_stays_fast(server):
    """5 MB announced by Content-Length: refused before it is read."""
    started = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    connection.putrequest("POST", "/v1/completions")
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(5_000_000))
    connection.endheaders()
    with contextlib.suppress(OSError):  # the server may close first: that is the point
        connection.send(b'{"prompt": "' + b"a" * 50_000)
    response = connection.getresponse()
    assert response.status == 413
    assert error_of(response.read())["code"] == "request_too_large"
    assert time.perf_counter() - started < 2.0
    connection.close()
    health_started = time.perf_counter()
    status, _, _ = raw(server, "GET", "/health")
    assert status == 200 and time.perf_counter() - health_started < 0.1


def test_a_chunked_body_over_the_limit_gets_413(server):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    body = (b'{"prompt": "' + b"a" * 200_000 + b'"}' for _ in range(1))
    connection.request(
        "POST", "/v1/completions", body, {"Content-Type": "application/json"}, encode_chunked=True
    )
    response = connection.getresponse()
    assert response.status == 413
    connection.close()


@pytest.mark.parametrize(
    "body",
    [b'{"prompt": "a\\ud800"}', b'{"messages": [{"role": "user", "content": "\\udfff b"}]}'],
)
def test_a_lone_surrogate_is_400(server, body):
    path = "/v1/chat/completions" if b"messages" in body else "/v1/completions"
    status, _, data = raw(server, "POST", path, body)
    assert status == 400 and "surrogate" in error_of(data)["message"]


def test_sequential_requests_never_get_503(models):
    running = Running(*models, max_active=1, max_queue=0)
    try:
        for i in range(40):
            status, payload = post(running, "/v1/completions", {"prompt": f"s{i}", "max_tokens": 3})
            assert status == 200, (i, payload)
    finally:
        running.close()


@pytest.fixture(scope="module")
def slow_model():
    """A request of 3,000 tokens on it takes seconds: no EOS ends it early."""
    tokenizer = char_tokenizer()
    tokenizer.eos_token = None
    return tiny_llama(seed=0, layers=6, max_positions=4096, eos=None), tokenizer


@pytest.mark.parametrize(
    ("n", "stream"), [(1, False), (3, False), (3, True)], ids=["one", "three", "three streamed"]
)
def test_an_abandoned_request_frees_its_slots(slow_model, n, stream):
    """The slots (one a choice) must be free well before the 3,000 tokens could be done."""
    model, tokenizer = slow_model
    running = Running(model, None, tokenizer, max_active=1, max_queue=n - 1)
    try:
        body = json.dumps(
            {"prompt": "long", "max_tokens": 3000, "drafter": "none", "temperature": 0.9, "seed": 1}
            | {"n": n, "stream": stream}
        )
        sock = socket.create_connection(("127.0.0.1", running.port))
        request = (
            f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}"
        )
        sock.sendall(request.encode())
        deadline = time.time() + 10
        while not running.scheduler._active and time.time() < deadline:
            time.sleep(0.005)
        sock.close()  # the client leaves before the answer
        left = time.time()
        while running.scheduler._admitted and time.time() < left + 5:
            time.sleep(0.02)
        assert running.scheduler._admitted == 0, "the abandoned request kept its slot"
        assert time.time() - left < 1.5
        _, _, metrics = raw(running, "GET", "/metrics")
        assert 'specdec_requests_total{status="disconnected"} 1.0' in metrics.decode()
    finally:
        running.close()


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "hi", "max_tokens": "3"}, "max_tokens"),
        ({"prompt": "hi", "max_tokens": True}, "max_tokens"),
        ({"prompt": "hi", "temperature": "0.5"}, "temperature"),
        ({"prompt": "hi", "seed": 2**70}, "seed"),
        ({"prompt": "hi", "tools": []}, "tools"),
        ({"prompt": "hi", "response_format": {"type": "json_schema"}}, "response_format"),
        ({"prompt": "hi", "response_format": {"type": "yaml"}}, "response_format.type"),
        ({"prompt": "hi", "guided_regex": "a(b"}, "response_format"),
        ({"prompt": "hi", "guided_regex": "a", "guided_grammar": "start: /a/"}, "response_format"),
        ({"prompt": "hi", "logprobs": 21}, "logprobs"),
        ({"prompt": "hi", "suffix": "!"}, None),
        ({"prompt": "hi", "logit_bias": {"x": 5}}, "logit_bias"),
        ({"prompt": "hi", "logit_bias": {"1": 500}}, "logit_bias"),
        ({"prompt": "hi", "logit_bias": {"1": "5"}}, "logit_bias.1"),
        ({"prompt": "hi", "logit_bias": {"99999999": 5}}, "logit_bias"),
        ({"prompt": "hi", "presence_penalty": 2.5}, "presence_penalty"),
        ({"prompt": "hi", "frequency_penalty": -3}, "frequency_penalty"),
        ({"prompt": "hi", "repetition_penalty": 0}, "repetition_penalty"),
        ({"prompt": "hi", "repetition_penalty": 5e-324}, "repetition_penalty"),
        ({"prompt": "hi", "stop": ["a"] * 17}, "stop"),
        ({"prompt": "hi", "stop": ["a" * 300]}, "stop"),
        ({"prompt": ["a"] * 129}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": [1, -2]}, "prompt"),
        ({"prompt": [1, 99999999]}, "prompt"),
        ({"prompt": [[1], []]}, "prompt"),
        ({"prompt": [[1], [2, 99999999]]}, "prompt"),
        ({"prompt": ["a", [2]]}, "prompt"),
        ({"prompt": [1, "a"]}, "prompt"),
        ({"prompt": [1, True]}, "prompt"),
        ({"prompt": "hi", "stop_token_ids": [99999]}, "stop_token_ids"),
        ({"prompt": "hi", "stop_token_ids": [-1]}, "stop_token_ids"),
        ({"prompt": "hi", "ignore_eos": 1}, "ignore_eos"),
        ({"prompt": "hi", "min_tokens": 9, "max_tokens": 8}, "min_tokens"),
        (
            {"prompt": "hi", "min_tokens": 2, "response_format": {"type": "json_object"}},
            "min_tokens",
        ),
        ({"prompt": "hi", "prediction": {"type": "content", "content": "a" * 400}}, "prediction"),
        ({"prompt": "hi", "prediction": {"type": "text", "content": "ab"}}, "prediction.type"),
    ],
)
def test_bad_fields_are_named_in_an_openai_error(server, body, param):
    status, payload = post(server, "/v1/completions", body)
    assert status == 400, payload
    error = payload["error"]
    assert error["type"] == "invalid_request_error"
    if param:
        assert error["param"] == param, error
    assert "str" not in (error["param"] or "").split("."), "no pydantic union tags"


@pytest.mark.parametrize(
    ("body", "message", "param"),
    [
        ({"top_logprobs": 2}, "top_logprobs needs logprobs: true", "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "less than or equal to 20", "top_logprobs"),
        ({"logprobs": 3}, "boolean", "logprobs"),
    ],
)
def test_bad_chat_logprobs_are_400(server, body, message, param):
    """Each names its field in param, a check across fields (top_logprobs without logprobs)
    the one its message begins with."""
    messages = [{"role": "user", "content": "hi"}]
    status, payload = post(server, "/v1/chat/completions", {"messages": messages, **body})
    assert status == 400 and message in payload["error"]["message"], payload
    assert payload["error"]["param"] == param, payload


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),  # 0 goes with echo
        (
            {"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"},
            "tool_choice",
        ),
        (  # "give tools or response_format ..., not both": it begins with no field
            {
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "response_format": {"type": "json_object"},
            },
            None,
        ),
    ],
)
def test_a_check_across_fields_names_the_field_it_begins_with(server, body, param):
    """Checks of the whole body name the field their message begins with, where the body
    has it ("give one of ..." names none)."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    status, payload = post(server, path, body)
    assert status == 400 and payload["error"]["param"] == param, payload


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("GET", "/nowhere", b"", 404),
        ("GET", "/v1/completions", b"", 405),
        ("POST", "/v1/completions", b"\xff\xfe not utf-8", 400),
        ("POST", "/v1/completions", b"{broken", 400),
    ],
)
def test_every_error_body_is_openai_shaped(server, method, path, body, status):
    got, _, data = raw(server, method, path, body)
    assert got == status
    error_of(data)


def test_a_full_server_says_when_to_retry(slow_model):
    model, tokenizer = slow_model
    running = Running(model, None, tokenizer, max_active=1, max_queue=0)
    try:
        connection = http.client.HTTPConnection("127.0.0.1", running.port, timeout=30)
        body = json.dumps({"prompt": "long", "max_tokens": 3000, "stream": True, "drafter": "none"})
        connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        response.fp.readline()
        status, headers, data = raw(
            running, "POST", "/v1/completions", b'{"prompt": "x", "drafter": "none"}'
        )
        assert status == 503 and headers.get("retry-after") == "1"
        assert error_of(data)["code"] == "queue_full"
        connection.close()
    finally:
        running.close()


def test_metrics_show_no_active_requests_when_idle(server):
    post(server, "/v1/completions", {"prompt": "x", "max_tokens": 3})
    time.sleep(0.1)
    _, _, data = raw(server, "GET", "/metrics")
    assert "specdec_active_requests 0.0" in data.decode()


def test_an_api_key_is_required_when_set(models):
    running = Running(*models, api_key="sesame")
    try:
        status, _, data = raw(running, "POST", "/v1/completions", b'{"prompt": "x"}')
        assert status == 401 and error_of(data)["code"] == "invalid_api_key"
        status, _, _ = raw(
            running,
            "POST",
            "/v1/completions",
            b'{"prompt": "x"}',
            {"Authorization": "Bearer wrong"},
        )
        assert status == 401
        for path in ("/tokenize", "/detokenize"):
            status, _, data = raw(running, "POST", path, b'{"prompt": "x", "tokens": [1]}')
            assert status == 401 and error_of(data)["code"] == "invalid_api_key"
        assert raw(running, "GET", "/tokenizer_info")[0] == 401
        client = openai.OpenAI(base_url=running.url + "/v1", api_key="sesame", max_retries=0)
        assert client.completions.create(model=MODEL, prompt="x", max_tokens=2).choices
        assert raw(running, "GET", "/health")[0] == 200  # health needs no key
    finally:
        running.close()


def test_a_foreign_host_header_is_refused_on_loopback(models):
    running = Running(*models, allowed_hosts=("127.0.0.1", "localhost", "::1"))
    try:
        assert raw(running, "GET", "/health")[0] == 200
        status, _, data = raw(running, "GET", "/v1/models", headers={"Host": "evil.example"})
        assert status == 400 and error_of(data)["code"] == "invalid_host"
    finally:
        running.close()


SERVER_SCRIPT = """
import sys, uvicorn
from specdec.bench.tiny import char_tokenizer, tiny_llama, perturbed_copy
from specdec.server import Scheduler, create_app
tokenizer = char_tokenizer()
target = tiny_llama(seed=0, layers=24, max_positions=4096, eos=None)
scheduler = Scheduler(target, tokenizer, perturbed_copy(target, noise=0.03, seed=1))
scheduler.start()
try:
    uvicorn.run(create_app(scheduler, "tiny"), host="127.0.0.1", port=int(sys.argv[1]),
                log_level="warning", timeout_graceful_shutdown=3)
finally:
    scheduler.stop()
"""


def test_sigterm_ends_the_server_in_bounded_time_with_a_request_in_flight(tmp_path: Path):
    from servers import free_port

    port = free_port()
    script = tmp_path / "serve.py"
    script.write_text(SERVER_SCRIPT)
    process = subprocess.Popen([sys.executable, str(script), str(port)], env=os.environ.copy())
    try:
        deadline = time.time() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.time() < deadline, "server did not start"
                time.sleep(0.1)
        body = json.dumps({"prompt": "long", "max_tokens": 4000, "temperature": 0.9})

        def long_request():
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            try:
                connection.request(
                    "POST", "/v1/completions", body, {"Content-Type": "application/json"}
                )
                connection.getresponse().read()
            except OSError:
                pass

        threading.Thread(target=long_request, daemon=True).start()
        time.sleep(1.0)
        started = time.perf_counter()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=20)
        assert time.perf_counter() - started < 8.0
    finally:
        if process.poll() is None:
            process.kill()


def test_schemathesis_finds_no_server_error_and_no_schema_mismatch(server):
    """A bounded property-based run against /openapi.json (fixed seed: deterministic)."""
    checks = "not_a_server_error,response_schema_conformance,status_code_conformance"
    checks += ",content_type_conformance"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "run",
            server.url + "/openapi.json",
            "-n",
            "30",
            "--seed",
            "1",
            "-c",
            checks,
            "--request-timeout",
            "30",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "failed" not in run.stdout.split("SUMMARY")[-1]


def test_a_json_schema_is_read_and_one_this_vocabulary_cannot_spell_is_a_400(server):
    """OpenAI's json_schema shape reaches the grammar: the tiny vocabulary has no "{", so the
    request is refused naming response_format, and the server keeps serving."""
    schema = {"name": "thing", "schema": {"type": "object"}, "strict": True}
    body = {"prompt": "hi", "response_format": {"type": "json_schema", "json_schema": schema}}
    for stream in (False, True):
        status, payload = post(server, "/v1/completions", {**body, "stream": stream})
        assert status == 400, payload
        assert payload["error"]["param"] == "response_format"
        assert "the grammar cannot go on" in payload["error"]["message"]
    status, _ = post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 2})
    assert status == 200


def test_choices_that_do_not_all_fit_are_503_and_none_is_kept(slow_model):
    """n = 2 with one place left: a 503, and the choice that found a place gives it back;
    n above what the server holds at all is a 400 naming n."""
    model, tokenizer = slow_model
    running = Running(model, None, tokenizer, max_active=1, max_queue=1)
    try:
        long = {"prompt": "long", "max_tokens": 3000, "drafter": "none"}
        threading.Thread(target=post, args=(running, "/v1/completions", long), daemon=True).start()
        deadline = time.time() + 10
        while not running.scheduler._active and time.time() < deadline:
            time.sleep(0.005)
        status, payload = post(
            running, "/v1/completions", {"prompt": "x", "n": 2, "drafter": "none"}
        )
        assert status == 503 and payload["error"]["code"] == "queue_full", payload
        assert running.scheduler._admitted == 1
        status, payload = post(
            running, "/v1/completions", {"prompt": "x", "n": 3, "drafter": "none"}
        )
        assert status == 400 and payload["error"]["param"] == "n", payload
    finally:
        running.close()
