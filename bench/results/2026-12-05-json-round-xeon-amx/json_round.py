"""Where a round of constrained speculative decoding goes (issue 50): the person and config
schemas of bench/structured.py, greedy, int4 pair, k = 4 (model drafter, no forced drafts),
with the grammar and without it, three times each, from the engine's own clocks (SpecStats):
the prefill, the drafter's seconds per drafted token, the target's seconds per round; and
plain constrained decoding's seconds per step.

cd bench && python results/2026-12-05-json-round-xeon-amx/json_round.py
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/, for structured.py
from structured import SCHEMAS  # noqa: E402

from specdec import Engine, SamplingParams, SpecConfig  # noqa: E402
from specdec.config import Constraint  # noqa: E402
from specdec.drafters import ModelDrafter  # noqa: E402
from specdec.loading import load_backend  # noqa: E402
from specdec.machine import cpu_name  # noqa: E402
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET  # noqa: E402
from specdec.prompting import encode_prompt  # noqa: E402
from specdec.runtime import load_draft  # noqa: E402

target = load_backend(DEFAULT_TARGET, "int4")
draft, _ = load_draft(DEFAULT_DRAFT, "int4", target_runtime="int4")
print(f"CPU: {cpu_name()}")
for repeat in range(3):
    for name in ("person", "config"):
        request, schema = SCHEMAS[name]
        constraint = Constraint("json_schema", json.dumps(schema))
        prompt = encode_prompt(target.tokenizer, request, "chat")
        for label, spec, grammar in (
            ("plain constrained", SpecConfig(k=0), constraint),
            ("k=4, grammar", SpecConfig(k=4, forced_drafts=False), constraint),
            ("k=4, no grammar", SpecConfig(k=4, forced_drafts=False), None),
        ):
            target.truncate(0)
            drafter = None if spec.k == 0 else ModelDrafter(draft)
            params = SamplingParams(max_tokens=128, temperature=0.0, constraint=grammar)
            s = Engine(target, drafter).generate(prompt, params, spec).stats
            per_draft = 1e3 * s.drafter_seconds / max(s.drafted_tokens, 1)
            print(
                f"{repeat} {name} {label}: {s.generated_tokens} tokens, {s.tokens_per_second:.1f}"
                f" tok/s; prefill {s.prefill_seconds:.2f} s, drafter {s.drafter_seconds:.2f} s"
                f" ({s.drafted_tokens} drafted, {per_draft:.2f} ms each), target"
                f" {s.target_seconds:.2f} s ({s.rounds} rounds, "
                f"{1e3 * s.target_seconds / max(s.rounds, 1):.1f} ms each), mean accepted"
                f" length {s.mean_accepted_length:.2f}",
                flush=True,
            )
