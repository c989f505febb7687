"""How often the draft's first token is accepted in rounds that begin with forced tokens
against rounds that do not (the draft model, k auto as shipped, greedy, the int4 pair; the
three JSON schemas of ``bench/structured.py``, compact and default layouts; one pass).

    python after_forced.py > after-forced.txt
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import specdec.grammar as grammar
from specdec import Engine, SamplingParams, SpecConfig
from specdec.config import Constraint
from specdec.drafters.recipe import DraftSources, build_drafter
from specdec.loading import load_backend
from specdec.machine import cpu_kind, cpu_name
from specdec.metrics import SpecStats
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.prompting import encode_prompt
from specdec.runtime import load_draft

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "2026-12-07-forced-then-drafts-zen4-epyc-avx512"))
sys.path.insert(0, str(HERE.parents[1]))  # bench/
import forced_ab  # noqa: E402
from structured import SCHEMAS  # noqa: E402

ROUNDS: list[tuple[int, int, int]] = []  # (forced, drafted, accepted) per round
_record = SpecStats.record_round


def record_round(self, k, num_accepted, *args, given=0, **kwargs):
    ROUNDS.append((given, k, num_accepted))
    return _record(self, k, num_accepted, *args, given=given, **kwargs)


def main() -> None:
    SpecStats.record_round = record_round
    grammar._grammar_text = forced_ab.grammar_text
    target = load_backend(DEFAULT_TARGET, "int4")
    draft, _ = load_draft(DEFAULT_DRAFT, "int4", target_runtime="int4")
    sources = DraftSources(draft_model=lambda: draft, heads={})
    print(f"CPU: {cpu_name()} ({cpu_kind()}); the draft model, k auto\n")
    print("| JSON | schema | rounds after forced: first draft accepted | other rounds |")
    print("|---|---|---|---|")
    for whitespace in ("default", "compact"):
        forced_ab.SETTING["compact"] = whitespace == "compact"
        for name, (request, schema) in SCHEMAS.items():
            ROUNDS.clear()
            constraint = Constraint("json_schema", json.dumps(schema))
            params = SamplingParams(max_tokens=128, temperature=0.0, constraint=constraint)
            target.truncate(0)
            engine = Engine(target, build_drafter("model", sources))
            engine.generate(encode_prompt(target.tokenizer, request, "chat"), params,
                            SpecConfig(k="auto"))  # fmt: skip
            cells = []
            for after in (True, False):
                rows = [(k, a) for g, k, a in ROUNDS if (g > 0) == after and k > 0]
                taken = sum(a > 0 for _, a in rows)
                cells.append(f"{taken}/{len(rows)} ({taken / max(len(rows), 1):.2f})")
            print(f"| {whitespace} | {name} | {cells[0]} | {cells[1]} |", flush=True)


if __name__ == "__main__":
    main()
