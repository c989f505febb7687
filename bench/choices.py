"""Several choices of one request (``n``) through `specdec serve` (its defaults): one request
with n = 4 against the same four choices asked one after another (n = 1, seed + i each) and
four at once from four client threads. Seeded sampling, so every mode must give the same
four texts (checked).

    python bench/choices.py [--passes 3] [--max-tokens 96] [--n 4] [--out DIR]

Per request and mode: the wall seconds of all four choices and their tokens per second
together (medians over passes, the modes interleaved).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from specdec.bench.report import write_table
from specdec.machine import cpu_kind, cpu_name

PORT = 8431
REQUESTS = {
    "code": "Write a Python function that checks whether a string is a palindrome.",
    "chat": "Give three tips for writing clear commit messages.",
}


def main() -> int:
    from openai import OpenAI
    from serving import stop, wait_ready  # bench/serving.py, beside this script

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    log = open("/tmp/choices-serve.log", "w")  # noqa: SIM115
    server = subprocess.Popen(["specdec", "serve", "--port", str(PORT)], stdout=log, stderr=log)
    rows: dict[tuple[str, str], list[tuple[float, int]]] = {}
    texts: dict[tuple[str, str], list[str]] = {}
    try:
        wait_ready(PORT)
        client = OpenAI(base_url=f"http://127.0.0.1:{PORT}/v1", api_key="unused", timeout=900)
        model = client.models.list().data[0].id

        def ask(prompt: str, n: int, seed: int) -> list[tuple[str, int]]:
            reply = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": prompt}],
                max_tokens=args.max_tokens,
                temperature=0.8,
                seed=seed,
                n=n,
            )
            tokens = reply.usage.completion_tokens // n
            return [(c.message.content or "", tokens) for c in reply.choices]

        modes = {
            f"one request, n={args.n}": lambda p: ask(p, args.n, 7),
            f"{args.n} requests in turn": lambda p: [ask(p, 1, 7 + i)[0] for i in range(args.n)],
            f"{args.n} requests at once": lambda p: [
                r[0]
                for r in ThreadPoolExecutor(args.n).map(lambda i: ask(p, 1, 7 + i), range(args.n))
            ],
        }
        ask("warm up", 2, 1)
        for done in range(args.passes):
            for name, prompt in REQUESTS.items():
                order = list(modes) if done % 2 == 0 else list(reversed(modes))
                for mode in order:
                    started = time.perf_counter()
                    answers = modes[mode](prompt)
                    seconds = time.perf_counter() - started
                    tokens = sum(t for _, t in answers)
                    rows.setdefault((name, mode), []).append((seconds, tokens))
                    texts[(name, mode)] = [text for text, _ in answers]
    finally:
        stop(server)
    lines = [
        f"# {args.n} choices of one request through `specdec serve` (its defaults), "
        f"{args.max_tokens} tokens, temperature 0.8, seeded",
        "",
        f"CPU: {cpu_name()} ({cpu_kind()}); {args.passes} passes, medians, modes interleaved.",
        "",
        "| request | mode | wall s | tok/s (all choices) | vs in turn | same texts |",
        "|---|---|---:|---:|---:|---|",
    ]
    summary = {}
    for name in REQUESTS:
        in_turn = statistics.median(s for s, _ in rows[(name, f"{args.n} requests in turn")])
        reference = texts[(name, f"{args.n} requests in turn")]
        for mode in modes:
            seconds = statistics.median(s for s, _ in rows[(name, mode)])
            tokens = rows[(name, mode)][-1][1]
            same = texts[(name, mode)] == reference
            summary[f"{name} / {mode}"] = {
                "seconds": seconds,
                "tokens": tokens,
                "tokens_per_second": tokens / seconds,
                "speedup_over_in_turn": in_turn / seconds,
                "same_texts": same,
            }
            lines.append(
                f"| {name} | {mode} | {seconds:.2f} | {tokens / seconds:.1f} | "
                f"{in_turn / seconds:.2f}x | {same} |"
            )
    return write_table(lines, summary, args.out, "results.md", "choices.json")


if __name__ == "__main__":
    raise SystemExit(main())
