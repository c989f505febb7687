"""specdec tune on tiny models: the measurement plumbing, the table and the plot."""

import json

import pytest

from helpers import backend, perturbed_copy, tiny_llama
from specdec.cli import main
from specdec.config import SamplingParams
from specdec.tune import TuneRow, measure_costs, recommend, tune, write_outputs


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(seed=0)
    return backend(target), backend(perturbed_copy(target, noise=0.03, seed=1))


def test_cost_curve_is_relative_to_one_step(pair):
    costs = measure_costs(*pair, context=[1, 2, 3, 4, 5, 6], max_n=5)
    assert costs.verify_cost[1] == 1.0 and len(costs.verify_cost) == 6
    assert all(v > 0 for v in costs.verify_cost[1:]) and costs.c > 0


def test_tune_measures_every_k(pair, tmp_path):
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    costs, rows, alpha = tune(*pair, prompts=[[1, 2, 3], [7, 8, 9, 10]], params=params, max_k=4)
    assert [row.k for row in rows] == [1, 2, 3, 4]
    assert 0 < alpha["acceptance_rate"] <= alpha["alpha"] <= 1 and len(alpha["per_position"]) == 4
    for row in rows:
        assert row.predicted_speedup > 0 and row.measured_speedup > 0
    paths = write_outputs(tmp_path, costs, rows, alpha)
    saved = json.loads(paths["json"].read_text())
    assert saved["recommended_k"] in range(0, 5)
    assert paths["plot"].read_bytes()[:4] == b"\x89PNG"


def test_recommend_picks_the_fastest_measured_k_or_none():
    rows = [
        TuneRow(k, 1.0, 1.0, measured, 0.8, 2.0) for k, measured in ((1, 1.2), (2, 1.5), (3, 1.4))
    ]
    assert recommend(rows) == 2
    assert recommend([TuneRow(1, 1.0, 1.0, 0.9, 0.5, 1.5)]) == 0


def test_tune_command_needs_prompts(capsys):
    assert main(["tune"]) == 2
    assert "--prompts" in capsys.readouterr().err


def test_a_curve_that_contradicts_the_runs_is_named():
    from specdec.tune import CostCurve, curve_contradiction

    sound = CostCurve(0.100, 0.05, [0.0, 1.0, 1.05, 1.1])
    assert curve_contradiction(sound, runs_step_seconds=0.102) is None
    cold = CostCurve(0.433, 0.05, [0.0, 1.0, 1.05, 1.1])  # the 433 ms vs 102 ms
    assert "runs' step" in curve_contradiction(cold, runs_step_seconds=0.102)
    impossible = CostCurve(0.100, 0.05, [0.0, 1.0, 0.42, 0.38])
    assert "v(2) = 0.42" in curve_contradiction(impossible, runs_step_seconds=0.1)


def test_passes_are_timed_warm_and_interleaved(pair, monkeypatch):
    """Every size is timed in every round, after untimed warm-up rounds."""
    from specdec import tune as tune_module

    target, _ = pair
    calls = []
    forward = target.forward
    monkeypatch.setattr(
        target, "forward", lambda ids, **kw: calls.append(len(ids)) or forward(ids, **kw)
    )
    times = tune_module.time_passes(target, [1, 2, 3, 4, 5, 6], [1, 2, 3], repeats=3, warmup=2)
    assert set(times) == {1, 2, 3} and all(t > 0 for t in times.values())
    timed = calls[1:]  # the first call fills the context
    assert len(timed) == (2 + 3) * 3
    assert timed[:3] == [1, 2, 3] and timed[3:6] == [2, 3, 1]  # rotated each round
