"""What returning logprobs costs: tokens/s of the default pair with logprobs off and at
N = 0, 5 and 20 most likely tokens (issue 50), speculative and plain.

    python bench/logprobs_cost.py [--runtime int4] [--max-tokens 128] [--passes 3]

One code prompt, greedy, the 0.5B draft at k = 4; passes interleave the settings; medians.
Also checks that the tokens are the same with and without logprobs, and that speculative
and plain decoding return the same values.
"""

from __future__ import annotations

import argparse
import statistics

from specdec import Engine, SamplingParams, SpecConfig
from specdec.drafters import ModelDrafter
from specdec.loading import load_backend
from specdec.machine import cpu_kind, cpu_name
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET

PROMPT = "def merge_sort(items):\n"
SETTINGS = (None, 0, 5, 20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtime", default="int4", choices=["int8", "int4"])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()
    target = load_backend(DEFAULT_TARGET, args.runtime)
    draft = load_backend(DEFAULT_DRAFT, args.runtime)
    prompt_ids = target.tokenizer.encode(PROMPT)
    speeds: dict[tuple[str, int | None], list[float]] = {}
    outputs = {}
    for _ in range(args.passes):
        for mode, spec in (("speculative k=4", SpecConfig(k=4)), ("plain", SpecConfig(k=0))):
            for n in SETTINGS:
                params = SamplingParams(
                    max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True, logprobs=n
                )
                target.truncate(0)
                drafter = ModelDrafter(draft) if spec.k else None
                out = Engine(target, drafter).generate(prompt_ids, params, spec)
                speeds.setdefault((mode, n), []).append(out.stats.tokens_per_second)
                outputs[(mode, n)] = out
    print(f"CPU: {cpu_name()} ({cpu_kind()}); {args.runtime}, {args.max_tokens} tokens, medians")
    for mode in ("speculative k=4", "plain"):
        base = statistics.median(speeds[(mode, None)])
        for n in SETTINGS:
            tps = statistics.median(speeds[(mode, n)])
            same = outputs[(mode, n)].token_ids == outputs[(mode, None)].token_ids
            label = "off" if n is None else f"N={n}"
            print(
                f"{mode:16s} logprobs {label:5s} {tps:6.1f} tok/s ({tps / base:.3f}x), "
                f"same tokens {same}"
            )
    for n in SETTINGS[1:]:
        equal = outputs[("speculative k=4", n)].logprobs == outputs[("plain", n)].logprobs
        print(f"N={n}: speculative logprobs == plain logprobs, bit for bit: {equal}")


if __name__ == "__main__":
    main()
