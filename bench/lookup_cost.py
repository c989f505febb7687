"""Cost of one PromptLookupDrafter proposal on long contexts, as decoding grows them.

    python bench/lookup_cost.py

Each step appends 1-5 tokens (an accepted block) and proposes again: the index is
incremental, so a proposal costs O(new tokens), not O(context). Prints medians in µs.
"""

import random
import statistics
import time

from specdec.drafters import PromptLookupDrafter


def measure(context_tokens: int, steps: int = 300, vocab: int = 5000) -> tuple[float, float]:
    rng = random.Random(0)
    context = [rng.randrange(vocab) for _ in range(context_tokens)]
    drafter = PromptLookupDrafter()
    started = time.perf_counter()
    drafter.propose(context, k=8)
    first = time.perf_counter() - started
    samples = []
    for _ in range(steps):
        context += [rng.randrange(vocab) for _ in range(rng.randint(1, 5))]
        started = time.perf_counter()
        drafter.propose(context, k=8)
        samples.append(time.perf_counter() - started)
    return first, statistics.median(samples)


if __name__ == "__main__":
    for n in (1_000, 8_000, 32_000):
        first, per_step = measure(n)
        print(
            f"{n:6d} tokens: first proposal (builds the index) {first * 1e3:7.2f} ms, "
            f"then {per_step * 1e6:6.1f} µs per proposal (median of 300)"
        )
