"""N agents at once, each an own conversation of bench/tool_calls.py (first turn sent once
untimed, then the first turn, then the second), against a server on PORT; where the second
turns' time went, and the wall time of the whole. Run from the repository root."""

import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, "bench")
import tool_calls  # noqa: E402
from openai import OpenAI  # noqa: E402
from serving import wait_ready  # noqa: E402

port, rounds = int(sys.argv[1]), int(sys.argv[2])
wait_ready(port)
client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=900)
cases = [
    (name, choice)
    for name, (_, _, named) in tool_calls.REQUESTS.items()
    for choice in tool_calls.CHOICES
    if choice != "named" or named is not None
]
tool_calls.conversation(client, "weather", "auto", True, 8)  # warm-up
for done in range(rounds):
    began = time.perf_counter()
    with ThreadPoolExecutor(len(cases)) as pool:
        runs = list(pool.map(lambda case: tool_calls.conversation(client, *case, True, 96), cases))
    wall = time.perf_counter() - began
    second = [turns[1][1].model_extra["spec_stats"] for turns in runs if len(turns) > 1]
    first = [turns[0][1].model_extra["spec_stats"] for turns in runs]
    first_pre = statistics.median(s["prefill_seconds"] for s in first)
    second_pre = statistics.median(s["prefill_seconds"] for s in second)
    second_max = max(s["prefill_seconds"] for s in second)
    second_s = statistics.median(t[1][0] for t in runs if len(t) > 1)
    print(
        f"round {done}: {len(cases)} agents, wall {wall:.2f} s;",
        f"first turns' prefill median {first_pre:.3f} s,",
        f"second turns' prefill median {second_pre:.3f} s (max {second_max:.3f}),",
        f"second turns' seconds median {second_s:.2f}",
    )
