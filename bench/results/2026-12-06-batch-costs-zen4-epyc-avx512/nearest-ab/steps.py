"""Each burst of a logged run: its batch sizes step by step, which steps drafted, and the
time and tokens by (size, drafting).

    python steps.py A1     # reads steps-A1.jsonl (sitecustomize.py's log)"""

import json
import sys
from collections import defaultdict

for name in sys.argv[1:]:
    with open(f"steps-{name}.jsonl") as file:
        rows = [json.loads(line) for line in file]
    segments, current = [], [rows[0]]
    for before, step in zip(rows, rows[1:], strict=False):
        if step["n"] > 1 and before["n"] == 1 and step["t"] - before["t"] > 0.5:
            segments.append(current)
            current = []
        current.append(step)
    segments.append(current)
    print("==", name, [len(segment) for segment in segments])
    for segment in segments:
        if max(r["n"] for r in segment) == 1:
            continue  # a solo run
        totals: dict = defaultdict(lambda: [0, 0, 0.0])
        for r in segment:
            entry = totals[(r["n"], r["drafted"] > 0)]
            entry[0] += 1
            entry[1] += r["tokens"]
            entry[2] += r["ms"]
        print("  sizes:   ", "".join(str(r["n"]) if r["n"] < 10 else "+" for r in segment))
        print("  drafting:", "".join("d" if r["drafted"] else "." for r in segment))
        for (n, drafting), (steps, tokens, ms) in sorted(totals.items()):
            print(
                f"   n={n} drafting={drafting} steps={steps} tokens={tokens} ms={ms:.0f} "
                f"tok/s={tokens / ms * 1e3:.1f}"
            )
        span = segment[-1]["t"] - segment[0]["t"]
        print(f"   steps ms {sum(r['ms'] for r in segment):.0f} span {span:.2f} s")
