"""A long prompt joining requests that are streaming: how long they stall, by the server's
--prefill-rows (the prompt tokens a step prefills), on the real default pair.

python bench/long_join.py [--rows 0,64,128,256] [--running 1,4] [--repeats 2]
                          [--runtime int4] [--max-tokens 96] [--long-file FILE] [--out DIR]

The scheduler `specdec serve` runs (``server.setup.load_scheduler``, the default pair and
drafter, k auto, greedy), without HTTP: its worker thread decodes and each request's chunks
are stamped as the worker hands them over. For each number of running requests (--running,
chat prompts of the shipped workload, --max-tokens each) and each --rows setting (0: every
joining prompt whole, as before), interleaved --repeats times: the running requests start,
and once each has streamed for a second a long chat prompt (--long-file; by default the
1,412-token one of bench/results/2026-12-05-prefill-passes-xeon-amx) joins, asking for 16
tokens (its first line numbers the trial, so that no earlier request's cache holds the
prompt: it is computed in full every time). Reported per setting (medians over repeats): the
longest gap between two chunks of a running request while the long one was prefilled (its
stall), the tokens the running requests got in that time, the long request's time to first
token, and the whole burst's seconds; every output is checked equal to its prompt's output
alone (greedy).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

from specdec.bench.harness import load_workloads
from specdec.config import SamplingParams, SpecConfig
from specdec.machine import cpu_name
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.prompting import encode_prompt
from specdec.server.scheduler import Job
from specdec.server.setup import ServerConfig, load_scheduler

HERE = Path(__file__).resolve().parent
LONG = HERE / "results/2026-12-05-prefill-passes-xeon-amx/long_prompt.txt"


class Stamped(Job):
    """A job whose chunks are kept with the time the worker handed each over."""

    def put(self, item):
        self.stamps.append((time.perf_counter(), item))
        if item is None or isinstance(item, Exception):
            self.done.set()


def job(prompt_ids: list[int], max_tokens: int) -> Stamped:
    made = Stamped(
        prompt_ids=prompt_ids,
        params=SamplingParams(max_tokens=max_tokens, temperature=0.0),
        spec=SpecConfig(k="auto"),
        drafter="model",
        loop=None,
    )
    made.stamps, made.done = [], threading.Event()
    return made


def tokens(made: Stamped) -> list[int]:
    for _, item in made.stamps:
        if isinstance(item, Exception):
            raise item
    return [t for _, item in made.stamps if item is not None for t in item.token_ids]


def chunk_times(made: Stamped) -> list[float]:
    return [at for at, item in made.stamps if item is not None]


def trial(scheduler, running_prompts, long_prompt, max_tokens) -> dict:
    """One burst: the running requests, then the long one joining; ``long_prompt`` is
    computed in full (a fresh first line each trial: no earlier request's cache holds it)."""
    began = time.perf_counter()
    running = [job(p, max_tokens) for p in running_prompts]
    for made in running:
        scheduler.submit(made)
    while not all(chunk_times(made) for made in running):
        time.sleep(0.01)
    time.sleep(1.0)
    long = job(long_prompt, 16)
    joined = time.perf_counter()
    scheduler.submit(long)
    for made in [*running, long]:
        made.done.wait()
    first = chunk_times(long)[0]
    gaps, during = [], 0
    for made in running:
        times = chunk_times(made)
        for a, b in zip(times, times[1:], strict=False):
            if b > joined and a < first:  # a gap that overlaps the long prompt's prefill
                gaps.append(b - max(a, joined))
        during += sum(
            len(item.token_ids)
            for at, item in made.stamps
            if item is not None and joined < at <= first
        )
    return {
        "long_prompt": long_prompt,
        "stall_s": max(gaps, default=0.0),
        "running_tokens_during": during,
        "long_ttft_s": first - joined,
        "burst_s": time.perf_counter() - began,
        "outputs": [tokens(made) for made in [*running, long]],
    }


def solo(scheduler, prompt: list[int], max_tokens: int) -> list[int]:
    """The request's output alone (its prompt whole: ``prefill_rows`` None)."""
    scheduler.prefill_rows = None
    made = job(prompt, max_tokens)
    scheduler.submit(made)
    made.done.wait()
    return tokens(made)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="0,64,128,256")
    parser.add_argument("--running", default="1,4")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--runtime", default="int4")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--long-file", type=Path, default=LONG)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    settings = [int(r) for r in args.rows.split(",")]
    counts = [int(n) for n in args.running.split(",")]
    config = ServerConfig(
        target=DEFAULT_TARGET,
        draft=DEFAULT_DRAFT,
        target_runtime=args.runtime,
        draft_runtime=args.runtime,
        drafter="model",
        max_active=max(counts) + 1,
    )
    scheduler = load_scheduler(config)
    scheduler.start()
    tokenizer = scheduler.tokenizer
    chat = [item for item in load_workloads(["chat"]) if item.template == "chat"]
    long_text = args.long_file.read_text()
    trials = iter(range(10**6))

    def long_prompt() -> list[int]:
        return encode_prompt(tokenizer, f"Request {next(trials)}.\n{long_text}", "chat")

    print(f"{cpu_name()}; long prompt {len(long_prompt())} tokens", flush=True)
    rows_out = []
    results: dict = {}
    for n in counts:
        prompts = [encode_prompt(tokenizer, item.prompt, "chat") for item in chat[:n]]
        trial(scheduler, prompts, long_prompt(), 8)  # warm-up: kernels, the k controller
        for rep in range(args.repeats):
            for rows in settings:
                scheduler.prefill_rows = rows or None
                result = trial(scheduler, prompts, long_prompt(), args.max_tokens)
                results.setdefault((n, rows), []).append(result)
                print(
                    f"running {n}, rows {rows or 'whole'}, pass {rep + 1}: stall "
                    f"{result['stall_s']:.2f} s, running tokens during "
                    f"{result['running_tokens_during']}, long TTFT {result['long_ttft_s']:.2f} s, "
                    f"burst {result['burst_s']:.2f} s",
                    flush=True,
                )
        # every output against the same prompt's alone (the long prompt differs by trial)
        alone = [solo(scheduler, p, args.max_tokens) for p in prompts]
        for rows in settings:
            runs = results[(n, rows)]
            same = all(
                r["outputs"] == [*alone, solo(scheduler, r["long_prompt"], 16)] for r in runs
            )
            rows_out.append(
                {
                    "running": n,
                    "prefill_rows": rows or "whole",
                    **{
                        key: statistics.median(r[key] for r in runs)
                        for key in ("stall_s", "running_tokens_during", "long_ttft_s", "burst_s")
                    },
                    "identical": same,
                }
            )
    scheduler.stop()
    lines = [
        "| running | --prefill-rows | stall of a running stream (s) | their tokens meanwhile "
        "| long prompt's first token (s) | burst (s) | outputs equal |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows_out:
        lines.append(
            f"| {row['running']} | {row['prefill_rows']} | {row['stall_s']:.2f} "
            f"| {row['running_tokens_during']:.0f} | {row['long_ttft_s']:.2f} "
            f"| {row['burst_s']:.2f} | {'yes' if row['identical'] else 'NO'} |"
        )
    table = "\n".join(lines)
    print(table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        command = "python bench/long_join.py " + " ".join(sys.argv[1:])
        (args.out / "results.md").write_text(f"{cpu_name()}\n\n    {command}\n\n{table}\n")
        (args.out / "results.json").write_text(json.dumps(rows_out, indent=1))
    return 0 if all(row["identical"] for row in rows_out) else 1


if __name__ == "__main__":
    sys.exit(main())
