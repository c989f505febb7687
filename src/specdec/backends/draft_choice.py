"""``--draft-runtime auto``: the draft runtime that steps fastest on this machine, measured.

The draft's cost per token is the paper's c: what decides whether a draft pays. Which runtime
gives the cheapest draft step depends on the CPU and the builds (measured: the 0.5B steps in
~11 ms on llama.cpp Q4_0 and ~20 ms on int8 on an AVX-512 EPYC, 29 vs 70-98 ms on an AVX2 one;
a Xeon's int8 step was 60 ms), so it is measured, not assumed: the first time a draft is chosen
for on a machine, it is loaded on each candidate runtime and its one-token step timed (warm,
interleaved, median); the fastest wins. The verdict is cached beside the llama.cpp self-test,
keyed by the CPU, the builds (llama-cpp-python, torch), the interpreter and the draft; a new
CPU or a new build measures again. ``specdec doctor`` lists the verdicts.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

CACHE_FILE = "draft-runtime.json"
REPEATS = 7


@dataclass(frozen=True)
class DraftChoice:
    runtime: str  # a runtime value (specdec.runtime)
    step_ms: dict[str, float]  # the measured step of every candidate
    draft: str

    @property
    def reason(self) -> str:
        steps = ", ".join(f"{name} {ms:.1f} ms" for name, ms in sorted(self.step_ms.items()))
        return f"the {self.draft} draft's measured step here: {steps}"


def machine_key(draft: str) -> str:
    """What the verdict depends on: the CPU, the builds, the interpreter, the draft."""
    import torch

    from specdec.backends.probe import machine_key as llamacpp_machine

    return f"{llamacpp_machine()}|torch {torch.__version__}|{draft}"


def step_ms(backend, repeats: int = REPEATS) -> float:
    """The median one-token step after a 32-token context, warm (two untimed steps)."""
    context = [i % backend.vocab_size for i in range(1000, 1032)]
    backend.truncate(0)
    backend.forward(context, last_only=True)
    times = []
    for index in range(2 + repeats):
        started = time.perf_counter()
        backend.forward([context[index % len(context)]], last_only=True)
        if index >= 2:
            times.append(time.perf_counter() - started)
    backend.truncate(0)
    return 1000 * statistics.median(times)


def choose(
    draft: str,
    candidates: list[str],
    cache_dir: Path,
    measure: Callable[[str], float],
) -> tuple[DraftChoice, bool]:
    """(the choice, whether it was measured now). ``measure(runtime)`` times the draft's step
    on one candidate runtime, in ms."""
    key = machine_key(draft)
    cache_file = cache_dir / CACHE_FILE
    try:
        cached = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        cached = {}
    entry = cached.get(key)
    if entry and set(entry.get("step_ms", {})) == set(candidates):
        return DraftChoice(**entry), False
    steps = {runtime: measure(runtime) for runtime in candidates}
    choice = DraftChoice(min(steps, key=lambda runtime: steps[runtime]), steps, draft)
    cached[key] = asdict(choice)
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    temporary = cache_file.with_suffix(".tmp")
    temporary.write_text(json.dumps(cached, indent=1))
    temporary.replace(cache_file)
    return choice, True


def cached_choices(cache_dir: Path) -> list[DraftChoice]:
    """Every verdict measured on this machine with these builds (for ``specdec doctor``)."""
    try:
        cached = json.loads((cache_dir / CACHE_FILE).read_text())
    except (OSError, ValueError):
        return []
    prefix = machine_key("").rpartition("|")[0] + "|"
    return [DraftChoice(**entry) for key, entry in cached.items() if key.startswith(prefix)]
