"""The same engine decoding on a thread of its own, before and after the main thread has run
an OpenMP parallel region (a matrix product): what made `specdec serve` slower than
`specdec generate` (``server.setup.load_scheduler``'s docstring).

python bench/openmp_pools.py [--repeats 3] [--max-tokens 48]

The int4 pair (1.5B target, 0.5B draft, drafter model, greedy, k auto) is loaded on a thread
that ends; then the prompt is decoded --repeats times, each on a new thread, first while no
other thread has an OpenMP pool, then after the main thread made one. Prints each run's
tokens/s (the engine's own count: generated tokens / wall time, prefill included).
"""

from __future__ import annotations

import argparse
import sys
import threading

import torch

from specdec.backends.hf import HFModel
from specdec.config import SamplingParams, SpecConfig
from specdec.drafters.recipe import DraftSources, build_drafter
from specdec.engine import Engine
from specdec.loading import load_backend
from specdec.machine import cpu_name

PROMPT = "def quicksort(arr):"


def on_own_thread(work):
    box: dict = {}
    thread = threading.Thread(target=lambda: box.setdefault("out", work()))
    thread.start()
    thread.join()
    return box["out"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    target, draft = on_own_thread(
        lambda: (
            load_backend("qwen2.5-coder-1.5b-instruct", "int4"),
            load_backend("qwen2.5-coder-0.5b-instruct", "int4"),
        )
    )
    tokenizer = target.tokenizer
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)

    def decode() -> float:
        sources = DraftSources(draft_model=lambda: HFModel(draft.model, tokenizer))
        engine = Engine(target, build_drafter("model", sources))
        out = engine.generate(tokenizer.encode(PROMPT), params, SpecConfig())
        return out.stats.tokens_per_second

    print(
        f"CPU: {cpu_name()}; torch {torch.get_num_threads()} threads; python {' '.join(sys.argv)}"
    )
    alone = [on_own_thread(decode) for _ in range(args.repeats)]
    matrix = torch.randn(2000, 2000)
    _ = matrix @ matrix  # the main thread's first parallel region: it keeps a pool from now on
    beside = [on_own_thread(decode) for _ in range(args.repeats)]
    print("tok/s, no other pool:        " + ", ".join(f"{rate:.1f}" for rate in alone))
    print("tok/s, the main thread's too: " + ", ".join(f"{rate:.1f}" for rate in beside))


if __name__ == "__main__":
    main()
