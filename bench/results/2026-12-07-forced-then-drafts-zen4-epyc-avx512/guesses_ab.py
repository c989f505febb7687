"""In one process, interleaved: the draft model drafting through tokens the grammar forces
in the middle of its chain a pass each (as before) against reading them as guesses in the
pass before them (``ModelDrafter._guesses``: ``DraftMask.forced``), on the three JSON schemas
of ``bench/structured.py``, default pair on int4, greedy, 128 tokens, k auto; JSON as
llguidance compiles it by default and compact (as ``forced_ab.py``).

    python guesses_ab.py --passes 3 > guesses-ab.txt
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from llguidance import LLMatcher

import specdec.grammar as grammar
from specdec import Engine, SamplingParams, SpecConfig
from specdec.config import Constraint
from specdec.drafters.recipe import DraftSources, build_drafter
from specdec.loading import load_backend
from specdec.machine import cpu_kind, cpu_name
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.prompting import encode_prompt
from specdec.runtime import load_draft

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/
from structured import SCHEMAS  # noqa: E402

SETTING = {"compact": False, "unguessed": False}
_grammar_text = grammar._grammar_text
_forced = grammar.DraftMask.forced


def grammar_text(constraint: Constraint) -> str:
    if constraint.kind == "json_schema" and SETTING["compact"]:
        compact = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
        return LLMatcher.grammar_from_json_schema(constraint.source, defaults=compact)
    return _grammar_text(constraint)


def forced(self):
    """As before this change: the draft guesses no forced tokens."""
    return [] if SETTING["unguessed"] else _forced(self)


grammar._grammar_text = grammar_text
grammar.DraftMask.forced = forced
SYSTEMS = (  # name, drafter recipe, forced tokens a draft pass each
    ("plain constrained", "none", False),
    ("model, a pass each", "model", True),
    ("model, read as guesses", "model", False),
    ("lookup+model, a pass each", "lookup+model", True),
    ("lookup+model, read as guesses", "lookup+model", False),
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()
    target = load_backend(DEFAULT_TARGET, "int4")
    draft, _ = load_draft(DEFAULT_DRAFT, "int4", target_runtime="int4")
    sources = DraftSources(draft_model=lambda: draft, heads={})
    runs: dict[tuple[str, str, str], list[dict]] = {}
    for _ in range(args.passes):
        for whitespace in ("default", "compact"):
            SETTING["compact"] = whitespace == "compact"
            for name, (request, schema) in SCHEMAS.items():
                constraint = Constraint("json_schema", json.dumps(schema))
                prompt = encode_prompt(target.tokenizer, request, "chat")
                plain = None
                for system, recipe, unguessed in SYSTEMS:
                    SETTING["unguessed"] = unguessed
                    params = SamplingParams(max_tokens=128, temperature=0.0, constraint=constraint)
                    target.truncate(0)
                    drafter = build_drafter(recipe, sources)
                    k = 0 if recipe == "none" else "auto"
                    out = Engine(target, drafter).generate(prompt, params, SpecConfig(k=k))
                    plain = out.token_ids if plain is None else plain
                    given = out.stats.by_drafter.get("grammar", {}).get("accepted", 0)
                    runs.setdefault((whitespace, name, system), []).append(
                        {
                            "tokens_per_second": out.stats.tokens_per_second,
                            "draft_seconds": out.stats.drafter_seconds,
                            "rounds": out.stats.rounds,
                            "tokens": len(out.token_ids),
                            "forced": given,
                            "identical": out.token_ids == plain,
                            "finish": out.finish_reason,
                        }
                    )
    print(f"CPU: {cpu_name()} ({cpu_kind()}); {args.passes} interleaved passes, medians\n")
    print(
        "| JSON | schema | system | tok/s | vs plain | rounds | draft s | forced / tokens "
        "| identical |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---|")
    for (whitespace, name, system), rows in runs.items():
        rate = statistics.median(r["tokens_per_second"] for r in rows)
        plain_rows = runs[(whitespace, name, "plain constrained")]
        plain_rate = statistics.median(r["tokens_per_second"] for r in plain_rows)
        rounds = statistics.median(r["rounds"] for r in rows)
        forced = statistics.median(r["forced"] for r in rows)
        same = all(r["identical"] for r in rows)
        draft = statistics.median(r["draft_seconds"] for r in rows)
        print(
            f"| {whitespace} | {name} | {system} | {rate:.1f} | {rate / plain_rate:.2f}x | "
            f"{rounds:g} | {draft:.2f} | {forced:g} / {rows[0]['tokens']} ({rows[0]['finish']}) "
            f"| {same} |"
        )


if __name__ == "__main__":
    main()
