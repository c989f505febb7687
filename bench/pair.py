"""What the in-process decoding benchmarks under bench/ share: the default int4 pair, its
draft model as the drafter recipes build it, a workload's prompts encoded."""

from __future__ import annotations

from typing import Any

from specdec.bench.harness import load_workloads
from specdec.drafters.recipe import DraftSources
from specdec.loading import load_backend
from specdec.prompting import encode_prompt
from specdec.runtime import load_draft


def load_int4_pair() -> tuple[Any, DraftSources]:
    """The default target on int4 and ``DraftSources`` over the default draft on int4."""
    target = load_backend("qwen2.5-coder-1.5b-instruct", "int4")
    draft, _ = load_draft("qwen2.5-coder-0.5b-instruct", "int4")
    return target, DraftSources(draft_model=lambda: draft)


def encoded_prompts(target: Any, workload: str, per_workload: int) -> list[list[int]]:
    """The workload's first ``per_workload`` prompts, through their templates."""
    prompts = load_workloads([workload], per_workload)
    return [encode_prompt(target.tokenizer, p.prompt, p.template) for p in prompts]
