"""One-token steps of the 0.5B draft as the engine drafts (int4, a scale per 128 inputs, the
shipped vocabulary), after a 64-token context, greedy; the cache cut back past 400 tokens.

python draft_steps.py [STEPS]
"""

import statistics
import sys
import time

from specdec.backends.hf import source_of
from specdec.models import DEFAULT_DRAFT
from specdec.runtime import load_draft

loaded, _ = load_draft(DEFAULT_DRAFT, "int4", batched=True)
seq = source_of(loaded).sequence()
seq.forward(list(range(1000, 1064)), last_only=True)
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
times = []
token = 1234
for _ in range(steps):
    began = time.perf_counter()
    token = int(seq.forward([token], last_only=True)[-1].argmax())
    times.append(time.perf_counter() - began)
    if len(seq.cached_token_ids) > 400:
        seq.truncate(64)
print(
    f"draft step: median {statistics.median(times) * 1e3:.2f} ms, "
    f"min {min(times) * 1e3:.2f} ms over {steps}"
)
