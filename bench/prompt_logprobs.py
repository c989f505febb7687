"""What scoring a prompt costs (``SamplingParams.prompt_logprobs``, the server's ``echo`` with
``logprobs``): the default target's prefill with every row's logits kept, against the plain
prefill that keeps the last row only, for prompts of several lengths and N = 0, 5 and 20
most likely tokens; and whether a scored text gets the values decoding gave it.

    python bench/prompt_logprobs.py [--runtime int4] [--lengths 64,256,1024] [--passes 3]

Each request is what lm-evaluation-harness sends to score a text (one token generated,
plain decoding, greedy); passes interleave the settings; medians of the request's wall
time from an empty cache. Then: 64 tokens decoded with logprobs (speculative, the 0.5B
draft at k = 4), and the prompt plus those tokens scored as a prompt: the share of the
decoded tokens whose values (and top lists) came back the same floats.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from specdec import Engine, SamplingParams, SpecConfig
from specdec.drafters import ModelDrafter
from specdec.loading import load_backend
from specdec.machine import cpu_kind, cpu_name
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET

SETTINGS = (None, 0, 5, 20)
# A text to cut prompts of each length from (this file's own source: code and prose).
SOURCE = Path(__file__).read_text(encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtime", default="int4", choices=["int8", "int4"])
    parser.add_argument("--lengths", default="64,256,1024")
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()
    target = load_backend(DEFAULT_TARGET, args.runtime)
    text_ids = target.tokenizer.encode(SOURCE * 8)
    lengths = [int(n) for n in args.lengths.split(",")]
    seconds: dict[tuple[int, int | None], list[float]] = {}
    for _ in range(args.passes):
        for length in lengths:
            for n in SETTINGS:
                params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=n)
                target.truncate(0)
                began = time.perf_counter()
                out = Engine(target).generate(text_ids[:length], params, SpecConfig(k=0))
                seconds.setdefault((length, n), []).append(time.perf_counter() - began)
                assert n is None or len(out.prompt_logprobs or []) == length
    print(f"CPU: {cpu_name()} ({cpu_kind()}); {args.runtime} target; medians of {args.passes}")
    print("| prompt tokens | plain prefill | N=0 | N=5 | N=20 |")
    print("|---|---|---|---|---|")
    for length in lengths:
        base = statistics.median(seconds[(length, None)])
        cells = [f"{base * 1000:.0f} ms"]
        for n in SETTINGS[1:]:
            value = statistics.median(seconds[(length, n)])
            cells.append(f"{value * 1000:.0f} ms ({value / base:.2f}x)")
        print(f"| {length} | " + " | ".join(cells) + " |")
    draft = load_backend(DEFAULT_DRAFT, args.runtime)
    prompt = target.tokenizer.encode("def merge_sort(items):\n")
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True, logprobs=5)
    target.truncate(0)
    decoded = Engine(target, ModelDrafter(draft)).generate(prompt, params, SpecConfig(k=4))
    scored = Engine(target).generate(
        prompt + decoded.token_ids,
        SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=5),
        SpecConfig(k=0),
    )
    assert decoded.logprobs is not None and scored.prompt_logprobs is not None
    same = sum(
        a == b for a, b in zip(decoded.logprobs, scored.prompt_logprobs[len(prompt) :], strict=True)
    )
    print(
        f"decoded (k=4, {decoded.stats.accepted_tokens} drafts accepted) then scored: "
        f"{same}/{len(decoded.logprobs)} tokens' values and top lists the same floats"
    )


if __name__ == "__main__":
    main()
