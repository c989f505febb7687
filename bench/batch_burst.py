"""A burst of N requests decoded in batched steps in-process (no server, no HTTP): what the
engine's continuous batching itself gives on the real pair (int8, or --runtime int4).

python bench/batch_burst.py [--clients 1,8] [--workload code] [--max-rows 32] [--repeats 2]
                            [--configs auto,auto-always,0] [--drafters model,lookup+model]
                            [--max-tokens 48] [--runtime int8|int4]

Each burst starts N requests of the workload (prefill one after another, as the server's
joining requests are), then calls ``engine.step_together`` until all are done, the draft
model's passes batched too, with one k controller shared by the requests (as the server
shares it). Configurations (--configs) run interleaved, burst by burst, each with its own
controller: ``auto`` as the server (k auto, and whether a step drafts at all learned per
batch size: ``controller.BatchDrafting``), ``auto-steady`` (the same, without backing off
its tries of the slower way), ``auto-always`` (k auto, every step may draft),
or a fixed k (``0``: plain batched decoding); with several ``--drafters`` (recipes of
``model`` and ``lookup``, as the server builds them), every configuration runs with each.
Reported per burst: tokens/s over the whole burst (prefill included), the prefill seconds,
the number of batched steps and the rows they scored (the work, less noisy than the time);
with --trace, each step's requests and tokens.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from specdec.backends.hf import source_of
from specdec.bench.harness import load_workloads
from specdec.config import SamplingParams, SpecConfig
from specdec.controller import BatchDrafting
from specdec.drafters import ModelDrafter, PromptLookupDrafter
from specdec.drafters.recipe import build_drafter
from specdec.engine import Engine, new_controller, step_together
from specdec.loading import load_backend
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.prompting import encode_prompt
from specdec.runtime import load_draft


def drafter(recipe: str, draft):
    """A request's drafter, as the server builds it (``server/scheduler.py``)."""
    factories = {"lookup": PromptLookupDrafter, "model": lambda: ModelDrafter(draft.sequence())}
    return build_drafter(recipe, factories)


def burst(target, draft, tokenizer, items, n, max_rows, setup, max_tokens, trace=False):
    recipe, controller, k, policy = setup
    started = time.perf_counter()
    runs = []
    for item in (items * n)[:n]:
        prompt = encode_prompt(tokenizer, item.prompt, item.template)
        engine = Engine(target.sequence(), drafter(recipe, draft), controller)
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        run = engine.begin(prompt, params, SpecConfig(k=k))
        run.start(policy is None or policy.prefers_drafting(n))
        runs.append(run)
    prefill = time.perf_counter() - started
    tokens = steps = rows = 0
    active = runs
    while active:
        chunks = step_together(active, target.forward_many, max_rows, policy)
        steps += 1
        if trace:
            counts = [len(chunk.token_ids) for chunk in chunks]
            print(f"  step {steps}: {len(active)} requests, tokens {counts}")
        for chunk in chunks:
            if isinstance(chunk, Exception):
                raise chunk
            tokens += len(chunk.token_ids)
            rows += 1 + chunk.num_from_draft + len(chunk.rejected_ids)  # last token + drafts
        active = [r for r, c in zip(active, chunks, strict=True) if c.finish_reason is None]
    return tokens / (time.perf_counter() - started), prefill, steps, rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,8")
    parser.add_argument("--workload", default="code")
    parser.add_argument("--max-rows", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--configs",
        default="auto",
        help="comma-separated, run interleaved burst by burst: auto (k auto, drafting per "
        "batch size learned as the server does), auto-steady (the same, trying the slower way "
        "every explore_every steps, without backing off), auto-always (k auto, every step may "
        "draft), or a fixed k (0: no drafting)",
    )
    parser.add_argument(
        "--drafters",
        default="model",
        help="comma-separated drafter recipes of model and lookup (model, lookup+model), "
        "each configuration run with each, interleaved",
    )
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--runtime", default="int8", help="int8 or int4: both models' runtime")
    args = parser.parse_args()
    items = load_workloads([args.workload])
    target = load_backend(DEFAULT_TARGET, args.runtime)
    loaded, _ = load_draft(DEFAULT_DRAFT, args.runtime, batched=True)  # as the server loads it
    batched, draft_batched = source_of(target), source_of(loaded)
    recipes = args.drafters.split(",")
    max_k = SpecConfig(k="auto").max_k
    configs = {}
    for name in args.configs.split(","):
        for recipe in recipes:
            k = int(name) if name.isdigit() else "auto"
            policy = None
            if name == "auto":
                policy = BatchDrafting()
            elif name == "auto-steady":  # tries the other way every explore_every steps
                policy = BatchDrafting(explore_most=BatchDrafting.explore_every)
            # one controller per configuration for all its bursts, as the server keeps one
            controller = new_controller(drafter(recipe, draft_batched), max_k)
            label = name if len(recipes) == 1 else f"{name} {recipe}"
            configs[label] = (recipe, controller, k, policy)
    print(
        f"{os.cpu_count()} cores; {args.workload}, {args.max_tokens} tokens, "
        f"max rows {args.max_rows}"
    )
    tokenizer = target.tokenizer
    for setup in configs.values():  # warm-up
        burst(batched, draft_batched, tokenizer, items, 2, args.max_rows, setup, args.max_tokens)
    for n in (int(c) for c in args.clients.split(",")):
        results: dict[str, list] = {name: [] for name in configs}
        for repeat in range(args.repeats):
            names = list(configs)
            shift = repeat % len(names)  # the order rotated burst by burst
            for name in names[shift:] + names[:shift]:
                results[name].append(
                    burst(
                        batched,
                        draft_batched,
                        tokenizer,
                        items,
                        n,
                        args.max_rows,
                        configs[name],
                        args.max_tokens,
                        args.trace,
                    )
                )
        for name, runs in results.items():
            rates = [rate for rate, *_ in runs]
            print(
                f"{n} requests, {name}: {statistics.median(rates):.1f} tok/s "
                f"(runs: {', '.join(f'{r:.1f}' for r in rates)}), prefill "
                f"{statistics.median(p for _, p, _, _ in runs):.2f} s, steps "
                f"{[s for _, _, s, _ in runs]}, rows {[r for *_, r in runs]}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
