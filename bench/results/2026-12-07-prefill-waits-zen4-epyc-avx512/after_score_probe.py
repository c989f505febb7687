"""A fresh `specdec serve` (its defaults), three times: the `score` job of
bench/prompt_batches.py (8 unrelated prompts as one request, then in turn), then its
`choices` prompts as one request, as that bench orders them; the seconds that took and the
prompt tokens copied instead of computed (`specdec_prefix_reused_tokens_total`)."""

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/  # bench/
from openai import OpenAI  # noqa: E402
from prompt_batches import prompts, questions  # noqa: E402
from serving import stop, wait_ready  # noqa: E402

PORT = 8434


def reused() -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics").read().decode()
    lines = [line for line in text.splitlines() if line.startswith("specdec_prefix_reused")]
    return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0


def main() -> None:
    server = subprocess.Popen(
        ["specdec", "serve", "--port", str(PORT)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_ready(PORT)
        client = OpenAI(base_url=f"http://127.0.0.1:{PORT}/v1", api_key="unused", timeout=900)
        model = client.models.list().data[0].id
        scoring = dict(echo=True, logprobs=1, max_tokens=1, temperature=0)
        texts = questions()
        for i in range(4):  # warm up: a scoring request of 8 prompts
            client.completions.create(
                model=model, prompt=[f"{i} {t[::-1]}" for t in texts], **scoring
            )
        for _ in range(3):
            client.completions.create(model=model, prompt=prompts(), **scoring)
            for p in prompts():
                client.completions.create(model=model, prompt=[p], **scoring)
            copied, started = reused(), time.perf_counter()
            client.completions.create(model=model, prompt=texts, **scoring)
            seconds = time.perf_counter() - started
            print(
                f"after the score job, one request: {seconds:.2f} s, {reused() - copied:.0f} copied"
            )
    finally:
        stop(server)


if __name__ == "__main__":
    main()
