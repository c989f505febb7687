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
