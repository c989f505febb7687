"""A draft tree's shape: where a second-choice leaf pays, from confidences and measured costs."""

import pytest

from specdec.controller import AdaptiveK, Round
from specdec.tree import (
    chain,
    chain_length,
    check,
    children,
    choose_copy,
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


def test_a_copy_is_verified_as_far_as_its_guesses_pay():
    # the chain: depth 0 accepted 0.5 of the time; the guesses part from it at depth 0 and
    # are accepted 0.3, then 0.9 and 0.1 of the time: 1.5 tokens for a 1.0 s pass without
    cheap = lambda n: 1.0 + 0.05 * max(0, n - 2)  # noqa: E731
    # 1 guess: 1.8 tokens / 1.05 s = 1.71 tok/s; 2: 2.07 / 1.1 = 1.88; 3: 2.097 / 1.15 = 1.82
    assert choose_copy([0.5], 0, [0.3, 0.9, 0.1], 2, 0.0, cheap) == 2
    assert choose_copy([0.5], 0, [0.3, 0.9, 0.1], 2, 0.0, lambda n: float(n)) == 0
    assert choose_copy([0.5], 0, [0.0, 0.0], 2, 0.0, cheap) == 0, "a guess never taken"
    # a branch deeper down is reached only when the chain is: it gains less
    assert choose_copy([0.1, 0.5], 1, [0.3], 3, 0.0, lambda n: 1.0 + 0.1 * (n - 3)) == 0
    assert choose_copy([0.9, 0.5], 1, [0.3], 3, 0.0, lambda n: 1.0 + 0.1 * (n - 3)) == 1
    # after the chain's end (the chain stopped first): reached when all of it is accepted
    assert choose_copy([0.9], 1, [0.5], 2, 0.0, lambda n: 1.0 + 0.1 * (n - 2)) == 1


def test_the_copy_rule_learns_what_the_guesses_are_worth():
    policy = AdaptiveK(max_k=4)
    assert policy.copy_length([0.5, 0.5], 3, 0, 3) == 0, "no branch before costs are measured"
    for _ in range(5):  # a row past 3 costs 5 ms, a draft step 5 ms
        policy.observe(Round(2, 1, [0.5, 0.5], 0.01, 0.030, rows=3))
        policy.observe(Round(2, 1, [0.5, 0.5], 0.01, 0.045, rows=6))
    # 1.75 tokens a round in 40 ms; the prior's first guess: 2.02 in 45 ms; a second 2.09 in 50
    assert policy.copy_rates()[0] == pytest.approx(0.27), "the measured prior"
    assert policy.copy_length([0.5, 0.5], 3, 0, 3) == 1
    # branches reached and never taken: their estimate falls and they are left out
    for _ in range(12):
        policy.observe(Round(2, 1, [0.5, 0.5], 0.01, 0.045, rows=6, copy=(0, 3, 0)))
    assert policy.copy_rates()[0] < 0.05
    assert policy.copy_length([0.5, 0.5], 3, 0, 3) == 0
    # a branch never reached (the chain rejected before its depth) says nothing
    before = [list(counts) for counts in policy.copy_counts]
    policy.observe(Round(2, 0, [0.5, 0.5], 0.01, 0.045, rows=6, copy=(1, 3, 0)))
    assert policy.copy_counts == before
    # branches taken whole: every guess's estimate rises
    for _ in range(12):
        policy.observe(Round(2, 0, [0.5, 0.5], 0.01, 0.045, rows=6, copy=(0, 3, 3)))
    assert min(policy.copy_rates()[:3]) > 0.8
    assert policy.copy_length([0.5, 0.5], 3, 0, 3) == 3


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
