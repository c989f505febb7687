"""A pass of n tokens after a context of 760 and 2,000 tokens, the int4 target (or draft),
medians of 7: run under the old and the new source in turn (PYTHONPATH=OLD/src).

    python passes.py target|draft
"""

import statistics
import sys
import time

from specdec.backends.base import sync_cache
from specdec.loading import load_backend
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.runtime import load_draft

model = (
    load_backend(DEFAULT_TARGET, "int4")
    if sys.argv[1] == "target"
    else load_draft(DEFAULT_DRAFT, "int4", target_runtime="int4")[0]
)
ids = [1000 + (i * 7919) % 30000 for i in range(2100)]
for ctx in (760, 2000):
    model.truncate(0)
    sync_cache(model, ids[:ctx])
    line = []
    for n in (1, 2, 5, 8):
        ts = []
        for _ in range(7):
            model.truncate(ctx)
            t = time.perf_counter()
            model.forward(ids[ctx : ctx + n])
            ts.append(time.perf_counter() - t)
        line.append(statistics.median(ts) * 1000)
    print(
        sys.argv[1],
        "ctx",
        ctx,
        " ".join(f"n{n}={v:.1f}" for n, v in zip((1, 2, 5, 8), line, strict=True)),
        f" v(5)={line[2] / line[0]:.2f} v(8)={line[3] / line[0]:.2f}",
        flush=True,
    )
