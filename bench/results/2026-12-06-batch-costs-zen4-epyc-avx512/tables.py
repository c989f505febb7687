"""The shared k controller's cost table after each burst (1, 1, 8, 8, 1, 1, 1 requests
of the code workload, in-process as bench/batch_burst.py runs them): draft step ms, target
pass ms by rows, the k it would choose.

    python tables.py [RECIPE]     # model (default lookup+model)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/, for batch_burst
from batch_burst import burst, drafter

from specdec.backends.hf import source_of
from specdec.bench.harness import load_workloads
from specdec.config import SpecConfig
from specdec.controller import BatchDrafting
from specdec.engine import new_controller
from specdec.loading import load_backend
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.runtime import load_draft

items = load_workloads(["code"])
t = load_backend(DEFAULT_TARGET, "int4")
d, _ = load_draft(DEFAULT_DRAFT, "int4", batched=True)
bt, bd = source_of(t), source_of(d)
recipe = sys.argv[1] if len(sys.argv) > 1 else "lookup+model"


def show(c, label):
    for name, m in getattr(c, "controllers", {"": c}).items():
        print(
            label,
            name,
            "draft ms",
            round((m.draft_step_seconds or 0) * 1e3, 2),
            {n: round(s * 1e3, 1) for n, s in sorted(m.pass_seconds.items())},
            "k",
            m.choose_k(),
        )


c = new_controller(drafter(recipe, bd), SpecConfig(k="auto").max_k)
setup = (recipe, c, "auto", BatchDrafting())
for n in [1, 1, 8, 8, 1, 1, 1]:
    r = burst(bt, bd, t.tokenizer, items, n, 32, setup, 48)
    print(n, f"tok/s {r[0]:.1f} steps {r[2]}")
    show(c, f"after n={n}")
