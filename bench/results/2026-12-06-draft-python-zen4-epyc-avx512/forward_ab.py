"""One model's forward as the engine calls it, in ONE process: the Python before commit fdea6f3
(rotary cos/sin by a call per position, the trimmed logits index-put, every product's path read
each pass) and after, swapped in blocks of 10 passes in turning order, medians.

    python forward_ab.py draft 1 ROUNDS      # the 0.5B draft's one-token steps
    python forward_ab.py target 6 ROUNDS     # the 1.5B's passes of 6 tokens (a verify pass)
"""

import statistics
import sys
import time

from python_before import NEW, OLD, use

from specdec.backends.hf import source_of
from specdec.loading import load_backend
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.runtime import load_draft

which = sys.argv[1]
b = (
    source_of(load_draft(DEFAULT_DRAFT, "int4", batched=True)[0])
    if which == "draft"
    else source_of(load_backend(DEFAULT_TARGET, "int4"))
)
seq = b.sequence()
seq.forward(list(range(1000, 1200)), last_only=True)
res = {"old": [], "new": []}
token = 1234
rows = int(sys.argv[2])
for rnd in range(int(sys.argv[3])):
    for side in ("old", "new") if rnd % 2 == 0 else ("new", "old"):
        use(OLD if side == "old" else NEW)
        for _i in range(10):
            t = time.perf_counter()
            lg = seq.forward([token] * rows, last_only=rows == 1)
            res[side].append(time.perf_counter() - t)
            token = 1000 + int(lg[-1].argmax()) % 5000
        seq.truncate(200)
o, n = statistics.median(res["old"]), statistics.median(res["new"])
print(f"{which} {rows} rows: old {o * 1e3:.3f} ms, new {n * 1e3:.3f} ms, new/old {n / o:.3f}")
