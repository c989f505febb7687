"""Several prompts in one completion request through `specdec serve` (its defaults), as
lm-evaluation-harness's ``local-completions`` sends a batch: 8 prompts in one request
against the same 8 asked one request after another. Three jobs: scoring texts (``echo``,
``logprobs`` 1, ``max_tokens`` 1, greedy: its log-likelihood requests), the same for 2
multiple-choice questions of 4 answers each (each answer after the question's text, as
lm-eval scores a choice), and greedy completions of 48 tokens (its ``generate_until``).
Every mode must give the same texts and log-probabilities (checked).

    python bench/prompt_batches.py [--passes 3] [--out DIR]

Per job and mode: the wall seconds of all 8 (medians over passes, the modes interleaved).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

from specdec.bench.report import write_table
from specdec.machine import cpu_kind, cpu_name

PORT = 8432
WORKLOADS = Path(__file__).resolve().parent.parent / "src/specdec/bench/workloads"


def prompts() -> list[str]:
    """The bench's code prompts, then its summaries' texts: 8 of different lengths."""

    def read(name: str) -> list[str]:
        lines = (WORKLOADS / name).read_text().splitlines()
        return [json.loads(line)["prompt"] for line in lines]

    return read("code.jsonl")[:5] + read("summary.jsonl")[:3]


def questions() -> list[str]:
    """2 multiple-choice questions (a summary text, then a question) with 4 answers each, as
    lm-evaluation-harness scores them: the context, then each answer after it."""
    lines = (WORKLOADS / "summary.jsonl").read_text().splitlines()
    texts = [json.loads(line)["prompt"] for line in lines][3:5]
    answers = [" speed", " accuracy", " memory use", " the cost of training"]
    return [
        f"{text}\n\nQuestion: what is the text mainly about?\nAnswer:{a}"
        for text in texts
        for a in answers
    ]


def main() -> int:
    from openai import OpenAI
    from serving import stop, wait_ready  # bench/serving.py, beside this script

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    batch = prompts()
    log = open("/tmp/prompt-batches-serve.log", "w")  # noqa: SIM115
    server = subprocess.Popen(["specdec", "serve", "--port", str(PORT)], stdout=log, stderr=log)
    rows: dict[tuple[str, str], list[float]] = {}
    answers: dict[tuple[str, str], list] = {}
    tokens: dict[tuple[str, str], int] = {}
    try:
        wait_ready(PORT)
        client = OpenAI(base_url=f"http://127.0.0.1:{PORT}/v1", api_key="unused", timeout=900)
        model = client.models.list().data[0].id
        scoring = dict(echo=True, logprobs=1, max_tokens=1, temperature=0)
        jobs = {
            "score": (batch, scoring),
            "choices": (questions(), scoring),
            "generate": (batch, dict(max_tokens=args.max_tokens, temperature=0)),
        }

        def ask(job: str, texts: list[str]) -> tuple[list, int]:
            """The answers (text and logprobs each) and the request's tokens, prompt and
            completion."""
            reply = client.completions.create(model=model, prompt=texts, **jobs[job][1])
            answers = [
                (c.text, c.logprobs.token_logprobs if c.logprobs else None)
                for c in sorted(reply.choices, key=lambda c: c.index)
            ]
            return answers, reply.usage.prompt_tokens + reply.usage.completion_tokens

        def in_turn(job: str) -> tuple[list, int]:
            asked = [ask(job, [text]) for text in jobs[job][0]]
            return [a for answers, _ in asked for a in answers], sum(n for _, n in asked)

        modes = {
            "one request, 8 prompts": lambda job: ask(job, jobs[job][0]),
            "8 requests in turn": in_turn,
        }
        ask("generate", batch[:2])  # warm up
        for done in range(args.passes):
            for job in jobs:
                order = list(modes) if done % 2 == 0 else list(reversed(modes))
                for mode in order:
                    started = time.perf_counter()
                    answers[(job, mode)], tokens[(job, mode)] = modes[mode](job)
                    rows.setdefault((job, mode), []).append(time.perf_counter() - started)
    finally:
        stop(server)
    lines = [
        "# 8 prompts in one completion request through `specdec serve` (its defaults)",
        "",
        f"CPU: {cpu_name()} ({cpu_kind()}); {args.passes} passes, medians, modes interleaved. "
        f"score and choices: echo, logprobs 1, max_tokens 1; generate: {args.max_tokens} "
        "tokens; greedy.",
        "",
        "| job | mode | wall s | vs in turn | prompt + completion tokens | same answers |",
        "|---|---|---:|---:|---:|---|",
    ]
    summary = {}
    for job in jobs:
        one_by_one = statistics.median(rows[(job, "8 requests in turn")])
        for mode in modes:
            seconds = statistics.median(rows[(job, mode)])
            same = answers[(job, mode)] == answers[(job, "8 requests in turn")]
            summary[f"{job} / {mode}"] = {
                "seconds": seconds,
                "runs": rows[(job, mode)],
                "speedup_over_in_turn": one_by_one / seconds,
                "tokens": tokens[(job, mode)],
                "same_answers": same,
            }
            lines.append(
                f"| {job} | {mode} | {seconds:.2f} | {one_by_one / seconds:.2f}x | "
                f"{tokens[(job, mode)]} | {same} |"
            )
    return write_table(lines, summary, args.out, "results.md", "prompt_batches.json")


if __name__ == "__main__":
    raise SystemExit(main())
