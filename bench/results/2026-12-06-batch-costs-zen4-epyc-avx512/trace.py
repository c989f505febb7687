"""Each request alone's rounds as the shared k controller saw them (batch, k, accepted,
pass ms), after bursts of 2 and 8 requests, then its table alone, draft step ms and
acceptance by position.

    python trace.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/, for batch_burst
from batch_burst import burst, drafter

from specdec.backends.hf import source_of
from specdec.bench.harness import load_workloads
from specdec.config import SpecConfig
from specdec.controller import AdaptiveK, BatchDrafting
from specdec.engine import new_controller
from specdec.loading import load_backend
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.runtime import load_draft

items = load_workloads(["code"])
t = load_backend(DEFAULT_TARGET, "int4")
d, _ = load_draft(DEFAULT_DRAFT, "int4", batched=True)
bt, bd = source_of(t), source_of(d)
log = []
orig = AdaptiveK.observe


def obs(self, r):
    log.append((r.batch, r.k, r.num_accepted, round(r.pass_seconds * 1e3, 1)))
    return orig(self, r)


AdaptiveK.observe = obs
c = new_controller(drafter("model", bd), SpecConfig(k="auto").max_k)
setup = ("model", c, "auto", BatchDrafting())
for n in [2, 1, 8, 1, 8, 1]:
    log.clear()
    r = burst(bt, bd, t.tokenizer, items, n, 32, setup, 48)
    print(n, f"tok/s {r[0]:.1f} steps {r[2]}")
    if n == 1:
        print(
            "  ",
            log,
            "table",
            {k: round(v * 1e3, 1) for k, v in sorted(c.pass_seconds.items())},
            "draft",
            round(c.draft_step_seconds * 1e3, 2),
            [round(x, 2) for x in c.position_rates()],
        )
