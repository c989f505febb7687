"""Two probes of the `choices` prompts of bench/prompt_batches.py (2 questions x 4 answers,
scored as lm-evaluation-harness does) through a fresh `specdec serve` (its defaults), each
printing the seconds a try took and the prompt tokens copied instead of computed
(`specdec_prefix_reused_tokens_total`). Run from this folder:

    python probes.py cold          # one request and 8 in turn, alternated, 3 tries each
    python probes.py after-score   # the bench's order, 3 tries

`cold`: each try after 4 unrelated scoring requests, which in the versions measured here
(c4267eb, c81389d) took the 4 places of recent sequences kept as prefix donors, so nothing
of an earlier try was held. `after-score`: the `score` job (8 unrelated prompts as one
request, then in turn), then the `choices` prompts as one request."""

import argparse
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/
from openai import OpenAI  # noqa: E402
from prompt_batches import prompts, questions  # noqa: E402
from serving import stop, wait_ready  # noqa: E402

PORT = 8433
SCORING = dict(echo=True, logprobs=1, max_tokens=1, temperature=0)


def reused() -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics").read().decode()
    lines = [line for line in text.splitlines() if line.startswith("specdec_prefix_reused")]
    return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0


def timed(label: str, run) -> None:
    copied, started = reused(), time.perf_counter()
    run()
    seconds = time.perf_counter() - started
    print(f"{label}: {seconds:.2f} s, {reused() - copied:.0f} prompt tokens copied")


def cold(client: OpenAI, model: str) -> None:
    texts = questions()
    modes = {
        "one request": lambda: client.completions.create(model=model, prompt=texts, **SCORING),
        "in turn": lambda: [
            client.completions.create(model=model, prompt=[t], **SCORING) for t in texts
        ],
    }
    for attempt in range(6):
        mode = list(modes)[attempt % 2 if attempt < 2 or attempt >= 4 else 1 - attempt % 2]
        for i in range(4):  # unrelated prompts
            client.completions.create(model=model, prompt=f"{attempt} {i} unrelated", **SCORING)
        timed(mode, modes[mode])


def after_score(client: OpenAI, model: str) -> None:
    for _ in range(3):
        client.completions.create(model=model, prompt=prompts(), **SCORING)
        for text in prompts():
            client.completions.create(model=model, prompt=[text], **SCORING)
        timed(
            "after the score job, one request",
            lambda: client.completions.create(model=model, prompt=questions(), **SCORING),
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("probe", choices=["cold", "after-score"])
    probe = {"cold": cold, "after-score": after_score}[parser.parse_args().probe]
    server = subprocess.Popen(
        ["specdec", "serve", "--port", str(PORT)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_ready(PORT)
        client = OpenAI(base_url=f"http://127.0.0.1:{PORT}/v1", api_key="unused", timeout=900)
        model = client.models.list().data[0].id
        texts = questions()
        for i in range(4):  # warm up: a scoring request of 8 prompts
            client.completions.create(
                model=model, prompt=[f"{i} {t[::-1]}" for t in texts], **SCORING
            )
        probe(client, model)
    finally:
        stop(server)


if __name__ == "__main__":
    main()
