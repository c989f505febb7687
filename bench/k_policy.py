"""How adaptive k bounds a round: the shipped policy against drafting to the ceiling and
letting the draft's confidence end the round.

python bench/k_policy.py [--prompts-per-workload 3] [--repeats 2] [--max-tokens 64]
                         [--warm] [--compare-warm]

The default int4 pair, the draft model (guided by lookup, as shipped), greedy, k auto, the
shipped workloads. Arms, interleaved over ``--repeats`` rounds: ``shipped`` (``AdaptiveK``:
``choose_k`` bounds the round at the depth the per-position acceptance makes best, then
``keep_going`` may end it sooner from the draft's confidence in each token); ``ceiling``
(the same, but a round that drafts at all is bounded by ``max_k`` only: the confidences
alone end it). Each request starts with a fresh policy (what one ``specdec generate`` does),
or with ``--warm`` one policy per arm serves all of a workload's requests (what the bench
and a server do). Reports tokens a second, tokens a round and the k the rounds were
bounded by; checks the outputs are equal (greedy: plain decoding's, whatever k).
"""

from __future__ import annotations

import argparse
import statistics

from pair import encoded_prompts, load_int4_pair  # bench/pair.py, beside this script

from specdec import Engine, SamplingParams, SpecConfig
from specdec.bench.harness import WORKLOADS
from specdec.controller import AdaptiveK
from specdec.drafters.recipe import build_drafter
from specdec.machine import cpu_name


class Ceiling(AdaptiveK):
    """Drafts to the ceiling whenever drafting pays at all; confidences end the round."""

    def choose_k(self) -> int:
        best = super().choose_k()
        return self.max_k if best > 0 else 0


ARMS = {"shipped": AdaptiveK, "ceiling": Ceiling}
WARM = "shipped, warm"  # --compare-warm: the shipped policy kept across every request


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts-per-workload", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--warm", action="store_true")
    parser.add_argument(
        "--compare-warm",
        action="store_true",
        help="arms: the shipped policy fresh for every request against one kept across all "
        "requests and repeats (what a policy saved between runs would give)",
    )
    args = parser.parse_args()
    arms = {"shipped": AdaptiveK, WARM: AdaptiveK} if args.compare_warm else ARMS
    kept = {WARM: AdaptiveK(max_k=SpecConfig().max_k)}
    target, sources = load_int4_pair()
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    spec = SpecConfig(k="auto")
    start = "warm (one policy a workload)" if args.warm else "cold (a policy a request)"
    print(f"{cpu_name()}; int4 pair, model, greedy, k auto, {args.max_tokens} tokens, {start}")
    print("| workload | policy | tok/s (each repeat) | tokens a round | k bounds (k: rounds) |")
    print("|---|---|---|---|---|")
    for workload in WORKLOADS:
        encoded = encoded_prompts(target, workload, args.prompts_per_workload)
        rates: dict[str, list[float]] = {name: [] for name in arms}
        shape: dict[str, tuple[float, dict]] = {}
        outputs: dict[str, list[list[int]]] = {name: [] for name in arms}
        for _ in range(args.repeats):
            for name, policy in arms.items():
                controller = kept.get(name) or policy(max_k=spec.max_k)
                seconds = tokens = rounds = 0.0
                bounds: dict[int, int] = {}
                for ids in encoded:
                    if not args.warm and name not in kept:
                        controller = policy(max_k=spec.max_k)
                    engine = Engine(target, build_drafter("model", sources), controller)
                    out = engine.generate(ids, params, spec)
                    seconds += out.stats.total_seconds
                    tokens += out.stats.generated_tokens
                    rounds += out.stats.rounds
                    for k, count in out.stats.k_per_round.items():
                        bounds[k] = bounds.get(k, 0) + count
                    outputs[name].append(out.token_ids)
                rates[name].append(tokens / seconds)
                shape[name] = (tokens / rounds, dict(sorted(bounds.items())))
        for name in arms:
            each = ", ".join(f"{r:.1f}" for r in rates[name])
            per_round, bounds = shape[name]
            median = statistics.median(rates[name])
            print(f"| {workload} | {name} | {median:.1f} ({each}) | {per_round:.2f} | {bounds} |")
        if any(outputs[name] != outputs["shipped"] for name in arms):
            raise SystemExit(f"{workload}: outputs differ between policies")


if __name__ == "__main__":
    main()
