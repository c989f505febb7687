"""Structured output on the default pair: plain constrained decoding against speculative
constrained decoding, without and with the grammar's forced tokens as drafts, k = 4 and k auto
(issue 50). The draft is loaded as generate loads it (``runtime.load_draft``: on int8 and int4
it scores the shipped vocabulary) and the drafters are built as ``--drafter`` builds them
(``drafters.recipe``: the draft model with its lookup guide; ``lookup+model``, what
``--drafter auto`` gives where no heads were made). ``--heads`` adds the EAGLE heads made
for the target (``specdec heads make``; ``--cache-dir`` where they are), alone and with
prompt lookup in front.

    python bench/structured.py [--runtime int4] [--max-tokens 128] [--passes 2] [--out DIR]
                               [--heads] [--cache-dir DIR]

Three JSON schemas of different shapes, asked for through the chat template, greedy. Per
schema and system: tokens/s (medians over interleaved passes), the share of tokens the
grammar forced, mean accepted length; every output is checked against plain constrained
decoding (identical tokens) and parsed as JSON with the schema's required keys. The grammar's
own cost: ms per token to compute a mask, replaying the plain output through a fresh grammar.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from specdec import Engine, SamplingParams, SpecConfig
from specdec.bench.report import write_table
from specdec.config import Constraint
from specdec.drafters.recipe import DraftSources, build_drafter
from specdec.grammar import Grammar
from specdec.heads.load import load_heads
from specdec.loading import load_backend
from specdec.machine import cpu_kind, cpu_name
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.prompting import encode_prompt
from specdec.runtime import load_draft

SCHEMAS = {
    "person": (
        "Describe Ada Lovelace as JSON: her name, birth year, languages she knew and fields.",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "birth_year": {"type": "integer"},
                "languages": {"type": "array", "items": {"type": "string"}},
                "fields": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["name", "birth_year", "languages", "fields"],
            "additionalProperties": False,
        },
    ),
    "config": (
        "Write the JSON configuration of a web server: host, port, TLS on or off, log level "
        "and worker count.",
        {
            "type": "object",
            "properties": {
                "host": {"type": "string"},
                "port": {"type": "integer"},
                "tls": {"type": "boolean"},
                "log_level": {"enum": ["debug", "info", "warning", "error"]},
                "workers": {"type": "integer"},
            },
            "required": ["host", "port", "tls", "log_level", "workers"],
            "additionalProperties": False,
        },
    ),
    "functions": (
        "List three Python functions of a small text-processing module as JSON, each with "
        "its name, arguments and return type.",
        {
            "type": "object",
            "properties": {
                "functions": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string"},
                            "arguments": {"type": "array", "items": {"type": "string"}},
                            "returns": {"type": "string"},
                        },
                        "required": ["name", "arguments", "returns"],
                        "additionalProperties": False,
                    },
                }
            },
            "required": ["functions"],
            "additionalProperties": False,
        },
    ),
}
SYSTEMS = {  # name: the drafter recipe (as --drafter), how it speculates, whether constrained
    "plain, no grammar": ("none", SpecConfig(k=0), False),
    "plain constrained": ("none", SpecConfig(k=0), True),
    "speculative (model k=4)": ("model", SpecConfig(k=4, forced_drafts=False), True),
    "speculative + forced (model k=4)": ("model", SpecConfig(k=4), True),
    "speculative + forced (model k auto)": ("model", SpecConfig(k="auto"), True),
    # what --drafter auto gives where no heads were made
    "speculative + forced (lookup+model k auto)": ("lookup+model", SpecConfig(k="auto"), True),
}
# with --heads: the trained EAGLE heads, alone and as --drafter auto puts them for a prompt
# of 64+ tokens (heads.load.auto_recipe)
HEADS_SYSTEMS = {
    "speculative + forced (eagle k auto)": ("eagle", SpecConfig(k="auto"), True),
    "speculative + forced (lookup+eagle k auto)": ("lookup+eagle", SpecConfig(k="auto"), True),
}


def _valid(text: str, schema: dict) -> bool:
    """Parses as JSON and has the schema's required keys (a check, not a schema validator)."""
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        return False
    return isinstance(parsed, dict) and set(schema["required"]) <= set(parsed)


def mask_ms(target, constraint: Constraint, token_ids: list[int]) -> float:
    """Median ms to compute the grammar's mask of one row, along ``token_ids``."""
    grammar = Grammar(constraint, target.tokenizer, target.vocab_size, target.eos_token_ids)
    times = []
    for token_id in token_ids:
        started = time.perf_counter()
        grammar._allowed()
        times.append(time.perf_counter() - started)
        if grammar.advance([token_id]) == 0:
            break
    return statistics.median(times) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtime", default="int4", choices=["int8", "int4"])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--heads",
        action="store_true",
        help="also draft with the EAGLE heads trained for the target ('specdec heads make')",
    )
    parser.add_argument("--cache-dir", default=None, help="model and heads cache (--heads)")
    args = parser.parse_args()
    target = load_backend(DEFAULT_TARGET, args.runtime, cache_dir=args.cache_dir)
    draft, _ = load_draft(
        DEFAULT_DRAFT, args.runtime, target_runtime=args.runtime, cache_dir=args.cache_dir
    )  # as generate
    systems = SYSTEMS | (HEADS_SYSTEMS if args.heads else {})
    heads = load_heads("eagle", target, args.cache_dir, DEFAULT_TARGET) if args.heads else None
    sources = DraftSources(
        draft_model=lambda: draft,
        heads={"eagle": lambda: heads.drafter(target)} if heads is not None else {},
    )
    rows: dict[tuple[str, str], list] = {}
    plain_tokens: dict[str, list[int]] = {}
    for _ in range(args.passes):
        for schema_name, (request, schema) in SCHEMAS.items():
            constraint = Constraint("json_schema", json.dumps(schema))
            prompt_ids = encode_prompt(target.tokenizer, request, "chat")
            for system, (recipe, spec, constrained) in systems.items():
                params = SamplingParams(
                    max_tokens=args.max_tokens,
                    temperature=0.0,
                    constraint=constraint if constrained else None,
                )
                target.truncate(0)
                drafter = build_drafter(recipe, sources)
                out = Engine(target, drafter).generate(prompt_ids, params, spec)
                if system == "plain constrained":
                    plain_tokens[schema_name] = out.token_ids
                valid = _valid(out.text, schema) if out.finish_reason == "stop" else False
                forced = out.stats.by_drafter.get("grammar", {}).get("accepted", 0)
                rows.setdefault((schema_name, system), []).append(
                    {
                        "tokens_per_second": out.stats.tokens_per_second,
                        "tokens": len(out.token_ids),
                        "forced_share": forced / max(len(out.token_ids), 1),
                        "mean_accepted_length": out.stats.mean_accepted_length,
                        "identical_to_plain": out.token_ids == plain_tokens[schema_name]
                        if constrained
                        else None,
                        "valid": valid,
                        "text": out.text,
                    }
                )
    masks = {
        name: mask_ms(target, Constraint("json_schema", json.dumps(schema)), plain_tokens[name])
        for name, (_, schema) in SCHEMAS.items()
    }
    lines = [
        f"# Structured output, default pair on {args.runtime}, {args.max_tokens} tokens, greedy",
        "",
        f"CPU: {cpu_name()} ({cpu_kind()}); {args.passes} interleaved passes, medians.",
        "",
        "| schema | system | tok/s | vs plain constrained | forced share | mean accepted "
        "length | identical | valid JSON |",
        "|---|---|---:|---:|---:|---:|---|---|",
    ]
    summary = {}
    for schema_name in SCHEMAS:
        base = statistics.median(
            r["tokens_per_second"] for r in rows[(schema_name, "plain constrained")]
        )
        for system in systems:
            runs = rows[(schema_name, system)]
            tps = statistics.median(r["tokens_per_second"] for r in runs)
            summary[f"{schema_name} / {system}"] = {
                "tokens_per_second": tps,
                "speedup": tps / base,
                "forced_share": runs[-1]["forced_share"],
                "mean_accepted_length": runs[-1]["mean_accepted_length"],
                "identical_to_plain": None
                if runs[0]["identical_to_plain"] is None
                else all(r["identical_to_plain"] for r in runs),
                "valid": all(r["valid"] for r in runs),
                "tokens": runs[-1]["tokens"],
                "text": runs[-1]["text"],
            }
            s = summary[f"{schema_name} / {system}"]
            lines.append(
                f"| {schema_name} | {system} | {tps:.1f} | {tps / base:.2f}x | "
                f"{s['forced_share']:.2f} | {s['mean_accepted_length']:.2f} | "
                f"{s['identical_to_plain']} | {s['valid']} |"
            )
    lines += ["", "Grammar mask, median ms per token (llguidance, replaying plain output):", ""]
    lines += [f"- {name}: {ms:.3f} ms" for name, ms in masks.items()]
    data = {"systems": summary, "mask_ms": masks}
    return write_table(lines, data, args.out, "results.md", "structured.json")


if __name__ == "__main__":
    raise SystemExit(main())
