"""Predicted outputs (OpenAI's ``prediction``; ``generate --prediction``) on the default pair:
edits of code where the client sends the code as it stands as the prediction. Plain
decoding, the default drafter without it (prompt lookup then the draft model: the code is in
the prompt, so lookup copies it too), and the prediction in front of that; k auto, greedy,
chat template; every output checked identical to plain decoding.

    python bench/prediction.py [--runtime int4] [--passes 2] [--max-tokens 192] [--out DIR]

The code: functions of Python's standard library (``inspect.getsource``, docstrings
dropped). Per request and system: tokens a second over the whole request (prefill included),
its speedup over plain decoding, the acceptance rate, and the share of the output's tokens
that were accepted prediction drafts (medians over interleaved passes).
"""

from __future__ import annotations

import argparse
import ast
import functools
import inspect
import shlex
import statistics
import textwrap
from pathlib import Path

from specdec import Engine, SamplingParams, SpecConfig
from specdec.bench.report import write_table
from specdec.drafters.prediction import PREDICTION, PredictionDrafter
from specdec.drafters.recipe import DraftSources, build_drafter
from specdec.loading import load_backend
from specdec.machine import cpu_kind, cpu_name
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.prompting import encode_prompt
from specdec.runtime import load_draft

EDITS = {
    "rename": (textwrap.indent, "Rename the parameter `prefix` to `margin` everywhere."),
    "type hints": (shlex.quote, "Add type hints to this function's signature."),
    "logging": (
        statistics.median_low,
        "Add a `logging.debug` call at the start that logs the number of data points.",
    ),
    "error message": (
        statistics.mode,
        "Make the StatisticsError's message say 'mode of an empty sequence'.",
    ),
}
SYSTEMS = {"plain": None, "lookup+model": "lookup+model", "prediction+lookup+model": "lookup+model"}


def code_of(function) -> str:
    """The function's source without its docstring."""
    source = textwrap.dedent(inspect.getsource(function))
    tree = ast.parse(source)
    body = tree.body[0].body  # type: ignore[attr-defined]
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        lines = source.splitlines(keepends=True)
        del lines[body[0].lineno - 1 : body[0].end_lineno]
        source = "".join(lines)
    return source


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtime", default="int4", choices=["int8", "int4"])
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    target = load_backend(DEFAULT_TARGET, args.runtime)
    draft, _ = load_draft(DEFAULT_DRAFT, args.runtime, target_runtime=args.runtime)
    tokenizer = target.tokenizer
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    rows: dict[tuple[str, str], list[dict]] = {}
    plain: dict[str, list[int]] = {}
    for _ in range(args.passes):
        for name, (function, instruction) in EDITS.items():
            code = code_of(function)
            request = f"{instruction} Answer with the whole function.\n\n```python\n{code}```"
            prompt_ids = encode_prompt(tokenizer, request, "chat")
            predicted = tokenizer.encode(code, add_special_tokens=False)
            for system, recipe in SYSTEMS.items():
                target.truncate(0)
                sources = DraftSources(draft_model=lambda: draft)
                if system.startswith(PREDICTION):
                    made = functools.partial(PredictionDrafter, predicted, len(prompt_ids))
                    sources, recipe = DraftSources(lambda: draft, prediction=made), system
                drafter = build_drafter(recipe, sources) if recipe else None
                spec = SpecConfig(k="auto") if recipe else SpecConfig(k=0)
                out = Engine(target, drafter).generate(prompt_ids, params, spec)
                if recipe is None:
                    plain[name] = out.token_ids
                from_prediction = out.stats.by_drafter.get(PREDICTION, {}).get("accepted", 0)
                rows.setdefault((name, system), []).append(
                    {
                        "tokens_per_second": out.stats.tokens_per_second,
                        "acceptance_rate": out.stats.acceptance_rate,
                        "identical": out.token_ids == plain[name],
                        "tokens": len(out.token_ids),
                        "from_prediction": from_prediction / max(len(out.token_ids), 1),
                    }
                )
    lines = [
        f"# Predicted outputs on code edits, default pair on {args.runtime}, greedy, k auto",
        "",
        f"CPU: {cpu_name()} ({cpu_kind()}); {args.passes} interleaved passes, medians.",
        "",
        "| edit | tokens | system | tok/s | vs plain | acceptance | from the prediction "
        "| identical |",
        "|---|---:|---|---:|---:|---:|---:|---|",
    ]
    summary: dict[str, dict] = {}
    for name in EDITS:
        base = statistics.median(r["tokens_per_second"] for r in rows[(name, "plain")])
        for system in SYSTEMS:
            runs = rows[(name, system)]
            tps = statistics.median(r["tokens_per_second"] for r in runs)
            entry = {
                "tokens_per_second": tps,
                "speedup": tps / base,
                "acceptance_rate": statistics.median(r["acceptance_rate"] for r in runs),
                "from_prediction": statistics.median(r["from_prediction"] for r in runs),
                "identical": all(r["identical"] for r in runs),
                "tokens": runs[-1]["tokens"],
            }
            summary[f"{name} / {system}"] = entry
            lines.append(
                f"| {name} | {entry['tokens']} | {system} | {tps:.1f} | {entry['speedup']:.2f}x | "
                f"{entry['acceptance_rate']:.2f} | {entry['from_prediction']:.2f} | "
                f"{entry['identical']} |"
            )
    return write_table(lines, summary, args.out, "results.md", "prediction.json")


if __name__ == "__main__":
    raise SystemExit(main())
