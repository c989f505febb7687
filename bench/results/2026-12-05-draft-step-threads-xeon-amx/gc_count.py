"""How many garbage collections 1000 draft steps (as draft_steps.py) set off, and their time."""

import gc
import time

from specdec.backends.hf import source_of
from specdec.models import DEFAULT_DRAFT
from specdec.runtime import load_draft

loaded, _ = load_draft(DEFAULT_DRAFT, "int4", batched=True)
seq = source_of(loaded).sequence()
seq.forward(list(range(1000, 1064)), last_only=True)
stats = {0: [0, 0.0], 1: [0, 0.0], 2: [0, 0.0]}
began: dict[str, float] = {}


def count(phase, info):
    if phase == "start":
        began["t"] = time.perf_counter()
    else:
        stats[info["generation"]][0] += 1
        stats[info["generation"]][1] += time.perf_counter() - began["t"]


gc.callbacks.append(count)
token = 1234
start = time.perf_counter()
for _ in range(1000):
    token = int(seq.forward([token], last_only=True)[-1].argmax())
    if len(seq.cached_token_ids) > 300:
        seq.truncate(64)
wall = time.perf_counter() - start
collections = ", ".join(f"gen{g}: {n} taking {t * 1e3:.1f} ms" for g, (n, t) in stats.items())
print(f"1000 steps {wall:.2f} s; collections by generation: {collections}")
