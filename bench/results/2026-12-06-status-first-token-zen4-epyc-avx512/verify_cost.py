"""The verify pass against the same run's plain step, from the engine's own clocks: per run and
workload, ms per target pass of `model-auto` (drafted tokens + 1 rows a round, the prefill
left out) over ms per plain step, and the mean rows a pass.

python verify_cost.py   (in this folder, after run.sh)"""

import json
from pathlib import Path

for run in sorted(p for p in Path(".").glob("run*-*") if p.is_dir()):
    cells = []
    for workload in ("code", "edit", "summary", "chat"):
        per = {}
        for system in ("plain", "model-auto"):
            rows = [
                r
                for r in json.loads((run / "results.json").read_text())["runs"]
                if r["system"] == system and r["workload"] == workload
            ]
            seconds = sum(r["stats"]["target_seconds"] for r in rows)
            passes = sum(r["stats"]["target_forwards"] - 1 for r in rows)  # one is the prefill
            drafted = sum(r["stats"]["drafted_tokens"] for r in rows)
            rounds = sum(r["stats"]["rounds"] for r in rows)
            per[system] = (1e3 * seconds / passes, drafted / rounds + 1 if rounds else 1)
        (step, _), (verify, rows_a_pass) = per["plain"], per["model-auto"]
        cells.append(
            f"{workload} {verify:.1f}/{step:.1f} ms = {verify / step:.2f} at {rows_a_pass:.1f} rows"
        )
    print(f"{run.name}: " + "; ".join(cells))
