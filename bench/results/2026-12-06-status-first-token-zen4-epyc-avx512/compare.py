"""Speedup over plain (the bench's median of per-run ratios) and tok/s, each run of each side.

python compare.py   (in this folder, after run.sh)"""

import json
from pathlib import Path

runs = sorted(p for p in Path(".").glob("run*-*") if p.is_dir())
table: dict[tuple[str, str], dict[str, dict]] = {}
for run in runs:
    for row in json.loads((run / "results.json").read_text())["summary"]:
        table.setdefault((row["workload"], row["system"]), {})[run.name] = row
print("workload | system | " + " | ".join(run.name for run in runs))
for (workload, system), cells in table.items():
    line = [
        f"{cells[run.name]['tokens_per_second']:.1f} tok/s {cells[run.name]['speedup']:.2f}x"
        for run in runs
        if run.name in cells
    ]
    print(f"{workload} | {system} | " + " | ".join(line))
