"""How the CLI shows results: streamed text, coloured drafts, JSON, the summary line."""

from __future__ import annotations

import json
import sys

from rich.console import Console
from rich.text import Text

from specdec.engine import Chunk, Engine, Output
from specdec.metrics import SpecStats

# The seed article's figure: accepted drafts green, rejected red, target-sampled blue.
ACCEPTED, REJECTED, FROM_TARGET = "green", "red strike", "bold blue"


def output_dict(out: Output) -> dict:
    return {
        "text": out.text,
        "token_ids": out.token_ids,
        "finish_reason": out.finish_reason,
        "stats": out.stats.to_dict(),
    }


def print_json(out: Output, **extra: object) -> None:
    sys.stdout.write(json.dumps({**output_dict(out), **extra}) + "\n")


def stream_to_terminal(engine: Engine, prompt_ids, params, spec, show_drafts: bool) -> Output:
    console = Console(highlight=False, soft_wrap=True)
    tokenizer = engine.target.tokenizer
    chunks: list[Chunk] = []
    for chunk in engine.stream(prompt_ids, params, spec):
        chunks.append(chunk)
        if show_drafts:
            console.print(_coloured(chunk, tokenizer), end="")
        else:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
    sys.stdout.write("\n")
    last = chunks[-1]
    Console(stderr=True, highlight=False).print(summary_line(last.stats, last.finish_reason))
    return Output([t for c in chunks for t in c.token_ids], "".join(c.text for c in chunks),
                  last.finish_reason or "length", last.stats, chunks)


def _coloured(chunk: Chunk, tokenizer) -> Text:
    text = Text()
    accepted = chunk.token_ids[: chunk.num_from_draft]
    from_target = chunk.token_ids[chunk.num_from_draft :]
    for token_id in accepted:
        text.append(tokenizer.decode([token_id]), style=ACCEPTED)
    if from_target and chunk.rejected_ids:
        text.append(tokenizer.decode(chunk.rejected_ids), style=REJECTED)
    for token_id in from_target:
        text.append(tokenizer.decode([token_id]), style=FROM_TARGET)
    return text


def summary_line(stats: SpecStats, finish_reason: str | None) -> str:
    line = (
        f"{stats.generated_tokens} tokens in {stats.total_seconds:.2f} s "
        f"({stats.tokens_per_second:.1f} tok/s)"
    )
    if stats.drafted_tokens:
        line += (
            f" | acceptance {stats.acceptance_rate:.2f}"
            f" | mean accepted length {stats.mean_accepted_length:.2f}"
        )
    return line + f" | finish: {finish_reason}"
