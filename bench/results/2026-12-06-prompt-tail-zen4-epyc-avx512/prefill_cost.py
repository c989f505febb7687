"""The prefill of n prompt tokens for the int4 target and draft (medians of 3), and a step of
each after 120 tokens (median of 20).

    python prefill_cost.py
"""

import statistics
import time

from specdec.backends.base import sync_cache
from specdec.loading import load_backend
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.runtime import load_draft

target = load_backend(DEFAULT_TARGET, "int4")
draft, _ = load_draft(DEFAULT_DRAFT, "int4", target_runtime="int4")
ids = list(range(1000, 1000 + 160))
for n in (32, 64, 120, 160):
    for name, b in (("target", target), ("draft", draft)):
        ts = []
        for _ in range(3):
            b.truncate(0)
            t = time.perf_counter()
            sync_cache(b, ids[:n])
            ts.append(time.perf_counter() - t)
        print(n, name, f"{statistics.median(ts) * 1000:.0f} ms")
for name, b in (("target", target), ("draft", draft)):
    b.truncate(0)
    sync_cache(b, ids[:120])
    ts = []
    for i in range(20):
        t = time.perf_counter()
        b.forward([ids[120 + (i % 30)]], last_only=True)
        ts.append(time.perf_counter() - t)
    print(name, "step", f"{statistics.median(ts) * 1000:.1f} ms")
