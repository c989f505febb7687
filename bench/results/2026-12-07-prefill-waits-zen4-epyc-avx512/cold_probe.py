"""A fresh `specdec serve` (its defaults): the `choices` prompts of bench/prompt_batches.py
as one request and as 8 in turn, alternated, 3 times each, every time after 4 unrelated
scoring requests (which take the 4 places of recent sequences kept as prefix donors, so
nothing of an earlier try is held); the seconds each took and the prompt tokens copied
instead of computed (`specdec_prefix_reused_tokens_total`). Run from this folder."""

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/
from openai import OpenAI  # noqa: E402
from prompt_batches import questions  # noqa: E402
from serving import stop, wait_ready  # noqa: E402

PORT = 8433


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
        modes = {
            "one request": lambda: client.completions.create(model=model, prompt=texts, **scoring),
            "in turn": lambda: [
                client.completions.create(model=model, prompt=[t], **scoring) for t in texts
            ],
        }
        for attempt in range(6):
            mode = list(modes)[attempt % 2 if attempt < 2 or attempt >= 4 else 1 - attempt % 2]
            run = modes[mode]
            for i in range(4):  # unrelated prompts: nothing of the try before stays held
                client.completions.create(model=model, prompt=f"{attempt} {i} unrelated", **scoring)
            copied, started = reused(), time.perf_counter()
            run()
            seconds = time.perf_counter() - started
            print(f"{mode}: {seconds:.2f} s, {reused() - copied:.0f} prompt tokens copied")
    finally:
        stop(server)


if __name__ == "__main__":
    main()
