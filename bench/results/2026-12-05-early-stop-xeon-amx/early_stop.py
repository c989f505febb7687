"""k auto with and without its early stop (``AdaptiveK.keep_going``: a round ends when the
draft's confidence says one more draft would lower the expected token rate), the README's
prompt and 3 code and 3 chat prompts of the bench, greedy, int4 pair, 128 tokens, model
drafter; the two ways alternate, two passes.

python early_stop.py
"""

import statistics

from specdec import Engine, SamplingParams, SpecConfig
from specdec import controller as C
from specdec.bench.harness import load_workloads
from specdec.drafters import ModelDrafter
from specdec.loading import load_backend
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.prompting import encode_prompt
from specdec.runtime import load_draft

target = load_backend(DEFAULT_TARGET, "int4")
draft, _ = load_draft(DEFAULT_DRAFT, "int4", target_runtime="int4")
orig = C.AdaptiveK.keep_going


def never_stop(self, confidences):
    return len(confidences) < self.max_k


items = [("quicksort", "def quicksort(arr):", "raw")] + [
    (i.id, i.prompt, i.template) for i in load_workloads(["code", "chat"], per_workload=3)
]
res = {}
for rep in range(2):
    for name, prompt, tmpl in items:
        ids = encode_prompt(target.tokenizer, prompt, tmpl)
        for label, fn in (
            [("stop", orig), ("nostop", never_stop)]
            if rep % 2 == 0
            else [("nostop", never_stop), ("stop", orig)]
        ):
            C.AdaptiveK.keep_going = fn
            target.truncate(0)
            out = Engine(target, ModelDrafter(draft)).generate(
                ids, SamplingParams(max_tokens=128, temperature=0.0), SpecConfig(k="auto")
            )
            res.setdefault((name, label), []).append(
                (out.stats.tokens_per_second, out.stats.mean_accepted_length)
            )
for name, _, _ in items:
    a = res[(name, "stop")]
    b = res[(name, "nostop")]
    print(
        name,
        "stop",
        [round(x[0], 1) for x in a],
        "mal",
        round(a[0][1], 2),
        "| nostop",
        [round(x[0], 1) for x in b],
        "mal",
        round(b[0][1], 2),
        "ratio",
        round(statistics.median(x[0] for x in b) / statistics.median(x[0] for x in a), 3),
    )
