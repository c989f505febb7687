"""Through `specdec serve` (HTTP, the default pair on int4): one streaming chat request, and a
1,445-token chat prompt joining two seconds later; the stream's longest pause between two
chunks as the client saw it, and the server's specdec_chunk_gap_seconds histogram. Once with
the default --prefill-rows, once with 0 (each joining prompt whole).

python serve_long_join.py    (from this folder; about three minutes)
"""

import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from openai import OpenAI

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # bench/, for serving.py
from serving import stop, wait_ready  # noqa: E402

PORT = 8793
LONG = (HERE.parent / "2026-12-05-prefill-passes-xeon-amx/long_prompt.txt").read_text()


def run(flags: list[str]) -> None:
    server = subprocess.Popen(
        ["specdec", "serve", "--dtype", "int4", "--port", str(PORT), *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_ready(PORT)
        client = OpenAI(base_url=f"http://127.0.0.1:{PORT}/v1", api_key="-", timeout=600)
        ask = {"model": "qwen2.5-coder-1.5b-instruct", "temperature": 0}
        client.chat.completions.create(messages=[{"role": "user", "content": "hi"}], **ask)
        arrivals: list[float] = []

        def streaming() -> None:
            stream = client.chat.completions.create(
                messages=[{"role": "user", "content": "Explain how a hash map works."}],
                max_tokens=160,
                stream=True,
                **ask,
            )
            for _ in stream:
                arrivals.append(time.perf_counter())

        thread = threading.Thread(target=streaming)
        thread.start()
        time.sleep(2.0)
        joined = time.perf_counter()
        client.chat.completions.create(
            messages=[{"role": "user", "content": LONG}], max_tokens=16, **ask
        )
        answered = time.perf_counter() - joined
        thread.join()
        gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
        with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics") as response:
            metrics = response.read().decode()
        buckets = re.findall(r'specdec_chunk_gap_seconds_bucket\{le="([^"]+)"\} (\S+)', metrics)
        print(
            f"serve {' '.join(flags) or '(defaults)'}: the stream's longest pause "
            f"{max(gaps):.2f} s, the long request answered in {answered:.2f} s"
        )
        print(
            "  specdec_chunk_gap_seconds (cumulative): "
            + ", ".join(f"<= {le}: {float(n):.0f}" for le, n in buckets)
        )
    finally:
        stop(server)


if __name__ == "__main__":
    for flags in ([], ["--prefill-rows", "0"]):
        run(flags)
