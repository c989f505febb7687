"""Run-by-run ratios of one `specdec bench` run: paired, not medians of medians.

Every (workload, prompt, repeat) of a bench run is decoded by each system in turn, so two
systems' tokens/s on the same pair were measured minutes apart on the same text. The median
of those paired ratios, and in how many pairs the first system was the faster, says more on
a shared, noisy machine than a ratio of the two systems' medians.

    python bench/run_by_run.py OUT/results.json      # each system over each one before it
    python bench/run_by_run.py OUT/results.json eagle-auto@int4/plain@int4 eagle-auto@int4/plain

Prints one line per (pair, workload), `A over B chat: median 1.050 faster 5/8`, then the
runs whose output differed from their reference (`not identical: [...]`, empty when greedy
decoding reproduced plain everywhere).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def paired_ratios(runs: list[dict], first: str, second: str, workload: str) -> list[float]:
    """tokens/s of `first` over `second` on each (prompt, repeat) of `workload` both ran."""
    rates: dict[tuple[str, str, int], float] = {}
    for run in runs:
        if run["workload"] == workload and run["system"] in (first, second):
            rates[(run["system"], run["prompt_id"], run["repeat"])] = run["tokens_per_second"]
    keys = sorted({(prompt, repeat) for system, prompt, repeat in rates if system == first})
    return [
        rates[(first, prompt, repeat)] / rates[(second, prompt, repeat)]
        for prompt, repeat in keys
        if (second, prompt, repeat) in rates
    ]


def lines(results: dict, pairs: list[tuple[str, str]]) -> list[str]:
    runs = results["runs"]
    workloads = list(dict.fromkeys(run["workload"] for run in runs))
    out = []
    for first, second in pairs:
        for workload in workloads:
            ratios = paired_ratios(runs, first, second, workload)
            if ratios:
                faster = sum(ratio > 1.0 for ratio in ratios)
                out.append(
                    f"{first} over {second} {workload}: median {statistics.median(ratios):.3f} "
                    f"faster {faster}/{len(ratios)}"
                )
    differing = [
        f"{run['system']} {run['prompt_id']} repeat {run['repeat']}"
        for run in runs
        if run.get("identical_to_reference") is False
    ]
    out.append(f"not identical: {differing}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="results.json written by specdec bench --out")
    parser.add_argument(
        "pairs",
        nargs="*",
        help="A/B: A's tokens/s over B's (default: every system over each one listed before it)",
    )
    args = parser.parse_args(argv)
    try:
        results = json.loads(args.results.read_text())
        systems = list(dict.fromkeys(run["system"] for run in results["runs"]))
    except (OSError, ValueError, KeyError, TypeError) as error:
        print(f"run_by_run: {args.results} is not a specdec bench results.json ({error})")
        return 2
    if args.pairs:
        pairs = []
        for pair in args.pairs:
            # names may hold a '/' themselves (model-auto@int4/q4_0): try each split
            splits = [
                (pair[:i], pair[i + 1 :])
                for i, char in enumerate(pair)
                if char == "/" and pair[:i] in systems and pair[i + 1 :] in systems
            ]
            if not splits:
                print(f"run_by_run: {pair!r} is not A/B of two systems in the run: {systems}")
                return 2
            pairs.append(splits[0])
    else:
        pairs = [(later, earlier) for i, later in enumerate(systems) for earlier in systems[:i]]
    print("\n".join(lines(results, pairs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
