"""python prefill_passes.py target|draft

A prompt's prefill in one pass against passes of PASS_ROWS rows (BatchedModel.PASS_ROWS),
the 1.5B target or the 0.5B draft on int4, best of 2, and whether the next step's logits are
the same bits."""

import sys
import time

import torch

from specdec.backends.hf import source_of
from specdec.loading import load_backend
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.runtime import load_draft

which = sys.argv[1]
if which == "target":
    model = source_of(load_backend(DEFAULT_TARGET, "int4"))
else:
    model = source_of(load_draft(DEFAULT_DRAFT, "int4", batched=True)[0])
model.share_prefixes = False
for n in (128, 256, 512, 1024, 2048):
    draw = torch.Generator().manual_seed(n)
    prompt = [int(t) for t in torch.randint(100, 20000, (n,), generator=draw)]
    res, nexts = [], []
    for rows in (10**9, 32, 64, 128):
        if rows < 10**9 and rows >= n:
            continue
        model.PASS_ROWS = rows
        best = 1e9
        for _ in range(2):
            seq = model.sequence()
            began = time.perf_counter()
            seq.forward(prompt, last_only=True)
            best = min(best, time.perf_counter() - began)
        nexts.append(seq.forward([42])[-1])
        res.append(f"{'one pass' if rows == 10**9 else rows} {best:.2f} s")
    same = all(torch.equal(nexts[0], x) for x in nexts)
    print(f"{which}, {n} tokens: {', '.join(res)}; the same bits: {same}", flush=True)
