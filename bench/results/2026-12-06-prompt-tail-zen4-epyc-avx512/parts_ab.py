"""The server's batched path: a request's prefill in parts of 64 prompt tokens
(``Run.prefill_part``, as ``Scheduler._step_batched`` runs it), the draft reading the whole
prompt or its first 4 tokens and last 256, in one process, in turning order: the time of
all the parts, the draft's rows, and the first tokens (greedy) after the parts.

    python parts_ab.py TURNS
"""

import statistics
import sys
import time

from long_prompts import long_prompts, model_member

from specdec import Engine, SamplingParams, SpecConfig
from specdec.drafters.recipe import DraftSources, build_drafter
from specdec.loading import load_backend
from specdec.machine import cpu_name
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.runtime import load_draft

target = load_backend(DEFAULT_TARGET, "int4")
draft, _ = load_draft(DEFAULT_DRAFT, "int4", target_runtime="int4")
prompts = long_prompts(target.tokenizer, ("long-760", "long-1500"))
print(cpu_name(), flush=True)

results: dict = {}
for turn in range(int(sys.argv[1])):
    for name, ids in prompts.items():
        tails = [None, 256] if turn % 2 == 0 else [256, None]
        for tail in tails:
            target_seq, draft_seq = target.source.sequence(), draft.source.sequence()
            drafter = build_drafter("model", DraftSources(draft_model=lambda s=draft_seq: s))
            model_member(drafter).prompt_tail = tail
            run = Engine(target_seq, drafter).begin(
                ids, SamplingParams(max_tokens=16, temperature=0.0), SpecConfig(k="auto")
            )
            began = time.perf_counter()
            while not run.prefilled:
                run.prefill_part(64)
            seconds = time.perf_counter() - began
            rows = len(draft_seq.cached_token_ids)
            tokens = [t for chunk in run.rounds() for t in chunk.token_ids]
            results.setdefault((name, tail), []).append((seconds, rows, tokens))
            del run, target_seq, draft_seq
    print("turn", turn, flush=True)
for (name, tail), got in results.items():
    same = all(t == results[(name, None)][0][2] for _, _, t in got)
    length = len(prompts[name])
    print(
        f"{length}-token prompt, draft reads {'all' if tail is None else f'4 + {tail}'}: "
        f"prefill parts {statistics.median(s for s, _, _ in got):.2f} s, "
        f"draft rows {got[0][1]}" + ("" if same else ", DIFFERENT tokens")
    )
