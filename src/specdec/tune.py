"""``specdec tune``: the paper's analysis on the user's own pair and prompts.

Measures the cost curve (target pass time for n tokens over a one-token step, v(n)), then
decodes the prompts plainly and with every k, interleaved; from those runs the acceptance
rate alpha, the target step, the draft's cost per token and the engine's overhead per round.
Predicts the speedup of every k with the paper's formula, E[tokens](alpha, k) over the
round's cost (k c + v(k+1) in target steps, plus the overhead the paper leaves out), sets
it beside the measured speedup, and recommends k.
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
from specdec.metrics import SpecStats
from specdec.theory import expected_tokens_per_round, expected_tokens_per_round_by_position


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
    return time_passes(backend, context, [n], repeats)[n]


def time_passes(
    backend: Backend, context: list[int], sizes: list[int], repeats: int = 5, warmup: int = 2
) -> dict[int, float]:
    """Median seconds of an n-token pass for every n in ``sizes``, timed warm and
    interleaved: ``warmup`` untimed rounds over all sizes first, then ``repeats`` rounds,
    each over all sizes in a rotated order, so a slow spell of the machine (or a cold
    start) hits every size alike instead of one."""
    backend.truncate(0)
    backend.forward(context, last_only=True)
    samples: dict[int, list[float]] = {n: [] for n in sizes}
    for round_index in range(warmup + repeats):
        shift = round_index % len(sizes)
        for n in sizes[shift:] + sizes[:shift]:
            started = time.perf_counter()
            backend.forward(context[-n:] if len(context) >= n else (context * n)[:n])
            if round_index >= warmup:
                samples[n].append(time.perf_counter() - started)
            backend.truncate(len(context))
    return {n: statistics.median(times) for n, times in samples.items()}


def measure_costs(
    target: Backend, draft: Backend, context: list[int], max_n: int, repeats: int = 5
) -> CostCurve:
    times = time_passes(target, context, list(range(1, max_n + 1)), repeats)
    step = times[1]
    verify = [0.0, 1.0] + [times[n] / step for n in range(2, max_n + 1)]
    return CostCurve(step, time_passes(draft, context, [1], repeats)[1], verify)


def curve_contradiction(costs: CostCurve, runs_step_seconds: float) -> str | None:
    """Why the curve cannot describe the runs it is meant to predict, or None. A curve
    whose step differs from the decoding runs' step by more than 25%, or in which a pass
    of several tokens costs less than 0.8 of one step, was timed in another state of the
    machine (cold caches, a busy neighbour)."""
    ratio = costs.step_seconds / runs_step_seconds if runs_step_seconds else 1.0
    if not 0.75 <= ratio <= 1.25:
        return f"its step ({costs.step_seconds * 1e3:.1f} ms) is {ratio:.2f}x the runs' step"
    cheap = [n for n, v in enumerate(costs.verify_cost) if n >= 2 and v < 0.8]
    if cheap:
        return f"v({cheap[0]}) = {costs.verify_cost[cheap[0]]:.2f} < 0.8: cheaper than a step"
    return None


@dataclass(frozen=True)
class _Sample:
    repeat: int
    prompt: int
    stats: SpecStats

    @property
    def decode_seconds(self) -> float:
        return self.stats.total_seconds - self.stats.prefill_seconds

    @property
    def seconds_per_token(self) -> float:
        return self.decode_seconds / max(self.stats.generated_tokens, 1)


def acceptance_summary(samples: list[_Sample]) -> dict:
    """Acceptance over runs: the rate, the paper's alpha (accepted / reached), per position
    (all from ``SpecStats.merged``)."""
    total = SpecStats.merged([sample.stats for sample in samples])
    return {
        "acceptance_rate": total.acceptance_rate,
        "alpha": total.alpha,
        "mean_accepted_length": total.mean_accepted_length,
        "per_position": total.per_position_acceptance,
    }


def tune(
    target: Backend,
    draft: Backend,
    prompts: list[list[int]],
    params: SamplingParams,
    max_k: int,
    progress=lambda step, done, total: None,
    repeats: int = 2,
) -> tuple[CostCurve, list[TuneRow], dict]:
    """Run plain decoding and every k = 1..max_k on every prompt, interleaved (all k on a
    prompt, then the next prompt; the whole again ``repeats`` times, order rotated), so a
    slow spell of the machine hits every k alike. Measured speedup of k: the median over
    (prompt, pass) of plain's decode time per token over k's. Predicted: the paper's
    E[tokens](alpha, k) over the round's cost, k d + v(k+1) s + o, from the cost curve's v,
    and what the runs measured beside it: alpha (deepest k), the target step s (plain runs),
    the draft's seconds per token d and the engine's overhead per round o (all k).
    """
    costs = measure_costs(target, draft, prompts[0], max_k + 1)
    plain_engine, speculative_engine = Engine(target), Engine(target, ModelDrafter(draft))
    ks = list(range(max_k + 1))  # 0: plain decoding
    samples: dict[int, list[_Sample]] = {k: [] for k in ks}
    total, done = repeats * len(prompts) * len(ks), 0
    for repeat in range(repeats):
        order = ks[repeat % len(ks) :] + ks[: repeat % len(ks)]
        for index, prompt in enumerate(prompts):
            for k in order:
                target.truncate(0)
                out = (speculative_engine if k else plain_engine).generate(
                    prompt, params, SpecConfig(k=k)
                )
                samples[k].append(_Sample(repeat, index, out.stats))
                done += 1
                progress("decoding: plain and every k, interleaved", done, total)
    plain = {(s.repeat, s.prompt): s for s in samples[0]}
    plain_per_token = sum(s.decode_seconds for s in samples[0]) / max(
        1, sum(s.stats.generated_tokens for s in samples[0])
    )
    step = sum(s.stats.target_seconds for s in samples[0]) / max(
        1, sum(s.stats.rounds for s in samples[0])
    )
    problem = curve_contradiction(costs, step)
    if problem is not None:  # measured again, now that the machine is warm from the runs
        first_problem = problem
        costs = measure_costs(target, draft, prompts[0], max_k + 1)
        problem = curve_contradiction(costs, step)
        problem = None if problem is None else f"{first_problem}; re-measured: {problem}"
    speculative = [s for k in ks[1:] for s in samples[k]]
    drafted = sum(s.stats.drafted_tokens for s in speculative)
    rounds = sum(s.stats.rounds for s in speculative)
    draft_per_token = sum(s.stats.drafter_seconds for s in speculative) / max(1, drafted)
    overhead_per_round = sum(s.stats.overhead_seconds for s in speculative) / max(1, rounds)
    alpha = acceptance_summary(samples[max_k]) | {
        "target_step_seconds": step,
        "plain_seconds_per_token": plain_per_token,
        "draft_seconds_per_token": draft_per_token,
        "overhead_seconds_per_round": overhead_per_round,
        "repeats": repeats,
        "curve_contradicts_runs": problem,  # None: the curve agrees with the runs
    }
    rows = []
    for k in ks[1:]:
        round_seconds = k * draft_per_token + costs.verify_cost[k + 1] * step + overhead_per_round
        iid = expected_tokens_per_round(min(alpha["alpha"], 0.999999), k)
        by_position = expected_tokens_per_round_by_position(alpha["per_position"], k)
        ratios = [
            plain[(s.repeat, s.prompt)].seconds_per_token / s.seconds_per_token for s in samples[k]
        ]
        mine = acceptance_summary(samples[k])
        rows.append(
            TuneRow(
                k,
                plain_per_token * iid / round_seconds,
                plain_per_token * by_position / round_seconds,
                statistics.median(ratios),
                mine["acceptance_rate"],
                mine["mean_accepted_length"],
            )
        )
    return costs, rows, alpha


def recommend(rows: list[TuneRow]) -> int:
    best = max(rows, key=lambda row: row.measured_speedup)
    return best.k if best.measured_speedup > 1.0 else 0


def write_outputs(
    out_dir: Path, costs: CostCurve, rows: list[TuneRow], alpha: dict
) -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "tune.json", "plot": out_dir / "tune.png"}
    paths["json"].write_text(
        json.dumps(
            {
                "costs": asdict(costs) | {"c": costs.c},
                "alpha": alpha,
                "rows": [asdict(r) for r in rows],
                "recommended_k": recommend(rows),
            },
            indent=1,
        )
    )
    fig, ax = plt.subplots(figsize=(6, 4))
    ks = [r.k for r in rows]
    ax.plot(ks, [r.predicted_speedup for r in rows], "o--", label="predicted (paper, i.i.d. alpha)")
    ax.plot(
        ks,
        [r.predicted_speedup_by_position for r in rows],
        "s:",
        label="predicted (per-position alpha)",
    )
    ax.plot(ks, [r.measured_speedup for r in rows], "o-", label="measured")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("k (drafted tokens per round)")
    ax.set_ylabel("speedup over plain decoding")
    c = alpha["draft_seconds_per_token"] / alpha["target_step_seconds"]  # as in the runs
    ax.set_title(f"alpha={alpha['alpha']:.2f}, c={c:.2f} (in the runs), v(k+1) from the cost curve")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(paths["plot"], dpi=120)
    plt.close(fig)
    return paths
