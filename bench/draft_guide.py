"""The draft model with and without prompt lookup as its guide: passes saved, time a token.

python bench/draft_guide.py [--prompts-per-workload 3] [--repeats 2] [--max-tokens 64]
                            [--min-ngram 1] [--runtime int4]

The default pair, greedy, k auto, the shipped workloads; per workload three drafters
(unguided; guided at a round's start only, as before guesses resumed after a draft; guided)
interleaved over ``--repeats`` rounds (each round runs every prompt with each). Reports the
tokens a second, the drafter's milliseconds a generated token, and for the guided drafter
the rounds with guesses at their start, the guesses (at a round's start and after a draft
that parted from them) and how many of them the draft confirmed (each one a draft pass
saved); checks every output equals the unguided one (the proposals are the same
by construction, so the text is too).
"""

from __future__ import annotations

import argparse
import statistics

from specdec import Engine, SamplingParams, SpecConfig
from specdec.bench.harness import WORKLOADS, load_workloads
from specdec.drafters import ModelDrafter
from specdec.drafters.lookup import PromptLookupDrafter
from specdec.loading import load_backend
from specdec.machine import cpu_name
from specdec.prompting import encode_prompt
from specdec.runtime import load_draft


class CountingGuide(PromptLookupDrafter):
    """Prompt lookup that counts its guesses for the report: the rounds it guessed at the
    start of, and every guess it made (at a round's start and after a draft)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.rounds = self.guesses = 0
        self.last: list[int] = []  # this round's guesses, in the order they were read

    def continuation(self, context, after, k):
        guesses = super().continuation(context, after, k)
        if not after:
            self.rounds += bool(guesses)
            self.last = []
        self.guesses += len(guesses)
        self.last = (self.last + [-1] * len(after))[: len(after)] + guesses  # by position
        return guesses


class StartGuide(CountingGuide):
    """The guide as it was before guesses resumed after a draft: at a round's start only."""

    def continuation(self, context, after, k):
        return [] if after else super().continuation(context, after, k)


ARMS = {"unguided": None, "guided at start": StartGuide, "guided": CountingGuide}


class CountingDrafter(ModelDrafter):
    """Counts the guesses its proposals confirmed (the leading tokens equal to them)."""

    confirmed = 0

    def drafting(self, context, k, sampler=None, keep_going=None, branch=None):
        if self.guide is not None:
            self.guide.last = []
        proposal = yield from super().drafting(context, k, sampler, keep_going, branch)
        guesses = self.guide.last if self.guide is not None else []
        # a draft confirmed a guess where it picked the token guessed at its place
        self.confirmed += sum(
            1 for guess, token in zip(guesses, proposal.token_ids, strict=False) if guess == token
        )
        return proposal


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts-per-workload", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--min-ngram", type=int, default=1)
    parser.add_argument("--runtime", default="int4")
    args = parser.parse_args()
    target = load_backend("qwen2.5-coder-1.5b-instruct", args.runtime)
    draft, _ = load_draft("qwen2.5-coder-0.5b-instruct", args.runtime)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    print(f"{cpu_name()}; {args.runtime} pair, greedy, k auto, {args.max_tokens} tokens")
    print(
        "| workload | drafter | tok/s (each repeat) | draft ms/token "
        "| guessed rounds / rounds | guesses | confirmed |"
    )
    print("|---|---|---|---|---|---|---|")
    for workload in WORKLOADS:
        prompts = load_workloads([workload], args.prompts_per_workload)
        encoded = [encode_prompt(target.tokenizer, p.prompt, p.template) for p in prompts]
        rows: dict[str, list] = {name: [] for name in ARMS}
        texts: dict[str, list] = {name: [] for name in ARMS}
        for _ in range(args.repeats):
            for name, arm in ARMS.items():
                guide = arm(3, args.min_ngram) if arm is not None else None
                seconds = draft_seconds = tokens = rounds = confirmed = 0.0
                for ids in encoded:
                    drafter = CountingDrafter(draft, guide)
                    out = Engine(target, drafter).generate(ids, params, SpecConfig(k="auto"))
                    seconds += out.stats.total_seconds
                    draft_seconds += out.stats.drafter_seconds
                    tokens += out.stats.generated_tokens
                    rounds += out.stats.rounds
                    confirmed += drafter.confirmed
                    texts[name].append(out.token_ids)
                counts = (guide.rounds, rounds, guide.guesses, confirmed) if guide else None
                rows[name].append((tokens / seconds, 1e3 * draft_seconds / tokens, counts))
        for name, runs in rows.items():
            rates = ", ".join(f"{r[0]:.1f}" for r in runs)
            draft_ms = statistics.median(r[1] for r in runs)
            counts = runs[0][2]
            extra = (
                f"{counts[0]} / {int(counts[1])} | {counts[2]} | {int(counts[3])}"
                if counts
                else "- | - | -"
            )
            print(f"| {workload} | {name} | {rates} | {draft_ms:.2f} | {extra} |")
        same = texts["guided"] == texts["unguided"] == texts["guided at start"]
        print(f"| {workload} | outputs equal | {same} | | | | |")
        if not same:
            raise SystemExit(f"{workload}: a guided output differs from the unguided one")


if __name__ == "__main__":
    main()
