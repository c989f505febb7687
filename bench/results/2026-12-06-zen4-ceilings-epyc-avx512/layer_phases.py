"""Where the 0.5B draft's one-token step goes inside the layer stack, phase by phase (ms a step,
summed over its 24 layers): run with the kernel built from a tree patched with
``layer-phases.diff`` (a clock around each phase of ``LayerStack::forward``), e.g.

    git archive HEAD src | tar x -C TREE && patch -d TREE -p1 < layer-phases.diff
    SPECDEC_KERNELS=TREE/kernels PYTHONPATH=TREE/src python layer_phases.py
"""

import time

from specdec.backends.hf import source_of
from specdec.backends.quant.kernels import kernel
from specdec.models import DEFAULT_DRAFT
from specdec.runtime import load_draft

loaded, _ = load_draft(DEFAULT_DRAFT, "int4", batched=True)
seq = source_of(loaded).sequence()
seq.forward(list(range(1000, 1064)), last_only=True)
token = 1234
N = 400
kernel().stack_timers()
t0 = time.perf_counter()
for _i in range(N):
    token = int(seq.forward([token], last_only=True)[-1].argmax())
    if len(seq.cached_token_ids) > 400:
        seq.truncate(64)
wall = time.perf_counter() - t0
v = kernel().stack_timers()
names = ["norm1", "qkv", "heads+attn", "o", "add+norm2", "gate_up", "silu", "down+add"]
print(
    f"step {wall / N * 1e3:.2f} ms; per step: "
    + ", ".join(f"{n} {x / N * 1e3:.3f}" for n, x in zip(names, v, strict=False))
    + f"; sum {sum(v) / N * 1e3:.2f}"
)
