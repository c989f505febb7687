"""What `specdec chat` gains by keeping the conversation in the caches: a 4-turn
conversation, greedy, 64 tokens a reply, on the default pair (int4), each turn answered by
the engine that answered the turns before (its caches hold the conversation: `kept`) and by
freshly loaded models (empty caches: `cold`, as a new `specdec generate` of the whole
conversation would be, loading not counted). Time to the first chunk and to the reply's end,
per turn; the replies must be identical.

    python chat_turns.py [--passes 2]
"""

import argparse
import statistics
import time

from specdec import SamplingParams, SpecConfig
from specdec.cli import build_parser
from specdec.cli.generate import build_engine
from specdec.machine import cpu_name
from specdec.prompting import chat_ids

ASKED = [
    "Write a Python function that parses a CSV line into a list of fields, handling quotes.",
    "Now make it accept a custom delimiter.",
    "Add a docstring and type hints.",
    "Write three pytest tests for it.",
]


def engine():
    args = build_parser().parse_args(["chat", "--dtype", "int4", "--drafter", "lookup+model"])
    return build_engine(
        args, args.drafter, lambda tok, _: chat_ids(tok, [{"role": "user", "content": "hello"}])
    )[0]


def turn(eng, messages):
    ids = chat_ids(eng.target.tokenizer, messages)
    began, first, text = time.perf_counter(), None, ""
    params = SamplingParams(max_tokens=64, temperature=0)
    for chunk in eng.stream(ids, params, SpecConfig(k="auto")):
        first = first or time.perf_counter() - began
        text += chunk.text
    return text, first, time.perf_counter() - began, len(ids)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--passes", type=int, default=2)
    passes = parser.parse_args().passes
    print(f"CPU: {cpu_name()}")
    times = {"kept": [[] for _ in ASKED], "cold": [[] for _ in ASKED]}
    replies = {}
    for p in range(passes):
        kept = engine()
        messages: list[dict] = []
        for i, asked in enumerate(ASKED):
            messages.append({"role": "user", "content": asked})
            for mode in ("kept", "cold"):  # side by side, turn by turn
                eng = kept if mode == "kept" else engine()
                text, first, total, prompt = turn(eng, messages)
                times[mode][i].append((first, total, prompt))
                replies.setdefault((p, i), set()).add(text)
            messages.append({"role": "assistant", "content": text})
    same = all(len(texts) == 1 for texts in replies.values())
    print(f"replies identical kept/cold: {same}")
    print("| turn | prompt tokens | kept: first chunk, reply (s) | cold: first chunk, reply (s) |")
    print("|---|---|---|---|")
    for i in range(len(ASKED)):
        row = [f"{i + 1}", f"{times['kept'][i][0][2]}"]
        for mode in ("kept", "cold"):
            firsts = [t[0] for t in times[mode][i]]
            totals = [t[1] for t in times[mode][i]]
            row.append(
                f"{statistics.median(firsts):.2f} ({min(firsts):.2f}-{max(firsts):.2f}), "
                f"{statistics.median(totals):.2f} ({min(totals):.2f}-{max(totals):.2f})"
            )
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
