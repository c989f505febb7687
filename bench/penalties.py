"""Penalties and logit bias on the default pair: what they cost speculation, and what the
draft's rows changed alike (``adjustments.DraftRows``) win back. Plain decoding against
speculation (``lookup+model``: what ``--drafter auto`` gives where no heads were made; k = 4,
so that greedy acceptance is a property of the drafts alone, not of timings) with the
draft's rows changed as the target's, and left as the draft gives them (``Run.adjust_drafts``
off), for each setting; every output checked identical to plain decoding with the same
setting.

    python bench/penalties.py [--runtime int4] [--max-tokens 96] [--passes 2] [--out DIR]

Four requests through the chat template (code, chat, an edit, a summary), greedy. Per setting
and system: tokens/s (medians over interleaved passes), the speedup over plain decoding with
the same setting, and the acceptance rate.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from specdec import Engine, SamplingParams, SpecConfig
from specdec.bench.report import write_table
from specdec.drafters.recipe import DraftSources, build_drafter
from specdec.engine import Run
from specdec.loading import load_backend
from specdec.machine import cpu_kind, cpu_name
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.prompting import encode_prompt
from specdec.runtime import load_draft

REQUESTS = {
    "code": "Write a Python function that merges two sorted lists into one sorted list.",
    "chat": "Explain the difference between a process and a thread to a new programmer.",
    "edit": "Rename the variable x to total in this code and add type hints:\n\n"
    "def add(x, items):\n    for i in items:\n        x = x + i\n    return x\n",
    "summary": "Summarise in three sentences: speculative decoding lets a small draft model "
    "guess several tokens that the large target model then checks in one forward pass; "
    "rejection sampling keeps the output distribution exactly the target's, so the text is "
    "as good as the target's alone while fewer of its slow steps are needed.",
}
SETTINGS = {
    "none": {},
    "presence 0.5, frequency 0.5": {"presence_penalty": 0.5, "frequency_penalty": 0.5},
    "repetition 1.1": {"repetition_penalty": 1.1},
    "frequency 1.0": {"frequency_penalty": 1.0},
}
SYSTEMS = {  # name: (speculates, draft rows changed alike)
    "plain": (False, False),
    "speculative, draft rows changed": (True, True),
    "speculative, draft rows as given": (True, False),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtime", default="int4", choices=["int8", "int4"])
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args()
    target = load_backend(DEFAULT_TARGET, args.runtime, cache_dir=args.cache_dir)
    draft, _ = load_draft(
        DEFAULT_DRAFT, args.runtime, target_runtime=args.runtime, cache_dir=args.cache_dir
    )  # as generate
    sources = DraftSources(draft_model=lambda: draft)
    rows: dict[tuple[str, str, str], list] = {}
    plain_tokens: dict[tuple[str, str], list[int]] = {}
    for _ in range(args.passes):
        for request_name, request in REQUESTS.items():
            prompt_ids = encode_prompt(target.tokenizer, request, "chat")
            for setting, fields in SETTINGS.items():
                params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, **fields)
                for system, (speculates, changed) in SYSTEMS.items():
                    target.truncate(0)
                    Run.adjust_drafts = changed
                    drafter = build_drafter("lookup+model", sources) if speculates else None
                    spec = SpecConfig(k=4) if speculates else SpecConfig(k=0)
                    out = Engine(target, drafter).generate(prompt_ids, params, spec)
                    if not speculates:
                        plain_tokens[(request_name, setting)] = out.token_ids
                    rows.setdefault((request_name, setting, system), []).append(
                        {
                            "tokens_per_second": out.stats.tokens_per_second,
                            "acceptance_rate": out.stats.acceptance_rate,
                            "identical": out.token_ids == plain_tokens[(request_name, setting)],
                            "tokens": len(out.token_ids),
                        }
                    )
    Run.adjust_drafts = True
    lines = [
        f"# Penalties and logit bias, default pair on {args.runtime}, "
        f"{args.max_tokens} tokens, greedy",
        "",
        f"CPU: {cpu_name()} ({cpu_kind()}); {args.passes} interleaved passes, medians.",
        "",
        "| request | setting | system | tok/s | vs plain (same setting) | acceptance | identical |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    summary = {}
    for request_name in REQUESTS:
        for setting in SETTINGS:
            base = statistics.median(
                r["tokens_per_second"] for r in rows[(request_name, setting, "plain")]
            )
            for system in SYSTEMS:
                runs = rows[(request_name, setting, system)]
                tps = statistics.median(r["tokens_per_second"] for r in runs)
                entry = {
                    "tokens_per_second": tps,
                    "speedup": tps / base,
                    "acceptance_rate": statistics.median(r["acceptance_rate"] for r in runs),
                    "identical": all(r["identical"] for r in runs),
                    "tokens": runs[-1]["tokens"],
                }
                summary[f"{request_name} / {setting} / {system}"] = entry
                lines.append(
                    f"| {request_name} | {setting} | {system} | {tps:.1f} | "
                    f"{entry['speedup']:.2f}x | {entry['acceptance_rate']:.2f} | "
                    f"{entry['identical']} |"
                )
    return write_table(lines, summary, args.out, "results.md", "penalties.json")


if __name__ == "__main__":
    raise SystemExit(main())
