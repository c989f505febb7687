"""The int4 draft with a weight scale per 32 inputs against one per 128 (fitted), end to end.

python bench/draft_group.py [--prompts-per-workload 20] [--repeats 2] [--max-tokens 128]
                            [--recipe lookup+model] [--k auto] [--out DIR]

The default pair on int4, greedy, ``--k`` (a number: every run's rounds are the same, so the
accepted lengths are the drafts' own; auto: as generate drafts); the draft loaded twice, as
the int4 runtime makes any model (a scale per 32 inputs) and as ``runtime.load_draft`` makes
a draft (per 128, ``backends.quant.int4.DRAFT_GROUP``), both scoring the shipped vocabulary.
Per prompt the two run one after the other from cold caches, the order alternating,
``--repeats`` times; each keeps its own engine (adaptive k learns across requests, as in
``generate`` and ``serve``). Reports per workload the median of the per-prompt ratios of
tokens a second (128 over 32; and of decoding alone, the prefill left out),
the medians of tokens a second, mean accepted length and draft milliseconds a drafted token,
and checks every output equals the target's plain greedy text (int4 speculation is exact bit
for bit).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from specdec import Engine, SamplingParams, SpecConfig
from specdec.bench.harness import WORKLOADS, load_workloads
from specdec.drafters.recipe import DraftSources, build_drafter
from specdec.loading import load_backend
from specdec.machine import cpu_name
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.prompting import encode_prompt
from specdec.runtime import load_draft, score_draft_vocabulary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts-per-workload", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--recipe", default="lookup+model")
    parser.add_argument("--k", default="auto")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    k = args.k if args.k == "auto" else int(args.k)

    target = load_backend(DEFAULT_TARGET, "int4")
    by_32 = load_backend(DEFAULT_DRAFT, "int4")
    score_draft_vocabulary(by_32, DEFAULT_DRAFT, "auto", "int4")
    by_128, _ = load_draft(DEFAULT_DRAFT, "int4")
    drafts = {"32": by_32, "128": by_128}
    engines = {
        name: Engine(target, build_drafter(args.recipe, DraftSources(draft_model=lambda d=d: d)))
        for name, d in drafts.items()
    }
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    prompts = load_workloads(list(WORKLOADS), args.prompts_per_workload)
    plain = {}
    runs: list[dict] = []
    for repeat in range(args.repeats):
        for index, prompt in enumerate(prompts):
            ids = encode_prompt(target.tokenizer, prompt.prompt, prompt.template)
            if prompt.id not in plain:
                plain[prompt.id] = Engine(target).generate(ids, params, SpecConfig(k=0)).token_ids
            order = ["32", "128"] if (index + repeat) % 2 == 0 else ["128", "32"]
            for name in order:
                target.truncate(0)  # every run from a cold cache, as specdec bench runs
                drafts[name].truncate(0)
                out = engines[name].generate(ids, params, SpecConfig(k=k))
                stats = out.stats
                runs.append(
                    {
                        "group": name,
                        "workload": prompt.id.rsplit("-", 1)[0],
                        "prompt_id": prompt.id,
                        "repeat": repeat,
                        "tokens_per_second": stats.tokens_per_second,
                        "decode_tokens_per_second": len(out.token_ids)
                        / (stats.total_seconds - stats.prefill_seconds),
                        "mean_accepted_length": stats.mean_accepted_length,
                        "draft_ms_per_drafted": 1e3
                        * stats.drafter_seconds
                        / max(stats.drafted_tokens, 1),
                        "identical_to_plain": out.token_ids == plain[prompt.id],
                    }
                )
    lines = [
        f"# The int4 draft: a weight scale per 32 inputs against per 128 ({args.recipe}, "
        f"k {args.k})",
        "",
        f"CPU: {cpu_name()}; {args.repeats} repeats, {args.max_tokens} tokens, greedy.",
        "",
        "| workload | prompts | tok/s ratio 128/32 (median of pairs) | decoding alone "
        "| tok/s 32 | tok/s 128 | accepted length 32 / 128 | draft ms a drafted token 32 / 128 "
        "| identical |",
        "|---|---:|---:|---:|---:|---:|---|---|---|",
    ]
    summary = {}
    for workload in [*WORKLOADS, "all"]:
        mine = [r for r in runs if workload in ("all", r["workload"])]
        if not mine:
            continue
        by = {g: [r for r in mine if r["group"] == g] for g in drafts}
        pairs = {(r["prompt_id"], r["repeat"]): r for r in by["32"]}
        ratios = [
            r["tokens_per_second"] / pairs[(r["prompt_id"], r["repeat"])]["tokens_per_second"]
            for r in by["128"]
        ]
        decode = [
            r["decode_tokens_per_second"]
            / pairs[(r["prompt_id"], r["repeat"])]["decode_tokens_per_second"]
            for r in by["128"]
        ]

        summary[workload] = {
            "ratio": statistics.median(ratios),
            "ratio_mean": statistics.fmean(ratios),
            "faster_pairs": sum(x > 1 for x in ratios),
            "decode_ratio": statistics.median(decode),
            "decode_faster_pairs": sum(x > 1 for x in decode),
            "pairs": len(ratios),
            **{
                f"{k}_{g}": statistics.median(r[k] for r in by[g])
                for g in drafts
                for k in runs[0]
                if k.endswith(("second", "length", "drafted"))
            },
            "identical": all(r["identical_to_plain"] for r in mine),
        }
        s = summary[workload]
        lines.append(
            f"| {workload} | {len(ratios) // args.repeats} | {s['ratio']:.3f} "
            f"({s['faster_pairs']}/{s['pairs']} faster, mean {s['ratio_mean']:.3f}) | "
            f"{s['decode_ratio']:.3f} ({s['decode_faster_pairs']}/{s['pairs']}) | "
            f"{s['tokens_per_second_32']:.1f} | {s['tokens_per_second_128']:.1f} | "
            f"{s['mean_accepted_length_32']:.2f} / {s['mean_accepted_length_128']:.2f} | "
            f"{s['draft_ms_per_drafted_32']:.2f} / {s['draft_ms_per_drafted_128']:.2f} | "
            f"{s['identical']} |"
        )
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.md").write_text(report)
        (args.out / "runs.json").write_text(
            json.dumps({"summary": summary, "runs": runs}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
