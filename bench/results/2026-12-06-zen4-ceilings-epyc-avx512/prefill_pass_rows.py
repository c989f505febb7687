"""A prompt's prefill in passes of PASS_ROWS rows (BatchedModel.PASS_ROWS, chosen on the AMX Xeon),
each size in turn, three rounds in turning order, medians; the target or the draft on int4.

    python prefill_pass_rows.py target|draft SIZES ROWS     e.g. target 138,512 16,32,48,64,96,128
"""

import statistics
import sys
import time

import torch

from specdec.backends.hf import source_of
from specdec.loading import load_backend
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.runtime import load_draft

which = sys.argv[1]
sizes = [int(x) for x in sys.argv[2].split(",")]
rows_list = [int(x) for x in sys.argv[3].split(",")]
model = (
    source_of(load_backend(DEFAULT_TARGET, "int4"))
    if which == "target"
    else source_of(load_draft(DEFAULT_DRAFT, "int4", batched=True)[0])
)
model.share_prefixes = False
for n in sizes:
    prompt = [
        int(t) for t in torch.randint(100, 20000, (n,), generator=torch.Generator().manual_seed(n))
    ]
    times = {r: [] for r in rows_list}
    for rnd in range(3):
        for r in rows_list if rnd % 2 == 0 else rows_list[::-1]:
            model.PASS_ROWS = r
            seq = model.sequence()
            t = time.perf_counter()
            seq.forward(prompt, last_only=True)
            times[r].append(time.perf_counter() - t)
            del seq
    print(
        f"{which} {n} tokens: "
        + ", ".join(f"{r}: {statistics.median(v) * 1e3:.0f} ms" for r, v in times.items()),
        flush=True,
    )
