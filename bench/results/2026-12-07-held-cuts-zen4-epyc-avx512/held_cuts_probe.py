"""Time ModelDrafter._held_cuts as a server's draft prefill meets it: a 2,000-token
conversation and 160 kept donors (other conversations' turns, the same chat template's
first tokens), the window cut where one of them holds the same text."""

import random
import statistics
import time

from specdec.drafters.model import ModelDrafter

rng = random.Random(0)
SINK = ModelDrafter.PROMPT_SINK
head = [151644, 8948, 198, 2610]  # a chat template's first tokens, shared by all


def text(n):
    return head + [rng.randrange(151_000) for _ in range(n - len(head))]


context = text(2000)
held = [text(rng.randrange(300, 2500)) for _ in range(159)]
held.append(context[:4] + context[700:1900])  # a window read before, cut at 700
drafter = ModelDrafter.__new__(ModelDrafter)
drafter.prompt_tail = 256
cuts = drafter._held_cuts(context, held)
times = []
for _ in range(30):
    t = time.perf_counter()
    drafter._held_cuts(context, held)
    times.append(time.perf_counter() - t)
print(
    f"cuts {cuts}; median {statistics.median(times) * 1e3:.2f} ms "
    f"(min {min(times) * 1e3:.2f}) over 30 calls, 160 donors, 2,000-token context"
)


class Backend:  # what _fit reads of a batched sequence: the prefixes it may copy
    def shareable_prefixes(self):
        return held


drafter.backend = Backend()
times = []
for _ in range(30):
    t = time.perf_counter()
    drafter._fit(context)
    times.append(time.perf_counter() - t)
print(
    f"_fit: window {drafter._skip and drafter._skip[0]}; median "
    f"{statistics.median(times) * 1e3:.2f} ms (min {min(times) * 1e3:.2f})"
)
