"""The 1.5B target's prefill on int4 against int8 (ms a prompt token, random prompts of 128 and
512 tokens, three rounds in turn, medians) and a one-token step on each, in one process.

    python prefill_dtype.py > prefill-dtype.txt
"""

import statistics
import time

import torch

from specdec.backends.hf import source_of
from specdec.loading import load_backend
from specdec.models import DEFAULT_TARGET

models = {d: source_of(load_backend(DEFAULT_TARGET, d)) for d in ("int4", "int8")}
for m in models.values():
    m.share_prefixes = False
for n in (128, 512):
    prompt = [
        int(t) for t in torch.randint(100, 20000, (n,), generator=torch.Generator().manual_seed(n))
    ]
    times = {d: [] for d in models}
    for _ in range(3):
        for d, m in models.items():
            seq = m.sequence()
            t = time.perf_counter()
            seq.forward(prompt, last_only=True)
            times[d].append(time.perf_counter() - t)
            del seq
    print(
        n,
        {d: f"{statistics.median(v) * 1e3 / n:.2f} ms/token" for d, v in times.items()},
        flush=True,
    )
for d, m in models.items():
    seq = m.sequence()
    seq.forward(list(range(100, 164)), last_only=True)
    ts = []
    for i in range(20):
        t = time.perf_counter()
        seq.forward([500 + i])
        ts.append(time.perf_counter() - t)
    print(d, "step", f"{statistics.median(ts) * 1e3:.1f} ms")
