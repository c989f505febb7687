"""The int4 runtime's layers in one kernel call (``backends/layer_stack.py``) against the Python
layer loop, side by side in one process.

python bench/layer_stack.py [--repeats 10] [--workloads code,chat] [--prompts-per-workload 2]
    [--max-tokens 64] [--skip-decodes]

1. Passes: the default target and draft on int4, a pass of 1, 3, 5 and 9 new tokens after
   128 cached ones, the stack and the loop alternating over ``--repeats`` rounds; medians.
2. Decodes: the shipped prompts of ``--workloads``, greedy, on the int4 target: plain, with
   the int4 0.5B draft (k auto) and with the EAGLE head (k auto, where heads are trained for
   the default target), each with the stack (EAGLE's layer too) and with the loop (EAGLE's
   layer through transformers' forward) in turn; tokens/s (prefill included) and whether
   every output equals plain decoding with the loop.

With ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
FBGEMM_ENABLE_INSTRUCTIONS=AVX2 SPECDEC_INT4_PATH=avx2`` before it, an AVX-512 CPU runs the
AVX2 code (README, "Benchmarks").
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from importlib import resources
from typing import Any

from specdec import Engine, SamplingParams, SpecConfig
from specdec.drafters import ModelDrafter
from specdec.heads import load as heads_load
from specdec.loading import load_backend
from specdec.machine import cpu_name
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET, ModelError
from specdec.prompting import encode_prompt

PASS_ROWS = (1, 3, 5, 9)
FORMS = ("stack", "loop")


class Toggle:
    """Switches a loaded int4 backend between its layer stack and the Python loop."""

    def __init__(self, backend: Any):
        lean = getattr(backend, "_lean", None)
        self.batched = None if lean is None else lean.batched
        if self.batched is None or self.batched.stack is None:
            raise SystemExit(f"{backend!r}: no layer stack (int4 kernel not built here?)")
        self.stack = self.batched.stack

    def use(self, form: str) -> None:
        self.batched.stack = self.stack if form == "stack" else None


def passes(name: str, backend: Any, toggle: Toggle, repeats: int) -> None:
    context = list(range(1000, 1128))
    backend.truncate(0)
    backend.forward(context, last_only=True)
    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(repeats):
        for form in FORMS:
            toggle.use(form)
            for rows in PASS_ROWS:
                started = time.perf_counter()
                backend.forward(list(range(2000, 2000 + rows)), last_only=False)
                times.setdefault((form, rows), []).append(1e3 * (time.perf_counter() - started))
                backend.truncate(len(context))
    toggle.use("stack")
    for rows in PASS_ROWS:
        stack, loop = (statistics.median(times[(form, rows)]) for form in FORMS)
        print(
            f"| {name} | {rows} | {loop:.1f} | {stack:.1f} | {stack / loop:.3f} |",
            flush=True,
        )


def decodes(target: Any, toggles: list[Toggle], drafters: dict[str, Any], args) -> None:
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    print("\n| workload | prompt | system | form | tok/s | ms a draft | same as plain (loop) |")
    print("|---|---|---|---|---|---|---|")
    for workload in args.workloads.split(","):
        text = resources.files("specdec.bench").joinpath(f"workloads/{workload}.jsonl")
        items = [json.loads(line) for line in text.read_text().splitlines() if line.strip()]
        for index, item in enumerate(items[: args.prompts_per_workload]):
            prompt = encode_prompt(target.tokenizer, item["prompt"], item["template"])
            runs = {}
            for system, drafter in drafters.items():
                for form in FORMS if index % 2 == 0 else reversed(FORMS):
                    for toggle in toggles:
                        toggle.use(form)
                    made = drafter(form)
                    engine = Engine(target, made) if made is not None else Engine(target)
                    config = SpecConfig(k="auto") if made is not None else None
                    runs[(system, form)] = engine.generate(prompt, params, config)
            reference = runs[("plain", "loop")].token_ids
            for (system, form), out in runs.items():
                rate = out.stats.generated_tokens / out.stats.total_seconds
                same = (
                    "reference"
                    if (system, form) == ("plain", "loop")
                    else (out.token_ids == reference)
                )
                drafted = out.stats.drafted_tokens
                draft_ms = f"{1e3 * out.stats.drafter_seconds / drafted:.2f}" if drafted else "-"
                print(
                    f"| {workload} | {index} | {system} | {form} | {rate:.2f} | {draft_ms} "
                    f"| {same} |"
                )
    for toggle in toggles:
        toggle.use("stack")


def eagle(heads: Any, target: Any, form: str) -> Any:
    """A fresh EAGLE drafter whose layer runs on the stack, or through transformers' forward
    (as before the stack) for the loop form."""
    drafter = heads.drafter(target)
    if form == "loop":
        drafter._stacked = None
    return drafter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--workloads", default="code,chat")
    parser.add_argument("--prompts-per-workload", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--skip-decodes", action="store_true")
    args = parser.parse_args()
    print(f"CPU: {cpu_name()}")
    target = load_backend(DEFAULT_TARGET, "int4")
    draft = load_backend(DEFAULT_DRAFT, "int4")
    toggles = [Toggle(target), Toggle(draft)]
    print("\n| model | rows | loop ms | stack ms | stack / loop |\n|---|---|---|---|---|")
    passes("1.5B", target, toggles[0], args.repeats)
    passes("0.5B", draft, toggles[1], args.repeats)
    if args.skip_decodes:
        return
    drafters: dict[str, Callable[[str], Any]] = {
        "plain": lambda form: None,
        "0.5B int4 draft": lambda form: ModelDrafter(draft),
    }
    try:
        target.keep_hidden_states()
        heads = heads_load.load_heads("eagle", target, None, DEFAULT_TARGET)
        drafters["EAGLE"] = lambda form: eagle(heads, target, form)
    except (ModelError, ValueError) as error:
        print(f"(no EAGLE: {error})")
    decodes(target, toggles, drafters, args)


if __name__ == "__main__":
    main()
