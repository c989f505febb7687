"""Adaptive k's ceiling: the default drafter with ``SpecConfig(max_k=...)`` at a few values.

python bench/max_k.py [--ceilings 8,12,16] [--prompts-per-workload 3] [--repeats 2]
                      [--max-tokens 64] [--recipe lookup+model]

The default int4 pair, greedy, k auto, the shipped workloads; per workload the ceilings
interleaved over ``--repeats`` rounds. Reports tokens a second (all prompts of a round
together), tokens a round and the rounds that drafted at the ceiling; checks every output
equals the first ceiling's (greedy speculative output is plain decoding's, whatever k).
"""

from __future__ import annotations

import argparse
import statistics

from pair import encoded_prompts, load_int4_pair  # bench/pair.py, beside this script

from specdec import Engine, SamplingParams, SpecConfig
from specdec.bench.harness import WORKLOADS
from specdec.drafters.recipe import build_drafter
from specdec.machine import cpu_name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ceilings", default="8,12,16")
    parser.add_argument("--prompts-per-workload", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--recipe", default="lookup+model")
    args = parser.parse_args()
    ceilings = [int(c) for c in args.ceilings.split(",")]
    target, sources = load_int4_pair()
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    print(f"{cpu_name()}; int4 pair, {args.recipe}, greedy, k auto, {args.max_tokens} tokens")
    print("| workload | max_k | tok/s (each repeat) | tokens a round | rounds at the ceiling |")
    print("|---|---|---|---|---|")
    for workload in WORKLOADS:
        encoded = encoded_prompts(target, workload, args.prompts_per_workload)
        rates: dict[int, list[float]] = {c: [] for c in ceilings}
        shape: dict[int, tuple[float, int]] = {}
        outputs: dict[int, list[list[int]]] = {c: [] for c in ceilings}
        for _ in range(args.repeats):
            for ceiling in ceilings:
                seconds = tokens = rounds = at_ceiling = 0.0
                for ids in encoded:
                    engine = Engine(target, build_drafter(args.recipe, sources))
                    spec = SpecConfig(k="auto", max_k=ceiling)
                    out = engine.generate(ids, params, spec)
                    seconds += out.stats.total_seconds
                    tokens += out.stats.generated_tokens
                    rounds += out.stats.rounds
                    at_ceiling += out.stats.k_per_round.get(ceiling, 0)
                    outputs[ceiling].append(out.token_ids)
                rates[ceiling].append(tokens / seconds)
                shape[ceiling] = (tokens / rounds, int(at_ceiling))
        for ceiling in ceilings:
            each = ", ".join(f"{r:.1f}" for r in rates[ceiling])
            median = statistics.median(rates[ceiling])
            per_round, top = shape[ceiling]
            print(f"| {workload} | {ceiling} | {median:.1f} ({each}) | {per_round:.2f} | {top} |")
        if any(outputs[c] != outputs[ceilings[0]] for c in ceilings):
            raise SystemExit(f"{workload}: outputs differ between ceilings")


if __name__ == "__main__":
    main()
