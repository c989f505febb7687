"""The one-row passes' software prefetch hint switched in ONE process (a kernel built from a tree
patched with ``prefetch-hint.diff``: ``set_prefetch_mode``, 0 prefetcht0 as shipped, 1
prefetchnta, 2 none), blocks of 12 steps in turning order: the step, the layer stack's kernel
call, and the rest (the Python and torch calls around it), medians.

    SPECDEC_KERNELS=TREE/kernels PYTHONPATH=TREE/src python prefetch_hint.py draft 0,1,2 40
"""

import statistics
import sys
import time

from specdec.backends.hf import source_of
from specdec.backends.quant.kernels import kernel
from specdec.loading import load_backend
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.runtime import load_draft

which = sys.argv[1]
modes = [int(x) for x in sys.argv[2].split(",")]
b = (
    source_of(load_draft(DEFAULT_DRAFT, "int4", batched=True)[0])
    if which == "draft"
    else source_of(load_backend(DEFAULT_TARGET, "int4"))
)
ks = b.stack._kernel_stack()
kt = []


class K:
    def forward(s, *a):
        t = time.perf_counter()
        r = ks.forward(*a)
        kt.append(time.perf_counter() - t)
        return r


kk = K()
b.stack._kernel_stack = lambda: kk
seq = b.sequence()
seq.forward(list(range(1000, 1200)), last_only=True)
res = {m: [] for m in modes}
kres = {m: [] for m in modes}
token = 1234
for rnd in range(int(sys.argv[3])):
    for m in modes if rnd % 2 == 0 else modes[::-1]:
        kernel().set_prefetch_mode(m)
        for _i in range(12):
            kt.clear()
            t = time.perf_counter()
            lg = seq.forward([token], last_only=True)
            res[m].append(time.perf_counter() - t)
            kres[m].append(kt[0])
            token = 1000 + int(lg[-1].argmax()) % 5000
        seq.truncate(200)


def cell(m, v):
    rest = statistics.median([a - b for a, b in zip(v, kres[m], strict=True)])
    step, kernel_ms = statistics.median(v) * 1e3, statistics.median(kres[m]) * 1e3
    return f"mode {m}: step {step:.2f} kernel {kernel_ms:.2f} rest {rest * 1e3:.2f}"


print(which, " | ".join(cell(m, v) for m, v in res.items()))
