"""A session with the official openai client against specdec serve on the real default pair.

python bench/server_session.py
"""

import subprocess
import time
import urllib.request

from openai import OpenAI

server_log = open("/tmp/serve.err", "w")  # noqa: SIM115 (open for the server's whole life)
server = subprocess.Popen(
    ["specdec", "serve", "--port", "8765"],
    stdout=subprocess.DEVNULL,
    stderr=server_log,
)
try:
    deadline = time.time() + 300
    while True:
        try:
            urllib.request.urlopen("http://127.0.0.1:8765/health", timeout=2)
            break
        except Exception:
            assert time.time() < deadline
            time.sleep(2)
    client = OpenAI(base_url="http://127.0.0.1:8765/v1", api_key="unused")
    print("models:", [m.id for m in client.models.list().data])
    print("--- streamed chat completion ---")
    started = time.time()
    text = ""
    for chunk in client.chat.completions.create(
        model="qwen2.5-coder-1.5b-instruct",
        stream=True,
        max_tokens=64,
        temperature=0,
        messages=[{"role": "user", "content": "Write a Python function that reverses a string."}],
    ):
        piece = chunk.choices[0].delta.content or ""
        text += piece
        if chunk.choices[0].finish_reason:
            print(text)
            print(
                "finish:",
                chunk.choices[0].finish_reason,
                "spec_stats:",
                {
                    k: chunk.model_extra["spec_stats"][k]
                    for k in ("acceptance_rate", "mean_accepted_length", "tokens_per_second")
                },
            )
    print(f"wall {time.time() - started:.1f} s")
    r = client.completions.create(
        model="qwen2.5-coder-1.5b-instruct",
        prompt="def fibonacci(n):\n",
        max_tokens=48,
        temperature=0,
    )
    print("--- completion ---")
    print(r.choices[0].text)
    print(
        "usage:",
        r.usage.model_dump(),
        "acceptance:",
        r.model_extra["spec_stats"]["acceptance_rate"],
    )
    metrics = urllib.request.urlopen("http://127.0.0.1:8765/metrics").read().decode()
    print("--- /metrics (acceptance lines) ---")
    for line in metrics.splitlines():
        if line.startswith(
            (
                "specdec_drafted_tokens_total",
                "specdec_accepted_tokens_total",
                "specdec_acceptance_rate",
                "specdec_mean_accepted_length_sum",
                "specdec_mean_accepted_length_count",
                "specdec_requests_total",
            )
        ):
            print(line)
finally:
    server.terminate()
    server.wait(timeout=30)
