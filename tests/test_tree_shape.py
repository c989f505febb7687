"""A draft tree's shape: where a second-choice leaf pays, from confidences and measured costs."""

import pytest

from specdec.controller import AdaptiveK, Round
from specdec.tree import (
    chain,
    chain_length,
    check,
    children,
    choose_siblings,
    path_rows,
    row_depths,
    row_parents,
)


def test_a_leaf_is_added_only_while_the_round_rate_rises():
    # one chain node accepted half the time, its leaf taken 0.4 of the time: with no leaf a
    # round yields 1.5 tokens for a 1.0 s pass (1.5 tok/s)
    cheap = {2: 1.0, 3: 1.1}  # one more row: 1.9 tokens / 1.1 s = 1.73 tok/s: pays
    dear = {2: 1.0, 3: 1.3}  # 1.9 / 1.3 = 1.46 tok/s: does not
    assert choose_siblings([0.5], [0.4], 0.0, cheap.__getitem__) == [0]
    assert choose_siblings([0.5], [0.4], 0.0, dear.__getitem__) == []


def test_leaves_go_where_they_gain_most_first():
    # depth 1's leaf is reached only when depth 0's node is accepted (0.9): gains 0.05 at
    # depth 0, 0.9 * 0.3 = 0.27 at depth 1; rows cost 0.05 s each past 3 and drafting 0.2 s:
    # 2.35 tokens / 1.2 s, then 2.62 / 1.25 with depth 1's leaf, but 2.67 / 1.3 with both
    costs = lambda n: 1.0 + 0.05 * max(0, n - 3)  # noqa: E731
    assert choose_siblings([0.9, 0.5], [0.05, 0.3], 0.2, costs) == [1]
    assert choose_siblings([0.9, 0.5], [0.0, 0.0], 0.2, lambda n: 1.0) == []


def test_the_shaper_waits_for_measured_costs():
    policy = AdaptiveK(max_k=4)
    assert policy.siblings([0.5, 0.5], [0.9, 0.9]) == []
    for _ in range(5):
        policy.observe(Round(2, 1, [0.5, 0.5], 0.01, 0.030, rows=3))
        policy.observe(Round(2, 1, [0.5, 0.5], 0.01, 0.031, rows=4))
    # passes of 3 and 4 rows cost nearly the same: a likely leaf pays
    assert policy.siblings([0.55, 0.55], [0.95, 0.95]) != []
    assert policy.pass_seconds == {3: 0.030, 4: 0.031}, "costs are kept by rows scored"


def test_shapes():
    parents = [-1, -1, 0, 2, 0]
    check(parents)
    with pytest.raises(ValueError, match="node 1: parent 1"):
        check([-1, 1])
    assert chain(3) == [-1, 0, 1] and chain_length(chain(3), 3) == 3
    assert chain_length(parents, 5) == 1 and chain_length(None, 4) == 4
    assert chain_length([-1, 0, -1, 1], 4) == 2
    assert row_parents(parents) == [-1, 0, 0, 1, 3, 1]
    assert row_depths(row_parents(parents)) == [0, 1, 1, 2, 3, 2]
    assert children(parents) == [[0, 1], [2, 4], [], [3], [], []]
    assert path_rows([0, 2, 3]) == [0, 1, 3, 4]
