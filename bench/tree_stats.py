"""Draft trees in a `specdec bench` run: per workload and system, the tokens a round (the mean
accepted length, bonus included), the draft nodes verified a round, and the sibling leaves
verified and taken, summed over the run's generations.

python bench/tree_stats.py bench/results/FOLDER/results.json
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path

FIELDS = ("rounds", "generated_tokens", "drafted_tokens", "sibling_tokens", "sibling_accepted")


def table(results: dict) -> list[str]:
    sums: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for run in results["runs"]:
        for name in FIELDS:
            sums[(run["workload"], run["system"])][name] += run["stats"].get(name, 0)
    lines = [
        "| workload | system | tokens a round | nodes a round | leaves verified | leaves taken |",
        "|---|---|---|---|---|---|",
    ]
    for (workload, system), counts in sums.items():
        if not counts["drafted_tokens"]:
            continue  # plain
        rounds = counts["rounds"]
        lines.append(
            f"| {workload} | {system} | {counts['generated_tokens'] / rounds:.2f} | "
            f"{counts['drafted_tokens'] / rounds:.2f} | {counts['sibling_tokens']} | "
            f"{counts['sibling_accepted']} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a results.json written by specdec bench")
    args = parser.parse_args()
    print("\n".join(table(json.loads(args.results.read_text()))))


if __name__ == "__main__":
    main()
