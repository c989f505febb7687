"""In one process, interleaved: a round of the grammar's forced tokens alone (the drafter
sitting it out, as before) against the drafter drafting on after them in the same round,
on the three JSON schemas of ``bench/structured.py``, default pair on int4, greedy, 128
tokens; JSON as llguidance compiles it by default (whitespace where JSON allows it) and
compact (no free whitespace, ", " and ": " between items: every key a forced run).
``run`` (``compare``, then ``table``) is shared with ``guesses_ab.py``.

    python forced_ab.py --passes 3 > ab.txt
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from llguidance import LLMatcher

import specdec.engine as engine
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

# compact: the JSON layout; old: the system runs the way before the change (each script
# patches in what that means)
SETTING = {"compact": False, "old": False}
_grammar_text = grammar._grammar_text
_draft_k = engine.Run._draft_k


def grammar_text(constraint: Constraint) -> str:
    if constraint.kind == "json_schema" and SETTING["compact"]:
        compact = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
        return LLMatcher.grammar_from_json_schema(constraint.source, defaults=compact)
    return _grammar_text(constraint)


def draft_k(self, max_k, given=()):
    """As before this change: a round with forced tokens holds them alone."""
    return 0 if given and SETTING["old"] else _draft_k(self, max_k, given)


SYSTEMS = (  # name, drafter recipe, run the old way (forced tokens alone in their round)
    ("plain constrained", "none", False),
    ("model, forced alone", "model", True),
    ("model, drafts after forced", "model", False),
    ("lookup+model, forced alone", "lookup+model", True),
    ("lookup+model, drafts after forced", "lookup+model", False),
)


def compare(systems, passes: int) -> dict[tuple[str, str, str], list[dict]]:
    """Every (layout, schema, system), ``passes`` times interleaved."""
    grammar._grammar_text = grammar_text
    target = load_backend(DEFAULT_TARGET, "int4")
    draft, _ = load_draft(DEFAULT_DRAFT, "int4", target_runtime="int4")
    sources = DraftSources(draft_model=lambda: draft, heads={})
    runs: dict[tuple[str, str, str], list[dict]] = {}
    for _ in range(passes):
        for whitespace in ("default", "compact"):
            SETTING["compact"] = whitespace == "compact"
            for name, (request, schema) in SCHEMAS.items():
                constraint = Constraint("json_schema", json.dumps(schema))
                prompt = encode_prompt(target.tokenizer, request, "chat")
                plain = None
                for system, recipe, old in systems:
                    SETTING["old"] = old
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
    return runs


def table(runs: dict[tuple[str, str, str], list[dict]], passes: int, draft: bool) -> None:
    """Medians per (layout, schema, system); ``draft``: with the draft's seconds."""
    print(f"CPU: {cpu_name()} ({cpu_kind()}); {passes} interleaved passes, medians\n")
    extra = (" draft s |", "---:|") if draft else ("", "")
    head = "| JSON | schema | system | tok/s | vs plain | rounds |"
    print(f"{head}{extra[0]} forced / tokens | identical |")
    print(f"|---|---|---|---:|---:|---:|{extra[1]}---:|---|")
    for (whitespace, name, system), rows in runs.items():
        rate = statistics.median(r["tokens_per_second"] for r in rows)
        plain_rows = runs[(whitespace, name, "plain constrained")]
        plain_rate = statistics.median(r["tokens_per_second"] for r in plain_rows)
        rounds = statistics.median(r["rounds"] for r in rows)
        forced = statistics.median(r["forced"] for r in rows)
        same = all(r["identical"] for r in rows)
        seconds = f" {statistics.median(r['draft_seconds'] for r in rows):.2f} |" if draft else ""
        print(
            f"| {whitespace} | {name} | {system} | {rate:.1f} | {rate / plain_rate:.2f}x | "
            f"{rounds:g} |{seconds} {forced:g} / {rows[0]['tokens']} ({rows[0]['finish']}) "
            f"| {same} |"
        )


def run(systems, draft: bool) -> None:
    """``compare`` the ``systems`` ``--passes`` times and print their ``table``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()
    table(compare(systems, args.passes), args.passes, draft)


def main() -> None:
    engine.Run._draft_k = draft_k
    run(SYSTEMS, draft=False)


if __name__ == "__main__":
    main()
