"""Conversations under load: N chat clients of `specdec serve` (its defaults), each holding a
conversation of several turns, as a chat application's users do.

python bench/conversations.py [--clients 8] [--turns 4] [--max-tokens 48] [--rounds 2]
                              [--out DIR]

Each client begins with a prompt of the bench's workloads, no two the same (at most 33 in
all: clients x rounds), and, after each reply, sends
the whole conversation again with a follow-up (the history grows by its reply and the
follow-up every turn, so a turn's prompt begins like the one before it and its reply). All
clients start together, streaming, greedy; --rounds times, each with other questions.
Reported: wall time of a round, time to first token (p50, p90) of first turns and of later
turns (a later turn's history can be copied from the cache of the turn before it, where the
server still holds it: ``BatchedModel.retire``), and the prompt tokens the server copied
instead of computing (``specdec_prefix_reused_tokens_total``) against the prompt tokens
sent; the replies go to the JSON file (greedy: the same whatever the load or the caches
copied). Loopback only; the machine should be otherwise idle.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from openai import OpenAI
from serving import stop, wait_ready  # bench/serving.py, beside this script

from specdec.bench.report import write_table
from specdec.machine import cpu_kind, cpu_name

PORT = 8436
WORKLOADS = Path(__file__).resolve().parent.parent / "src/specdec/bench/workloads"
FOLLOW_UPS = [
    "Can you give an example?",
    "Explain that more simply.",
    "What is a common mistake here?",
    "Summarize your answer in one sentence.",
    "How would you test that?",
]


def questions() -> list[str]:
    """Every workload's prompts (chat, code, edits, summaries; 33), taken in turn: a
    conversation's opening, no two the same."""
    kinds = []
    for name in ("chat", "code", "edit", "summary"):
        lines = (WORKLOADS / f"{name}.jsonl").read_text().splitlines()
        kinds.append([json.loads(line)["prompt"] for line in lines])
    longest = max(len(kind) for kind in kinds)
    return [kind[i] for i in range(longest) for kind in kinds if i < len(kind)]


def reused_tokens() -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics") as reply:
        text = reply.read().decode()
    lines = [line for line in text.splitlines() if line.startswith("specdec_prefix_reused")]
    return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0


def converse(client: OpenAI, model: str, question: str, turns: int, max_tokens: int) -> list:
    """One client's conversation: (turn, seconds to first token, prompt tokens, reply) per
    turn."""
    messages = [{"role": "user", "content": question}]
    measured = []
    for turn in range(turns):
        started, first, parts = time.perf_counter(), None, []
        stream = client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        prompt_tokens = 0
        for event in stream:
            if event.choices and event.choices[0].delta.content:
                first = first or time.perf_counter() - started
                parts.append(event.choices[0].delta.content)
            if event.usage is not None:
                prompt_tokens = event.usage.prompt_tokens
        reply = "".join(parts)
        measured.append((turn, first if first is not None else float("nan"), prompt_tokens, reply))
        messages += [
            {"role": "assistant", "content": reply},
            {"role": "user", "content": FOLLOW_UPS[turn % len(FOLLOW_UPS)]},
        ]
    return measured


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.clients * args.rounds > len(questions()):
        parser.error(f"--clients x --rounds at most {len(questions())}: no opening twice")
    log = open("/tmp/conversations-serve.log", "w")  # noqa: SIM115
    server = subprocess.Popen(["specdec", "serve", "--port", str(PORT)], stdout=log, stderr=log)
    asked = questions()
    rows = []
    try:
        wait_ready(PORT)
        client = OpenAI(base_url=f"http://127.0.0.1:{PORT}/v1", api_key="unused", timeout=900)
        model = client.models.list().data[0].id
        converse(client, model, "Hello!", 1, 8)  # warm up
        for round_ in range(args.rounds):
            start = round_ * args.clients
            mine = asked[start : start + args.clients]
            copied, began = reused_tokens(), time.perf_counter()
            with ThreadPoolExecutor(args.clients) as pool:
                talk = lambda q: converse(client, model, q, args.turns, args.max_tokens)  # noqa: E731
                talks = list(pool.map(talk, mine))
            wall = time.perf_counter() - began
            turns = [t for talk in talks for t in talk]
            firsts = [s for turn, s, _, _ in turns if turn == 0]
            laters = [s for turn, s, _, _ in turns if turn > 0]
            rows.append(
                {
                    "round": round_ + 1,
                    "wall_s": wall,
                    "ttft_first_p50": statistics.median(firsts),
                    "ttft_first_p90": percentile(firsts, 0.9),
                    "ttft_later_p50": statistics.median(laters),
                    "ttft_later_p90": percentile(laters, 0.9),
                    "prompt_tokens": sum(n for _, _, n, _ in turns),
                    "copied_tokens": reused_tokens() - copied,
                    "replies": [[reply for _, _, _, reply in talk] for talk in talks],
                }
            )
    finally:
        stop(server)
    lines = [
        f"# {args.clients} conversations of {args.turns} turns at once through `specdec serve`",
        "",
        f"CPU: {cpu_name()} ({cpu_kind()}); {args.max_tokens} tokens a reply, greedy, "
        "streamed. Time to first token in seconds; copied: prompt tokens the server copied "
        "from a cache instead of computing.",
        "",
        "| round | wall s | first turns p50 / p90 | later turns p50 / p90 | copied / prompt |",
        "|---:|---:|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['round']} | {row['wall_s']:.1f} | {row['ttft_first_p50']:.2f} / "
            f"{row['ttft_first_p90']:.2f} | {row['ttft_later_p50']:.2f} / "
            f"{row['ttft_later_p90']:.2f} | {row['copied_tokens']:.0f} / {row['prompt_tokens']} |"
        )
    return write_table(lines, {"rounds": rows}, args.out, "results.md", "conversations.json")


if __name__ == "__main__":
    sys.exit(main())
