"""Whole generations in ONE process (greedy, 96 tokens, the int4 pair, three prompts): plain and
the model drafter with k auto, the Python before commit fdea6f3 and after swapped in turning
order; tok/s medians, and every output checked identical to plain.

    python generate_ab.py ROUNDS
"""

import statistics
import sys

from python_before import NEW, OLD, use

from specdec import Engine, SamplingParams, SpecConfig
from specdec.drafters import ModelDrafter
from specdec.loading import load_backend
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.prompting import encode_prompt
from specdec.runtime import load_draft

target = load_backend(DEFAULT_TARGET, "int4")
draft, _ = load_draft(DEFAULT_DRAFT, "int4", target_runtime="int4")
prompts = [
    ("def quicksort(arr):", "raw"),
    ("Write a Python function that merges two sorted lists.", "chat"),
    ("What are some good habits for getting better sleep?", "chat"),
]
res = {}
for rnd in range(int(sys.argv[1])):
    for pi, (p, mode) in enumerate(prompts):
        ids = encode_prompt(target.tokenizer, p, mode)
        for side in ("old", "new") if rnd % 2 == 0 else ("new", "old"):
            for sysname, k in (("plain", 0), ("model-auto", "auto")):
                use(OLD if side == "old" else NEW)
                target.truncate(0)
                out = Engine(target, None if k == 0 else ModelDrafter(draft)).generate(
                    ids, SamplingParams(max_tokens=96, temperature=0.0), SpecConfig(k=k)
                )
                res.setdefault((pi, sysname, side), []).append(
                    (out.stats.tokens_per_second, out.token_ids)
                )
use(NEW)
for pi in range(len(prompts)):
    ref = res[(pi, "plain", "old")][0][1]
    cells = []
    for sysname in ("plain", "model-auto"):
        o = statistics.median(x[0] for x in res[(pi, sysname, "old")])
        n = statistics.median(x[0] for x in res[(pi, sysname, "new")])
        same = all(x[1] == ref for side in ("old", "new") for x in res[(pi, sysname, side)])
        cells.append(
            f"{sysname} old {o:.1f} new {n:.1f} tok/s ({n / o:.3f}x){'' if same else ' DIFFERENT'}"
        )
    print(f"prompt {pi}: " + "; ".join(cells))
