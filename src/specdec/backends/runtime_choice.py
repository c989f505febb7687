"""``--draft-runtime auto`` and ``--target-runtime auto``: the runtime that is fastest on this
machine for the role, measured.

The draft's cost per token is the paper's c: what decides whether a draft pays. Which runtime
gives the cheapest draft step depends on the CPU and the builds (measured: the 0.5B steps in
~11 ms on llama.cpp Q4_0 and ~20 ms on int8 on an AVX-512 EPYC, 29 vs 70-98 ms on an AVX2 one;
a Xeon's int8 step was 60 ms), so it is measured, not assumed: the first time a draft is chosen
for on a machine, its one-token step is timed on each candidate runtime (warm, median); the
fastest wins. int8 and int4 are timed on stand-ins of the model (``quant/stand_in.py``: its
shapes, made-up weights), so that the form of the runtime that loses is never made.

A target is timed on a 5-token pass instead: the verify pass of a round with k = 4. For one
drafter, acceptance and k, a round's tokens are the same on either runtime and its time
differs only by that pass, so the faster pass gives the faster decoding (measured on the
EPYC: int4's 5-token pass 46 ms, int8's 52-54; int4's step 29 ms, int8's 46). Only runtimes
whose block passes equal their steps bit for bit are candidates (int8, int4): a llama.cpp
target's 5-token pass costs 2.4-3.8 steps here, and its speculative output could differ from
its plain output.

The verdicts are cached beside the llama.cpp self-test, keyed by the role, the CPU, the
builds (llama-cpp-python, torch), the interpreter and the model; a new CPU or a new build
measures again. ``specdec doctor`` lists the verdicts.
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


TARGET_PASS = 5  # tokens of the pass a target is timed on: the verify pass of k = 4
MEASURED = {"draft": "step", "target": f"{TARGET_PASS}-token pass"}


@dataclass(frozen=True)
class RuntimeChoice:
    runtime: str  # a runtime value (specdec.runtime)
    step_ms: dict[str, float]  # what was measured on every candidate (MEASURED[role]), ms
    draft: str  # the model (named draft in caches written before targets were chosen too)
    role: str = "draft"

    @property
    def reason(self) -> str:
        steps = ", ".join(f"{name} {ms:.1f} ms" for name, ms in sorted(self.step_ms.items()))
        return f"the {self.draft} {self.role}'s measured {MEASURED[self.role]} here: {steps}"


# Settings that hold the kernels to a smaller instruction set (torch's, oneDNN's, MKL's,
# fbgemm's int8 GEMMs', specdec's int4 kernel's): a machine run under them is measured as a
# CPU of its own. fbgemm's matters most for the int8 runtime (its linear_dynamic, measured on
# an AVX-512 EPYC: 1536 -> 8960 one row 0.16-0.19 ms, 0.27-0.33 ms with AVX2).
ISA_VARIABLES = (
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "MKL_ENABLE_INSTRUCTIONS",
    "FBGEMM_ENABLE_INSTRUCTIONS",
    "SPECDEC_INT4_PATH",
)


def machine_key(model: str, role: str = "draft") -> str:
    """What the verdict depends on: the CPU (and any ``ISA_VARIABLES`` set), the builds
    (llama.cpp, torch, specdec's int4 kernel source, the int8 runtime's form), the
    interpreter, the model, the role."""
    import os

    import torch

    from specdec.backends.probe import machine_key as llamacpp_machine
    from specdec.backends.quant import int8, kernels

    held = ",".join(f"{name}={os.environ[name]}" for name in ISA_VARIABLES if os.environ.get(name))
    cpu = f"{llamacpp_machine()}|{held}" if held else llamacpp_machine()
    key = f"{cpu}|torch {torch.__version__}|{kernels.kernel_name()}|int8 form {int8.FORM}|{model}"
    return key if role == "draft" else f"{key}|{role}"


def step_ms(backend, repeats: int = REPEATS, tokens: int = 1) -> float:
    """The median pass of ``tokens`` tokens (a one-token step by default) after a 32-token
    context, warm (two untimed passes), cut back to the context after each."""
    return statistics.median(step_times_ms(backend, repeats, tokens))


def step_times_ms(backend, repeats: int = REPEATS, tokens: int = 1) -> list[float]:
    """Every timed pass of ``step_ms``, in ms."""
    context = [i % backend.vocab_size for i in range(1000, 1032)]
    backend.truncate(0)
    backend.forward(context, last_only=True)
    times = []
    for index in range(2 + repeats):
        block = [context[(index + i) % len(context)] for i in range(tokens)]
        started = time.perf_counter()
        backend.forward(block, last_only=tokens == 1)
        if index >= 2:
            times.append(1000 * (time.perf_counter() - started))
        backend.truncate(len(context))
    backend.truncate(0)
    return times


def choose(
    model: str,
    candidates: list[str],
    cache_dir: Path,
    measure: Callable[[str], float],
    role: str = "draft",
) -> tuple[RuntimeChoice, bool]:
    """(the choice, whether it was measured now). ``measure(runtime)`` times the model on one
    candidate runtime, in ms (a step for a draft, a 5-token pass for a target)."""
    key = machine_key(model, role)
    cache_file = cache_dir / CACHE_FILE
    try:
        cached = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        cached = {}
    entry = cached.get(key)
    if entry and set(candidates) <= set(entry.get("step_ms", {})):
        # measured with these candidates and perhaps more (generate's draft choice counts
        # llama.cpp, serve's does not): the fastest of these, without measuring again
        steps = {runtime: entry["step_ms"][runtime] for runtime in candidates}
        fastest = min(steps, key=lambda runtime: steps[runtime])
        return RuntimeChoice(fastest, steps, entry["draft"], entry.get("role", role)), False
    steps = {runtime: measure(runtime) for runtime in candidates}
    choice = RuntimeChoice(min(steps, key=lambda runtime: steps[runtime]), steps, model, role)
    cached[key] = asdict(choice)
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    temporary = cache_file.with_suffix(".tmp")
    temporary.write_text(json.dumps(cached, indent=1))
    temporary.replace(cache_file)
    return choice, True


def cached_choices(cache_dir: Path) -> list[RuntimeChoice]:
    """Every verdict measured on this machine with these builds (for ``specdec doctor``)."""
    try:
        cached = json.loads((cache_dir / CACHE_FILE).read_text())
    except (OSError, ValueError):
        return []
    prefix = machine_key("").rpartition("|")[0] + "|"
    return [RuntimeChoice(**entry) for key, entry in cached.items() if key.startswith(prefix)]
