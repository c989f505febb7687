"""A prompt's first token from the prefill's own pass (``Run.first_token``, prompts of
``FIRST_TOKEN_FROM_PREFILL`` tokens and more) against the flow before, where the last prompt
token waited for the first round and the drafter's prefill came first: both in ONE process
(the threshold set out of reach for "old"), in turning order, greedy, the int4 pair, 64
tokens. Per prompt and system: the time to the first token and tok/s (medians), and whether
every output is the same tokens as plain decoding's.

    python first_token_ab.py ROUNDS
"""

import statistics
import sys
import time
from pathlib import Path

import specdec
from specdec import Engine, SamplingParams, SpecConfig
from specdec.drafters import ModelDrafter
from specdec.engine import Run
from specdec.loading import load_backend
from specdec.machine import cpu_name
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.prompting import encode_prompt
from specdec.runtime import load_draft

NEW = Run.FIRST_TOKEN_FROM_PREFILL
SOURCE = (Path(specdec.__file__).parent / "engine.py").read_text()
PROMPTS = {
    "chat question": "What are some good habits for getting better sleep?",
    "summary (~150 tokens)": "Summarize this passage in two sentences:\n" + SOURCE[:500],
    "summary (~760 tokens)": "Summarize what this code does:\n" + SOURCE[:3000],
}

target = load_backend(DEFAULT_TARGET, "int4")
draft, _ = load_draft(DEFAULT_DRAFT, "int4", target_runtime="int4")
params = SamplingParams(max_tokens=64, temperature=0.0)
print(cpu_name())
res: dict = {}
for turn in range(int(sys.argv[1])):
    for name, text in PROMPTS.items():
        ids = encode_prompt(target.tokenizer, text, "chat")
        for flow in ("old", "new") if turn % 2 == 0 else ("new", "old"):
            Run.FIRST_TOKEN_FROM_PREFILL = NEW if flow == "new" else 10**9
            for system, k in (("plain", 0), ("model-auto", "auto")):
                target.truncate(0)
                draft.truncate(0)
                engine = Engine(target, None if k == 0 else ModelDrafter(draft))
                began, first, tokens = time.perf_counter(), None, []
                for chunk in engine.stream(ids, params, SpecConfig(k=k)):
                    first = first if first is not None else time.perf_counter() - began
                    tokens += chunk.token_ids
                took = time.perf_counter() - began
                res.setdefault((name, len(ids)), {}).setdefault((system, flow), []).append(
                    (first, len(tokens) / took, tokens)
                )
Run.FIRST_TOKEN_FROM_PREFILL = NEW
for (name, length), runs in res.items():
    reference = runs[("plain", "old")][0][2]
    print(f"{name} ({length} prompt tokens):")
    for system in ("plain", "model-auto"):
        cells = []
        for flow in ("old", "new"):
            got = runs[(system, flow)]
            same = all(tokens == reference for _, _, tokens in got)
            first = statistics.median(f for f, _, _ in got)
            rate = statistics.median(r for _, r, _ in got)
            cells.append(
                f"{flow} first token {first:.2f} s, {rate:.1f} tok/s"
                + ("" if same else " DIFFERENT")
            )
        print(f"  {system}: " + "; ".join(cells))
