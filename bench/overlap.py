"""Would drafting while the target verifies pay on two cores? (issue 47, item 4)

python bench/overlap.py [--k 2,4] [--repeats 15]

Speculative decoding runs a round's k draft steps, then the target's pass over the k + 1
tokens, one after the other, each on both cores. A pipelined engine (PEARL, Liu et al. 2024)
would run the next round's drafts beside the target's pass, each on one core. This times, on
the default int4 pair after a 64-token context: the sequential round (k draft steps, then
the (k + 1)-token pass, 2 threads each), and the same work overlapped (the pass on one Python
thread, the k steps on another, 1 OpenMP thread each; the kernel's layer stack runs without
the GIL, the output layers hold it); also each part alone on one thread. Medians of
interleaved repeats. Overlapped below sequential is the most a pipeline could win per round
(less: its drafts are wasted when a draft is rejected).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch

from specdec.loading import load_backend
from specdec.machine import cpu_name


def timed(work, *args) -> float:
    started = time.perf_counter()
    work(*args)
    return 1000 * (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", default="2,4", help="drafts a round (default: 2,4)")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    target = load_backend("qwen2.5-coder-1.5b-instruct", "int4")
    draft = load_backend("qwen2.5-coder-0.5b-instruct", "int4")
    context = [1000 + i for i in range(64)]
    target.forward(context[:-1])
    draft.forward(context[:-1])
    held = len(context) - 1

    def verify(k: int):
        target.forward(context[-1:] + [5] * k)
        target.truncate(held)

    def drafts(k: int):
        for i in range(k):
            draft.forward([5 + i] if i else context[-1:], last_only=True)
        draft.truncate(held)

    def overlapped(k: int) -> float:
        other = threading.Thread(target=drafts, args=(k,))
        started = time.perf_counter()
        other.start()
        verify(k)
        other.join()
        return 1000 * (time.perf_counter() - started)

    print(f"CPU: {cpu_name()}; torch {torch.__version__}; default int4 pair, 64-token context")
    for k in map(int, args.k.split(",")):
        samples: dict[str, list[float]] = {}
        for _ in range(args.repeats + 2):  # the first two warm up
            torch.set_num_threads(2)
            seq_draft, seq_verify = timed(drafts, k), timed(verify, k)
            torch.set_num_threads(1)
            one_draft, one_verify = timed(drafts, k), timed(verify, k)
            both = overlapped(k)
            for name, value in (
                ("sequential", seq_draft + seq_verify), ("drafts 2 threads", seq_draft),
                ("pass 2 threads", seq_verify), ("drafts 1 thread", one_draft),
                ("pass 1 thread", one_verify), ("overlapped", both),
            ):  # fmt: skip
                samples.setdefault(name, []).append(value)
        medians = {name: statistics.median(values[2:]) for name, values in samples.items()}
        parts = ", ".join(f"{name} {ms:.1f} ms" for name, ms in medians.items())
        ratio = medians["overlapped"] / medians["sequential"]
        print(f"k = {k}: {parts}; overlapped / sequential {ratio:.2f}")
    torch.set_num_threads(2)


if __name__ == "__main__":
    main()
