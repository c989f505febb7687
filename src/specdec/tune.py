"""``specdec tune``: the paper's analysis on the user's own pair and prompts.

Measures the cost curve (target pass time for n tokens over a one-token step, v(n)), the
acceptance rate alpha, the draft cost per token c and the engine's overhead per round o
(both in the deepest-k run, in units of a target step), predicts the speedup of every k
with the paper's formula E[tokens](alpha, k) / (k c + v(k+1) + o), measures it, and
recommends k.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from specdec.backends.base import Backend
from specdec.config import SamplingParams, SpecConfig
from specdec.drafters import ModelDrafter
from specdec.engine import Engine
from specdec.theory import expected_speedup, expected_tokens_per_round_by_position


@dataclass(frozen=True)
class CostCurve:
    step_seconds: float  # target, one token
    draft_step_seconds: float
    verify_cost: list[float]  # v(n) for n = 0..max_n (index 0 unused, v(1) = 1)

    @property
    def c(self) -> float:
        return self.draft_step_seconds / self.step_seconds


@dataclass(frozen=True)
class TuneRow:
    k: int
    predicted_speedup: float  # i.i.d. alpha, the paper's formula
    predicted_speedup_by_position: float  # per-position acceptance
    measured_speedup: float
    acceptance_rate: float
    mean_accepted_length: float


def time_pass(backend: Backend, context: list[int], n: int, repeats: int = 5) -> float:
    """Median seconds of an n-token forward pass after ``context`` (cache cut back after)."""
    backend.truncate(0)
    backend.forward(context)
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        backend.forward(context[-n:] if len(context) >= n else (context * n)[:n])
        samples.append(time.perf_counter() - started)
        backend.truncate(len(context))
    return statistics.median(samples)


def measure_costs(target: Backend, draft: Backend, context: list[int], max_n: int) -> CostCurve:
    step = time_pass(target, context, 1)
    verify = [0.0, 1.0] + [time_pass(target, context, n) / step for n in range(2, max_n + 1)]
    return CostCurve(step, time_pass(draft, context, 1), verify)


def decode_seconds_per_token(engine: Engine, prompts: list[list[int]], params: SamplingParams,
                             spec: SpecConfig) -> tuple[float, dict]:
    """Decode-phase seconds per generated token over all prompts (prefill excluded)."""
    seconds = tokens = accepted = drafted = rounds = 0
    drafter_seconds = overhead_seconds = 0.0
    per_position: list[list[float]] = []
    for prompt in prompts:
        engine.target.truncate(0)
        out = engine.generate(prompt, params, spec)
        stats = out.stats
        seconds += stats.total_seconds - stats.prefill_seconds
        tokens += stats.generated_tokens
        accepted, drafted, rounds = accepted + stats.accepted_tokens, drafted + stats.drafted_tokens, rounds + stats.rounds
        drafter_seconds += stats.drafter_seconds
        overhead_seconds += stats.overhead_seconds
        for i, (a, d) in enumerate(zip(stats.accepted_per_position, stats.drafted_per_position)):
            while len(per_position) <= i:
                per_position.append([0.0, 0.0])
            per_position[i][0] += a
            per_position[i][1] += d
    reached = sum(d for _, d in per_position)
    summary = {"acceptance_rate": accepted / drafted if drafted else 0.0,
               # The paper's alpha: P(a draft is accepted | the verifier reached it).
               "alpha": sum(a for a, _ in per_position) / reached if reached else 0.0,
               "mean_accepted_length": 1 + accepted / rounds if rounds else 1.0,
               "per_position": [a / d if d else 0.0 for a, d in per_position],
               # Measured in the run itself: seconds per drafted token (catch-up forwards
               # included) and engine overhead per round (verification, sampling, text).
               "draft_seconds_per_token": drafter_seconds / drafted if drafted else 0.0,
               "overhead_seconds_per_round": overhead_seconds / rounds if rounds else 0.0}
    return seconds / max(tokens, 1), summary


def tune(target: Backend, draft: Backend, prompts: list[list[int]], params: SamplingParams,
         max_k: int, progress=lambda step, done, total: None) -> tuple[CostCurve, list[TuneRow], dict]:
    costs = measure_costs(target, draft, prompts[0], max_k + 1)
    progress("measuring", 1, max_k + 2)
    plain = Engine(target)
    speculative = Engine(target, ModelDrafter(draft))
    plain_per_token, _ = decode_seconds_per_token(plain, prompts, params, SpecConfig(k=0))
    progress("measuring", 2, max_k + 2)
    rows = []
    alpha_probe = None
    for k in range(max_k, 0, -1):  # the deepest k first: it measures acceptance at every position
        per_token, summary = decode_seconds_per_token(speculative, prompts, params, SpecConfig(k=k))
        if alpha_probe is None:
            alpha_probe = summary
        alpha = alpha_probe["alpha"]
        # The paper's cost k*c + v, plus the per-round engine overhead o it leaves out; c and o
        # as measured in the probe run, in units of one target step.
        c = alpha_probe["draft_seconds_per_token"] / costs.step_seconds
        o = alpha_probe["overhead_seconds_per_round"] / costs.step_seconds
        round_cost = k * c + costs.verify_cost[k + 1] + o
        by_position = expected_tokens_per_round_by_position(alpha_probe["per_position"], k) / round_cost
        rows.append(TuneRow(k, expected_speedup(min(alpha, 0.999999), k, c, costs.verify_cost[k + 1] + o),
                            by_position, plain_per_token / per_token, summary["acceptance_rate"],
                            summary["mean_accepted_length"]))
        progress("measuring", 2 + max_k - k + 1, max_k + 2)
    rows.sort(key=lambda row: row.k)
    return costs, rows, alpha_probe


def recommend(rows: list[TuneRow]) -> int:
    best = max(rows, key=lambda row: row.measured_speedup)
    return best.k if best.measured_speedup > 1.0 else 0


def write_outputs(out_dir: Path, costs: CostCurve, rows: list[TuneRow], alpha: dict) -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "tune.json", "plot": out_dir / "tune.png"}
    paths["json"].write_text(json.dumps({"costs": asdict(costs) | {"c": costs.c}, "alpha": alpha,
                                         "rows": [asdict(r) for r in rows],
                                         "recommended_k": recommend(rows)}, indent=1))
    fig, ax = plt.subplots(figsize=(6, 4))
    ks = [r.k for r in rows]
    ax.plot(ks, [r.predicted_speedup for r in rows], "o--", label="predicted (paper, i.i.d. alpha)")
    ax.plot(ks, [r.predicted_speedup_by_position for r in rows], "s:", label="predicted (per-position alpha)")
    ax.plot(ks, [r.measured_speedup for r in rows], "o-", label="measured")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("k (drafted tokens per round)")
    ax.set_ylabel("speedup over plain decoding")
    ax.set_title(f"alpha={alpha['alpha']:.2f}, c={costs.c:.2f}, v(k+1) measured")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(paths["plot"], dpi=120)
    plt.close(fig)
    return paths
