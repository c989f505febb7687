"""What of a long prompt the draft model reads (``ModelDrafter.prompt_tail``): the int4 pair,
``lookup+model``, k auto, greedy, in ONE process, plain and each tail in turning order
(reversed every other turn). Per prompt: tok/s (median over turns), rounds, and whether every
output is plain decoding's tokens; then the geometric mean of each system's speedup over plain.

    python prompt_tail_ab.py TURNS PROMPTS TAILS MAX_TOKENS

PROMPTS: workload names or prompt ids of the bench's workloads (``edit,summary-1``) and
``long`` (three prompts of specdec's own source: ~400, 760 and 1,424 tokens); TAILS: e.g.
``all,256,512`` (all: the whole prompt).
"""

import statistics
import sys
import time

from long_prompts import long_prompts, model_member

from specdec import Engine, SamplingParams, SpecConfig
from specdec.bench.harness import encode_items, load_workloads
from specdec.drafters.recipe import DraftSources, build_drafter
from specdec.loading import load_backend
from specdec.machine import cpu_name
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.runtime import load_draft

turns, wanted, tails, max_tokens = (
    int(sys.argv[1]),
    sys.argv[2].split(","),
    [None if t == "all" else int(t) for t in sys.argv[3].split(",")],
    int(sys.argv[4]),
)
target = load_backend(DEFAULT_TARGET, "int4")
draft, _ = load_draft(DEFAULT_DRAFT, "int4", target_runtime="int4")
items = [i for i in load_workloads() if i.id.split("-")[0] in wanted or i.id in wanted]
prompts = encode_items(target.tokenizer, items)
if "long" in wanted:
    prompts |= long_prompts(target.tokenizer)
params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
print(cpu_name(), flush=True)


results: dict = {}
for turn in range(turns):
    for prompt_id, ids in prompts.items():
        systems = ["plain", *tails]
        for system in systems if turn % 2 == 0 else systems[::-1]:
            target.truncate(0)
            draft.truncate(0)
            if system == "plain":
                engine, spec = Engine(target, None), SpecConfig(k=0)
            else:
                drafter = build_drafter("lookup+model", DraftSources(draft_model=lambda: draft))
                model_member(drafter).prompt_tail = system
                engine, spec = Engine(target, drafter), SpecConfig(k="auto")
            began = time.perf_counter()
            out = engine.generate(ids, params, spec)
            rate = len(out.token_ids) / (time.perf_counter() - began)
            results.setdefault(prompt_id, {}).setdefault(str(system), []).append(
                (rate, out.token_ids, out.stats.rounds)
            )
    print("turn", turn, flush=True)
speedups: dict = {}
for prompt_id, runs in results.items():
    reference = runs["plain"][0][1]
    plain_rate = statistics.median(rate for rate, _, _ in runs["plain"])
    cells = []
    for system in ["plain", *map(str, tails)]:
        rate = statistics.median(r for r, _, _ in runs[system])
        rounds = statistics.median(n for _, _, n in runs[system])
        same = all(tokens == reference for _, tokens, _ in runs[system])
        speedups.setdefault(system, []).append(rate / plain_rate)
        cells.append(f"{system}: {rate:.1f} tok/s r{rounds:.0f}" + ("" if same else " DIFF"))
    print(prompt_id, len(prompts[prompt_id]), " | ".join(cells))
for system, values in speedups.items():
    print(system, "geomean speedup", f"{statistics.geometric_mean(values):.3f}")
