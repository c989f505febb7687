"""What a batched step of N requests costs against one request's step: the bound on what
continuous batching can give on this CPU (issue 46's 8 clients).

python bench/batch_rows.py [--runtime int4] [--sizes 1,2,4,8,16] [--repeats 15]

The default target on ``--runtime``: N sequences, each after its own 60-token context, one
new token each in ONE pass (``BatchedModel.forward_many``, what the server's plain batched
step runs), against one sequence's pass of N tokens (a verify pass's shape, ``specdec
cost``). Medians of interleaved repeats. With no drafts and nothing else to do, N clients
get at most N tokens a step: N / (the N-sequence pass) tokens a second.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specdec.loading import load_backend
from specdec.machine import cpu_name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtime", default="int4", choices=("int4", "int8"))
    parser.add_argument("--sizes", default="1,2,4,8,16")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    sizes = [int(n) for n in args.sizes.split(",")]
    model = load_backend("qwen2.5-coder-1.5b-instruct", args.runtime).source
    sequences = [model.sequence() for _ in range(max(sizes))]
    for i, sequence in enumerate(sequences):
        sequence.forward([1000 + i + j for j in range(60)])
    held = len(sequences[0].cached_token_ids)

    def many(n: int) -> float:
        started = time.perf_counter()
        model.forward_many([(sequence, [5], True) for sequence in sequences[:n]])
        seconds = time.perf_counter() - started
        for sequence in sequences[:n]:
            sequence.truncate(held)
        return 1000 * seconds

    def rows(n: int) -> float:
        started = time.perf_counter()
        model.forward_many([(sequences[0], [5] * n, False)])
        seconds = time.perf_counter() - started
        sequences[0].truncate(held)
        return 1000 * seconds

    samples: dict[tuple[str, int], list[float]] = {}
    for repeat in range(args.repeats + 2):  # two to warm up
        for n in sizes:
            for name, timed in (("sequences", many), ("rows", rows)):
                ms = timed(n)
                if repeat >= 2:
                    samples.setdefault((name, n), []).append(ms)
    print(f"CPU: {cpu_name()}; torch {torch.__version__}; {args.runtime} 1.5B, 60-token contexts")
    print("| N | N sequences, 1 token each (ms) | 1 sequence, N tokens (ms) | N / pass (tok/s) |")
    print("|---|---|---|---|")
    for n in sizes:
        batched = statistics.median(samples[("sequences", n)])
        single = statistics.median(samples[("rows", n)])
        print(f"| {n} | {batched:.1f} | {single:.1f} | {1000 * n / batched:.0f} |")


if __name__ == "__main__":
    main()
