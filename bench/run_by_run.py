"""Run-by-run ratios of one `specdec bench` run: paired, not medians of medians.

Every (workload, prompt, repeat) of a bench run is decoded by each system in turn, so two
systems' tokens/s on the same pair were measured minutes apart on the same text. The median
of those paired ratios, and in how many pairs the first system was the faster, says more on
a shared, noisy machine than a ratio of the two systems' medians.

    python bench/run_by_run.py OUT/results.json      # each system over each one before it
    python bench/run_by_run.py OUT/results.json eagle-auto@int4/plain@int4 eagle-auto@int4/plain
    python bench/run_by_run.py RUN1/results.json RUN2/results.json A/B   # pooled

Prints one line per (pair, workload), `A over B chat: median 1.050 faster 5/8 (sign test p
0.73)`, then the runs whose output differed from their reference (`not identical: [...]`,
empty when greedy decoding reproduced plain everywhere). The sign test is two-sided and
exact: how likely so lopsided a count of faster pairs is if neither system were the faster
(each pair a fair coin). With several results files the pairs of all of them are pooled
(a pair is still one prompt and one repeat of one run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from specdec.bench import pairs as pairing


def paired_ratios(runs: list[dict], first: str, second: str, workload: str) -> list[float]:
    """tokens/s of `first` over `second` on each (prompt, repeat) of `workload` both ran."""

    def rates(system: str) -> dict:
        return {
            (run["prompt_id"], run["repeat"]): run["tokens_per_second"]
            for run in runs
            if run["workload"] == workload and run["system"] == system
        }

    return pairing.paired_ratios(rates(first), rates(second))


def lines(results: dict | list[dict], pairs: list[tuple[str, str]]) -> list[str]:
    """The report's lines for one bench run's results, or several runs' pooled."""
    every = results if isinstance(results, list) else [results]
    # one run's prompt and repeat are not another's: the run's index joins the prompt
    runs = [
        {**run, "prompt_id": (index, run["prompt_id"])}
        for index, one in enumerate(every)
        for run in one["runs"]
    ]
    workloads = list(dict.fromkeys(run["workload"] for run in runs))
    out = []
    for first, second in pairs:
        for workload in workloads:
            ratios = paired_ratios(runs, first, second, workload)
            if ratios:
                faster = sum(ratio > 1.0 for ratio in ratios)
                chance = pairing.sign_test(faster, sum(ratio < 1.0 for ratio in ratios))
                out.append(
                    f"{first} over {second} {workload}: median {statistics.median(ratios):.3f} "
                    f"faster {faster}/{len(ratios)} (sign test p {chance:.2g})"
                )
    differing = [
        ("" if len(every) == 1 else f"run {run['prompt_id'][0] + 1} ")
        + f"{run['system']} {run['prompt_id'][1]} repeat {run['repeat']}"
        for run in runs
        if run.get("identical_to_reference") is False
    ]
    out.append(f"not identical: {differing}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "items",
        nargs="+",
        metavar="RESULTS.json [A/B]",
        help="results.json files written by specdec bench --out (several: their pairs pooled), "
        "then pairs A/B: A's tokens/s over B's (default: every system over each one listed "
        "before it)",
    )
    args = parser.parse_args(argv)
    paths = [Path(item) for item in args.items if item.endswith(".json")]
    wanted = [item for item in args.items if not item.endswith(".json")]
    if not paths:
        print("run_by_run: name at least one results.json written by specdec bench --out")
        return 2
    every, named = [], []
    for path in paths:
        try:
            one = json.loads(path.read_text())
            named += [run["system"] for run in one["runs"]]
        except (OSError, ValueError, KeyError, TypeError) as error:
            print(f"run_by_run: {path} is not a specdec bench results.json ({error})")
            return 2
        every.append(one)
    systems = list(dict.fromkeys(named))
    if wanted:
        pairs = []
        for pair in wanted:
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
    print("\n".join(lines(every, pairs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
