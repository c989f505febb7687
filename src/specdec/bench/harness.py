"""Running a benchmark: workloads x systems x repeats, interleaved, with a warm-up.

Repeats are interleaved (system A, B, C on a prompt, then the next prompt; then the whole
pass again, with the system order rotated) so that a slow spell of a shared machine hits
every system alike. Each ratio is taken between runs of the same prompt in the same pass.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from importlib import resources

from specdec.bench import pairs
from specdec.bench.output import RunOutput
from specdec.config import SamplingParams
from specdec.metrics import SpecStats
from specdec.prompting import encode_prompt, read_prompt_file

WORKLOADS = ("code", "edit", "summary", "chat")


@dataclass(frozen=True)
class PromptItem:
    id: str
    workload: str
    template: str
    prompt: str


def load_workloads(names=WORKLOADS, per_workload: int | None = None) -> list[PromptItem]:
    items = []
    for name in names:
        if name not in WORKLOADS:
            raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
        text = resources.files("specdec.bench").joinpath(f"workloads/{name}.jsonl").read_text()
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        items += [
            PromptItem(r["id"], name, r["template"], r["prompt"]) for r in rows[:per_workload]
        ]
    return items


def load_workload_file(path: str, per_workload: int | None = None) -> list[PromptItem]:
    """The user's own prompts: JSON lines with ``prompt`` (required), ``template`` (raw or
    chat, default raw) and ``id`` (default: the line number). Bad lines are refused with
    their line number. The workload is named after the file."""
    from pathlib import Path

    lines = read_prompt_file(
        path, "--workload-file", "raw", templates=("raw", "chat"), json_lines_only=True
    )
    workload = Path(path).stem
    items = [
        PromptItem(line.id or str(line.number), workload, line.template, line.prompt)
        for line in lines
    ]
    return items[:per_workload]


@dataclass(frozen=True)
class Run:
    system: str
    workload: str
    prompt_id: str
    repeat: int
    prompt_tokens: int
    generated_tokens: int
    seconds: float
    tokens_per_second: float
    identical_to_reference: bool | None  # greedy: same tokens as the plain run it is judged by
    reference: str  # that plain system: the one on this system's target runtime, if any
    stats: dict | None
    token_ids: list[int]


def run_benchmark(
    systems: dict,
    items: list[PromptItem],
    tokenizer,
    params: SamplingParams,
    repeats: int,
    baseline: str = "plain",
    progress: Callable[[str], None] = lambda label: None,
    references: dict[str, str] | None = None,
    sampled_identity: bool = True,
) -> list[Run]:
    """All runs; ``systems`` maps a name to an object with ``run(prompt_ids, params)``.
    ``references`` names, per system, the run its tokens are compared with (default: the
    baseline). Sampled with a seed, every (prompt, pass) gets its own seed, ``params.seed``
    plus its index, the same for every system: runs are independent draws, and systems
    stay comparable run by run. ``sampled_identity``: whether seeded specdec runs must give
    the same text (coupled verification), else only greedy runs are compared by text."""
    assert baseline in systems, "the baseline system must be part of the run"
    references = {name: (references or {}).get(name, baseline) for name in systems}
    encoded = encode_items(tokenizer, items)
    _warm_up(systems, encoded[items[0].id], params)
    names = list(systems)
    runs: list[Run] = []
    for repeat in range(repeats):
        order = names[repeat % len(names) :] + names[: repeat % len(names)]
        for index, item in enumerate(items):
            seeded = params
            if params.seed is not None:
                seeded = replace(params, seed=params.seed + repeat * len(items) + index)
            outputs: dict[str, RunOutput] = {}
            for name in order:
                progress(f"pass {repeat + 1}/{repeats} {item.id} {name}")
                outputs[name] = systems[name].run(encoded[item.id], seeded)
            for name in names:
                out, reference = outputs[name], references[name]
                runs.append(
                    Run(
                        name,
                        item.workload,
                        item.id,
                        repeat,
                        len(encoded[item.id]),
                        len(out.token_ids),
                        out.seconds,
                        len(out.token_ids) / out.seconds if out.seconds else 0.0,
                        (out.token_ids == outputs[reference].token_ids)
                        if _comparable(out, outputs[reference], params, sampled_identity)
                        else None,
                        reference,
                        out.stats,
                        out.token_ids,
                    )
                )
    return runs


def encode_items(tokenizer, items: list[PromptItem]) -> dict[str, list[int]]:
    """Each prompt's token ids, by prompt id (chat prompts through the chat template)."""
    chat_ok = bool(getattr(tokenizer, "chat_template", None))  # tiny test tokenizers have none
    return {
        item.id: encode_prompt(tokenizer, item.prompt, item.template if chat_ok else "raw")
        for item in items
    }


def _comparable(
    out: RunOutput, reference: RunOutput, params: SamplingParams, sampled_identity: bool
) -> bool:
    """Whether two outputs must be the same text: greedy decoding, or two specdec runs
    sampled with a seed and coupled verification (the text is plain decoding's by design).
    A peer's sampler draws differently, and so does rejection sampling: there only the
    distribution is the target's (``bench/distribution.py``)."""
    if params.greedy:
        return True
    both_specdec = not (out.peer or reference.peer) and None not in (out.stats, reference.stats)
    return sampled_identity and params.seed is not None and both_specdec


def _warm_up(systems: dict, prompt_ids: list[int], params: SamplingParams) -> None:
    """One short run per system: first-call costs (allocations, lazy init) stay out."""
    short = SamplingParams(
        max_tokens=min(4, params.max_tokens),
        temperature=params.temperature,
        top_k=params.top_k,
        top_p=params.top_p,
        seed=params.seed,
    )
    for system in systems.values():
        system.run(prompt_ids, short)


# ---- summaries ------------------------------------------------------------------------


POSITIONS_SHOWN = 3  # per-position acceptance in the summary: drafts 1..3


def summarize(runs: list[Run], baseline: str = "plain") -> list[dict]:
    """One row per (workload, system): medians and ranges over prompts x repeats.

    ``speedup`` is the median, over (prompt, pass), of this system's tokens/s divided by the
    baseline's on the same prompt in the same pass.
    """
    base = {(r.prompt_id, r.repeat): r.tokens_per_second for r in runs if r.system == baseline}
    rows = []
    keys = sorted(
        {(r.workload, r.system) for r in runs},
        key=lambda k: (
            WORKLOADS.index(k[0]) if k[0] in WORKLOADS else 99,
            _system_order(runs).index(k[1]),
        ),
    )
    for workload, system in keys:
        mine = [r for r in runs if r.workload == workload and r.system == system]
        tps = [r.tokens_per_second for r in mine]
        rates = {(r.prompt_id, r.repeat): r.tokens_per_second for r in mine}
        ratios = pairs.paired_ratios(rates, base)
        total = SpecStats.merged([SpecStats.from_dict(r.stats) for r in mine if r.stats])
        drafted = total.drafted_tokens  # a system that never drafted shows no rates
        identical = [r.identical_to_reference for r in mine if r.identical_to_reference is not None]
        ms_per_token = [1000 * r.seconds / r.generated_tokens for r in mine if r.generated_tokens]
        rows.append(
            {
                "workload": workload,
                "system": system,
                "runs": len(mine),
                "reference": mine[0].reference,
                "tokens_per_second": statistics.median(tps),
                "tokens_per_second_min": min(tps),
                "tokens_per_second_max": max(tps),
                "ms_per_token": statistics.median(ms_per_token) if ms_per_token else None,
                "speedup": statistics.median(ratios) if ratios else None,
                "speedup_min": min(ratios) if ratios else None,
                "speedup_max": max(ratios) if ratios else None,
                "acceptance_rate": total.acceptance_rate if drafted else None,
                "mean_accepted_length": total.mean_accepted_length if drafted else None,
                # P(draft i accepted | drafts before it accepted), for the first positions
                "acceptance_by_position": (
                    total.per_position_acceptance[:POSITIONS_SHOWN] if drafted else None
                ),
                "draft_ms_per_token": 1000 * total.drafter_seconds / drafted if drafted else None,
                "identical": sum(identical) / len(identical) if identical else None,
            }
        )
    return rows


def _system_order(runs: list[Run]) -> list[str]:
    seen: list[str] = []
    for run in runs:
        if run.system not in seen:
            seen.append(run.system)
    return seen


def runs_to_json(runs: list[Run]) -> list[dict]:
    return [asdict(run) for run in runs]
