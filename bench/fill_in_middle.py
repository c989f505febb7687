"""Fill in the middle (the server's ``suffix``, ``generate --suffix``) on the default pair:
what an editor asks while one types inside a function. Plain decoding against speculation
(the draft model, and prompt lookup before it: the text after the cursor is in the prompt,
and a middle often repeats names from it), k auto, greedy; every output checked identical to
plain decoding.

    python bench/fill_in_middle.py [--runtime int4] [--passes 3] [--out DIR]

The cases: functions of Python's standard library (``inspect.getsource``), each with two
lines of its body cut out at its middle; the prompt is the source before them, the suffix
the source after. Per case and system: the request's wall seconds from an empty cache
(prefill included: what an editor waits), tokens a second over the whole request, the
acceptance rate (medians over interleaved passes); and whether the plain middle is the cut
text (stripped), a measure of the target, not of speculation.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import fnmatch
import heapq
import inspect
import shlex
import statistics
import textwrap
import time
from pathlib import Path

from specdec import Engine, SamplingParams, SpecConfig
from specdec.bench.report import write_table
from specdec.drafters.recipe import DraftSources, build_drafter
from specdec.loading import load_backend
from specdec.machine import cpu_kind, cpu_name
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.prompting import fim_ids
from specdec.runtime import load_draft

FUNCTIONS = {
    "textwrap.indent": textwrap.indent,
    "shlex.quote": shlex.quote,
    "fnmatch.filter": fnmatch.filter,
    "heapq.nsmallest": heapq.nsmallest,
    "difflib.get_close_matches": difflib.get_close_matches,
    "statistics.median": statistics.median,
}
SYSTEMS = {"plain": None, "model": "model", "lookup+model": "lookup+model"}
CUT_LINES = 2


def case(function) -> tuple[str, str, str]:
    """(before, the cut lines, after): two lines from the statement at the middle of the
    function's body (its docstring left out)."""
    source = inspect.getsource(function)
    lines = source.splitlines(keepends=True)
    body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    at = body[len(body) // 2].lineno - 1
    return (
        "".join(lines[:at]),
        "".join(lines[at : at + CUT_LINES]),
        "".join(lines[at + CUT_LINES :]),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtime", default="int4", choices=["int8", "int4"])
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    target = load_backend(DEFAULT_TARGET, args.runtime)
    draft, _ = load_draft(DEFAULT_DRAFT, args.runtime, target_runtime=args.runtime)
    sources = DraftSources(draft_model=lambda: draft)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    cases = {name: case(function) for name, function in FUNCTIONS.items()}
    rows: dict[tuple[str, str], list[dict]] = {}
    plain: dict[str, list[int]] = {}
    for _ in range(args.passes):
        for name, (before, cut, after) in cases.items():
            prompt_ids = fim_ids(target.tokenizer, before, after)
            for system, recipe in SYSTEMS.items():
                target.truncate(0)
                drafter = build_drafter(recipe, sources) if recipe else None
                spec = SpecConfig(k="auto") if recipe else SpecConfig(k=0)
                began = time.perf_counter()
                out = Engine(target, drafter).generate(prompt_ids, params, spec)
                seconds = time.perf_counter() - began
                if recipe is None:
                    plain[name] = out.token_ids
                rows.setdefault((name, system), []).append(
                    {
                        "seconds": seconds,
                        "tokens": len(out.token_ids),
                        "acceptance_rate": out.stats.acceptance_rate,
                        "identical": out.token_ids == plain[name],
                        "cut_text": out.text.strip() == cut.strip(),
                        "prompt_tokens": len(prompt_ids),
                    }
                )
    lines = [
        f"# Fill in the middle, default pair on {args.runtime}, greedy, k auto",
        "",
        f"CPU: {cpu_name()} ({cpu_kind()}); {args.passes} interleaved passes, medians.",
        "",
        "| case | prompt tokens | middle tokens | plain is the cut text | system | request s "
        "| tok/s | vs plain | acceptance | identical |",
        "|---|---:|---:|---|---|---:|---:|---:|---:|---|",
    ]
    summary: dict[str, dict] = {}
    for name in cases:
        base = statistics.median(r["seconds"] for r in rows[(name, "plain")])
        for system in SYSTEMS:
            runs = rows[(name, system)]
            seconds = statistics.median(r["seconds"] for r in runs)
            entry = {
                "seconds": seconds,
                "tokens_per_second": runs[-1]["tokens"] / seconds,
                "speedup": base / seconds,
                "acceptance_rate": statistics.median(r["acceptance_rate"] for r in runs),
                "identical": all(r["identical"] for r in runs),
                "tokens": runs[-1]["tokens"],
                "prompt_tokens": runs[-1]["prompt_tokens"],
                "plain_is_the_cut_text": rows[(name, "plain")][-1]["cut_text"],
            }
            summary[f"{name} / {system}"] = entry
            lines.append(
                f"| {name} | {entry['prompt_tokens']} | {entry['tokens']} | "
                f"{entry['plain_is_the_cut_text']} | {system} | {seconds:.2f} | "
                f"{entry['tokens_per_second']:.1f} | {entry['speedup']:.2f}x | "
                f"{entry['acceptance_rate']:.2f} | {entry['identical']} |"
            )
    for system in SYSTEMS:
        total = sum(summary[f"{name} / {system}"]["seconds"] for name in cases)
        plain_total = sum(summary[f"{name} / plain"]["seconds"] for name in cases)
        lines.append(f"\nAll cases, {system}: {total:.2f} s ({plain_total / total:.2f}x plain)")
    return write_table(lines, summary, args.out, "results.md", "fill_in_middle.json")


if __name__ == "__main__":
    raise SystemExit(main())
