"""The draft with a trimmed vocabulary (FR-Spec) against the full one, side by side.

python bench/trimmed_vocab.py VOCAB_FILE [--runtime int8|int4] [--workloads code,chat]
    [--prompts-per-workload 2] [--max-tokens 48] [--k auto|N] [--temperature T]

Measures, on the default pair with target and draft on ``--runtime`` (default int8): the
draft's one-token step with the full output layer and with the trimmed one (median of 40,
interleaved), then decodes the shipped prompts of ``--workloads`` (k = --k, auto by default;
greedy, or sampled at ``--temperature`` with a seed per prompt, verified coupled), the full
and the trimmed draft interleaved over two passes, and reports tokens/s, acceptance, mean
accepted length and whether each output equals plain decoding (the same seed's text).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from importlib import resources

from specdec import Engine, SamplingParams, SpecConfig
from specdec.backends.hf import HFModel
from specdec.backends.trim import trim_output_layer
from specdec.drafters import ModelDrafter
from specdec.loading import load_backend
from specdec.machine import cpu_name
from specdec.prompting import encode_prompt
from specdec.vocab import load


def step_ms(draft: HFModel, context: list[int], repeats: int = 40) -> list[float]:
    draft.truncate(0)
    draft.forward(context, last_only=True)
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        draft.forward([context[-1]], last_only=True)
        samples.append(1000 * (time.perf_counter() - started))
        draft.truncate(len(context))
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("vocab_file")
    parser.add_argument("--prompts-per-workload", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--runtime", choices=("int8", "int4"), default="int8")
    parser.add_argument("--workloads", default="code,chat")
    parser.add_argument("--k", default="auto", help="auto, or a fixed number of drafts a round")
    parser.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_args()
    target = load_backend("qwen2.5-coder-1.5b-instruct", args.runtime)
    full = load_backend("qwen2.5-coder-0.5b-instruct", args.runtime)
    trimmed = HFModel(copy.deepcopy(full.model), full.tokenizer)
    ids = load(args.vocab_file, full.vocab_size)
    trim_output_layer(trimmed.model, ids)
    context = list(range(1000, 1032))
    full_steps, trimmed_steps = [], []
    for _ in range(3):  # interleaved
        full_steps += step_ms(full, context)
        trimmed_steps += step_ms(trimmed, context)
    print(
        f"CPU: {cpu_name()}; runtime {args.runtime}; trimmed vocabulary: {len(ids)} of "
        f"{full.vocab_size} tokens; k {args.k}; temperature {args.temperature}"
    )
    print(
        f"draft step: full {statistics.median(full_steps):.2f} ms, trimmed "
        f"{statistics.median(trimmed_steps):.2f} ms"
    )
    engines = {
        "plain": Engine(target),
        "full draft": Engine(target, ModelDrafter(full)),
        "trimmed draft": Engine(target, ModelDrafter(trimmed)),
    }
    k = args.k if args.k == "auto" else int(args.k)
    rows: dict[tuple[str, str], list] = {}
    for workload in args.workloads.split(","):
        text = resources.files("specdec.bench").joinpath(f"workloads/{workload}.jsonl").read_text()
        prompts = [json.loads(line) for line in text.splitlines() if line.strip()]
        for seed, item in enumerate(prompts[: args.prompts_per_workload]):
            prompt = encode_prompt(target.tokenizer, item["prompt"], item["template"])
            params = SamplingParams(
                max_tokens=args.max_tokens, temperature=args.temperature, seed=seed
            )
            for _ in range(2):
                plain = None
                for name, engine in engines.items():
                    target.truncate(0)
                    out = engine.generate(prompt, params, SpecConfig(k=0 if name == "plain" else k))
                    plain = out.token_ids if name == "plain" else plain
                    rows.setdefault((workload, name), []).append(
                        (out.stats, out.token_ids == plain)
                    )
    print("| workload | drafter | tok/s median | acceptance | mean accepted length | identical |")
    print("|---|---|---|---|---|---|")
    for (workload, name), runs in rows.items():
        tps = statistics.median(s.tokens_per_second for s, _ in runs)
        drafted = sum(s.drafted_tokens for s, _ in runs)
        accepted = sum(s.accepted_tokens for s, _ in runs)
        rounds = sum(s.rounds for s, _ in runs)
        same = sum(identical for _, identical in runs)
        rate = f"{accepted / drafted:.2f}" if drafted else "-"
        print(
            f"| {workload} | {name} | {tps:.2f} | {rate} | {1 + accepted / rounds:.2f} "
            f"| {same}/{len(runs)} |"
        )


if __name__ == "__main__":
    main()
