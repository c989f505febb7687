"""Prompt lookup's k under noisy pass costs: the adaptive controller, with and without its
optimism about pass sizes measured only a few times.

python bench/lookup_policy.py [--runtime float32] [--seeds 6] [--sigma 0.3] [--extra 0.06]
                              [--step 0.35] [--max-tokens 80] [--ids edit-8,edit-3,edit-1]

The target decodes for real (greedy, ``--drafter lookup``, ``-k auto``), but the clock the
controller reads is modelled: a pass of n tokens costs ``step * (1 + extra * (n - 1))``
times a lognormal noise of ``sigma`` (a shared machine's passes vary by a third or more;
the first pass of a size is often slow), the prefill is not charged and lookup's drafts
cost nothing. So both policies meet the same costs and the same noise (one noise stream per
seed), and the difference between them is the policy's alone. ``--clock real`` runs the
two policies interleaved on the real clock instead (``--seeds`` passes each) and reports
their tokens per second. Reported per prompt and
policy over the seeds: mean accepted length (tokens a round), rounds, and the modelled
speedup, tokens * step / (modelled seconds of the passes). ``trusted_after`` 1 believes a
size's own median from its first observation (the controller before issue 45); 3 is
today's default (``controller.TRUSTED_AFTER``). Texts are checked equal to plain greedy.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
from types import SimpleNamespace

import specdec.engine as engine_module
from specdec import Engine, SamplingParams, SpecConfig
from specdec.bench.harness import load_workloads
from specdec.controller import TRUSTED_AFTER, AdaptiveK
from specdec.drafters import PromptLookupDrafter
from specdec.loading import load_backend
from specdec.machine import cpu_name
from specdec.prompting import encode_prompt

TARGET = "qwen2.5-coder-1.5b-instruct"


class ModelledClock:
    """What ``engine`` reads as ``time.perf_counter``: advanced by modelled pass costs."""

    def __init__(self, step: float, extra: float, sigma: float, seed: int):
        self.step, self.extra, self.sigma = step, extra, sigma
        self.rng = random.Random(seed)
        self.now = 0.0
        self.charged: list[int] = []

    def perf_counter(self) -> float:
        return self.now

    def charge(self, rows: int) -> None:
        self.charged.append(rows)
        noise = math.exp(self.rng.gauss(0.0, self.sigma))
        self.now += self.step * (1.0 + self.extra * (rows - 1)) * noise

    def modelled_seconds(self) -> float:
        return sum(self.step * (1.0 + self.extra * (n - 1)) for n in self.charged)


def run(target, prompt_ids, max_tokens: int, trusted_after: int, clock: ModelledClock | None):
    """One greedy lookup run; the modelled speedup (None on the real clock)."""
    if clock is None:
        return _generate(target, prompt_ids, max_tokens, trusted_after), None
    forward = target.forward

    def charged(tokens, last_only=False):
        out = forward(tokens, last_only)
        if not last_only:  # the prefill is one last_only pass; decode passes score every row
            clock.charge(len(tokens))
        return out

    target.forward = charged
    engine_module.time = SimpleNamespace(perf_counter=clock.perf_counter)
    try:
        out = _generate(target, prompt_ids, max_tokens, trusted_after)
    finally:
        target.forward = forward
        engine_module.time = __import__("time")
    speedup = len(out.token_ids) * clock.step / clock.modelled_seconds()
    return out, speedup


def _generate(target, prompt_ids, max_tokens: int, trusted_after: int):
    controller = AdaptiveK(max_k=8, trusted_after=trusted_after)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    engine = Engine(target, PromptLookupDrafter(), controller)
    return engine.generate(prompt_ids, params, SpecConfig(k="auto"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtime", default="float32")
    parser.add_argument("--clock", choices=("modelled", "real"), default="modelled")
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--sigma", type=float, default=0.3)
    parser.add_argument("--extra", type=float, default=0.06)
    parser.add_argument("--step", type=float, default=0.35)
    parser.add_argument("--max-tokens", type=int, default=80)
    parser.add_argument("--ids", default="edit-8,edit-3,edit-1", help="bench prompts, by id")
    args = parser.parse_args()
    target = load_backend(TARGET, args.runtime)
    wanted = args.ids.split(",")
    prompts = sorted(
        (item for item in load_workloads() if item.id in wanted), key=lambda i: wanted.index(i.id)
    )
    rows = []
    for prompt in prompts:
        ids = encode_prompt(target.tokenizer, prompt.prompt, prompt.template)
        greedy = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
        plain = Engine(target).generate(ids, greedy)
        print(
            json.dumps(
                {
                    "prompt": prompt.id,
                    "plain_tokens_per_second": round(plain.stats.tokens_per_second, 2),
                }
            ),
            flush=True,
        )
        results: dict[int, dict[str, list]] = {
            policy: {"lengths": [], "speedups": [], "rounds": [], "tok_s": []}
            for policy in (1, TRUSTED_AFTER)
        }
        for seed in range(args.seeds):  # the policies interleaved, pass by pass
            for trusted_after, got in results.items():
                clock = (
                    ModelledClock(args.step, args.extra, args.sigma, seed)
                    if args.clock == "modelled"
                    else None
                )
                out, speedup = run(target, ids, args.max_tokens, trusted_after, clock)
                assert out.token_ids == plain.token_ids, "lookup changed the greedy text"
                got["lengths"].append(round(out.stats.mean_accepted_length, 2))
                got["rounds"].append(out.stats.rounds)
                got["tok_s"].append(round(out.stats.tokens_per_second, 2))
                if speedup is not None:
                    got["speedups"].append(round(speedup, 3))
        for trusted_after, got in results.items():
            measure = got["speedups"] or got["tok_s"]
            row = {
                "prompt": prompt.id,
                "trusted_after": trusted_after,
                "mean_accepted_length": got["lengths"],
                "rounds": got["rounds"],
                ("modelled_speedup" if got["speedups"] else "tokens_per_second"): measure,
                "median": round(statistics.median(measure), 3),
                "min": round(min(measure), 3),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(json.dumps({"cpu": cpu_name(), "args": vars(args)}))


if __name__ == "__main__":
    main()
