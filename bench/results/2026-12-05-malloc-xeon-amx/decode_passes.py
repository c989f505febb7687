"""Decoding's passes with glibc's default and with ``keep_freed_memory``: the int4 target's
one-token step and 9-token pass and the int4 draft's step after 128 tokens, medians of 40.

python bench/results/2026-12-05-malloc-xeon-amx/decode_passes.py default|keep   # decode.txt
"""

from __future__ import annotations

import statistics
import sys
import time

from specdec.allocator import keep_freed_memory
from specdec.loading import load_backend
from specdec.runtime import load_draft

if sys.argv[1] == "keep":
    assert keep_freed_memory()
target = load_backend("qwen2.5-coder-1.5b-instruct", "int4")
draft, _ = load_draft("qwen2.5-coder-0.5b-instruct", "int4")
context = [1000 + i for i in range(128)]
target.forward(context[:-1])
draft.forward(context[:-1])
held = len(context) - 1
times: dict[str, list[float]] = {"step": [], "pass of 9": [], "draft step": []}
for _ in range(40):
    for name, backend, tokens in (
        ("step", target, context[-1:]),
        ("pass of 9", target, context[-1:] + [5] * 8),
        ("draft step", draft, context[-1:]),
    ):
        started = time.perf_counter()
        backend.forward(tokens, last_only=name == "draft step")
        times[name].append(time.perf_counter() - started)
        backend.truncate(held)
print(sys.argv[1], {name: round(1000 * statistics.median(t), 2) for name, t in times.items()})
