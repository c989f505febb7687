"""How much of the batched steps' time did plain steps' work, per logged run.

    python efficiency.py A1 C1 A2 C2     # reads steps-A1.jsonl ... (sitecustomize.py's log)

Efficiency: the tokens of all batched steps over what plain steps of 8 would take at this
run's own rate (which divides out the machine's speed), against those steps' time. The time
lost in drafting steps is their time less what their tokens take at that rate."""

import json
import sys


def read(name: str) -> list[dict]:
    with open(f"steps-{name}.jsonl") as file:
        return [json.loads(line) for line in file]


def lost(steps: list[dict], rate: float) -> float:
    return sum(r["ms"] for r in steps) - sum(r["tokens"] for r in steps) / rate


for name in sys.argv[1:]:
    batched = [r for r in read(name) if r["n"] > 1]
    plain8 = [r for r in batched if r["n"] == 8 and not r["drafted"]]
    rate = sum(r["tokens"] for r in plain8) / sum(r["ms"] for r in plain8)  # tokens a ms
    small = [r for r in batched if r["n"] < 8 and r["drafted"]]
    at8 = [r for r in batched if r["n"] == 8 and r["drafted"]]
    total = sum(r["ms"] for r in batched)
    tokens = sum(r["tokens"] for r in batched)
    print(
        f"{name}: plain-8 {rate * 1e3:.1f} tok/s; batched steps {total / 1e3:.2f} s; "
        f"drafting steps <8: {len(small)} ({sum(r['ms'] for r in small):.0f} ms, "
        f"lost {lost(small, rate):.0f} ms); drafting steps at 8: {len(at8)} "
        f"({sum(r['ms'] for r in at8):.0f} ms, lost {lost(at8, rate):.0f} ms); "
        f"tokens {tokens}; efficiency {tokens / rate / total:.3f}"
    )
