"""A cheaper draft by skipping some of the 0.5B's decoder layers: what it costs in agreement
with the target and what it saves a step (issue 47, "a draft that costs a tenth of a step").

python layer_skip.py [PROMPTS_PER_WORKLOAD] [SKIP ...]   (SKIP: comma-separated layer indices)

The int4 target's greedy output (64 tokens) on each bench prompt; then, for the draft with
each set of layers skipped (the rest in order, as one layer stack), teacher-forced agreement:
the share of those tokens the draft's argmax names given the target's text before it (a
proxy for the first draft's acceptance), by workload; and the median one-token step (int4,
the shipped vocabulary, after a 64-token context). The engine's exactness does not depend
on the draft, so any layer subset would be exact; only speed is at stake.
"""

import statistics
import sys
import time

from specdec.backends.hf import source_of
from specdec.backends.layer_stack import LayerParts, LayerStack
from specdec.bench.harness import load_workloads
from specdec.loading import load_backend
from specdec.machine import cpu_name
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.prompting import encode_prompt
from specdec.runtime import load_draft

TOKENS = 64
target = source_of(load_backend(DEFAULT_TARGET, "int4"))
draft = source_of(load_draft(DEFAULT_DRAFT, "int4", batched=True)[0])
items = load_workloads(per_workload=int(sys.argv[1]) if len(sys.argv) > 1 else 3)
texts = []
for item in items:
    prompt = encode_prompt(target.tokenizer, item.prompt, item.template)
    seq = target.sequence()
    logits = seq.forward(prompt, last_only=True)
    out: list[int] = []
    for _ in range(TOKENS):
        out.append(int(logits[-1].argmax()))
        if out[-1] in target.eos_token_ids:
            break
        logits = seq.forward([out[-1]], last_only=True)
    texts.append((item.workload, prompt, out))
layers = list(draft.model.get_decoder().layers)
full = draft.stack
print(
    f"CPU: {cpu_name()}; {len(items)} prompts, {TOKENS} target tokens each; "
    f"draft layers {len(layers)}"
)


def agreement(stack) -> dict[str, float]:
    draft.stack = stack
    counts: dict[str, list[int]] = {}
    for workload, prompt, out in texts:
        logits = draft.sequence().forward(prompt + out[:-1])
        guesses = logits[len(prompt) - 1 :].argmax(-1).tolist()
        hits = counts.setdefault(workload, [0, 0])
        hits[0] += sum(int(g == t) for g, t in zip(guesses, out, strict=True))
        hits[1] += len(out)
    return {w: round(h / n, 3) for w, (h, n) in counts.items()}


def step_ms(stack) -> float:
    draft.stack = stack
    seq = draft.sequence()
    seq.forward(list(range(1000, 1064)), last_only=True)
    token, times = 1234, []
    for _ in range(60):
        began = time.perf_counter()
        token = int(seq.forward([token], last_only=True)[-1].argmax())
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e3


for spec in ["none", *sys.argv[2:]]:
    skip = set() if spec == "none" else {int(i) for i in spec.split(",")}
    kept = [layer for i, layer in enumerate(layers) if i not in skip]
    stack = full if not skip else LayerStack.of([LayerParts.of(layer) for layer in kept])
    print(f"skip {spec}: agreement {agreement(stack)}; step {step_ms(stack):.2f} ms", flush=True)
