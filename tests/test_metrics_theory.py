import pytest

from specdec.metrics import SpecStats
from specdec.theory import expected_speedup, expected_tokens_per_round


def test_round_bookkeeping():
    stats = SpecStats()
    stats.record_round(k=4, num_accepted=4, bonus=True, residual_fallback=False)
    stats.record_round(k=4, num_accepted=1, bonus=False, residual_fallback=True)
    stats.record_round(k=2, num_accepted=0, bonus=False, residual_fallback=False)
    assert stats.drafted_tokens == 10 and stats.accepted_tokens == 5
    assert stats.acceptance_rate == 0.5
    assert stats.mean_accepted_length == pytest.approx(1 + 5 / 3)
    # Position 0 reached 3 times (accepted twice); position 1 twice (once); 2 and 3 once.
    assert stats.per_position_acceptance == [2 / 3, 1 / 2, 1.0, 1.0]
    assert stats.bonus_tokens == 1 and stats.residual_fallbacks == 1
    assert stats.k_per_round == {4: 2, 2: 1}
    assert stats.to_dict()["k_per_round"] == {"2": 1, "4": 2}


def test_empty_stats_are_zero_not_nan():
    stats = SpecStats()
    assert (
        stats.acceptance_rate == 0
        and stats.mean_accepted_length == 0
        and stats.tokens_per_second == 0
    )


def test_expected_tokens_seed_numbers():
    # The seed walk-through: alpha = 0.8, gamma = 4 -> (1 - 0.8^5) / 0.2 = 3.3616.
    assert expected_tokens_per_round(0.8, 4) == pytest.approx(3.3616)
    assert expected_tokens_per_round(0.0, 7) == 1.0
    assert expected_tokens_per_round(1.0, 3) == 4.0


def test_expected_speedup():
    # Paper, section 4: alpha 0.8, gamma 4, c 0.05 -> 3.3616 / 1.2 = 2.801.
    assert expected_speedup(0.8, 4, 0.05) == pytest.approx(3.3616 / 1.2)
    assert expected_speedup(0.5, 0, 0.3) == 1.0
    with pytest.raises(ValueError):
        expected_speedup(1.2, 2, 0.1)


def test_merged_stats_sum_counters_and_recompute_rates():
    from specdec.metrics import SpecStats

    a, b = SpecStats(), SpecStats()
    a.record_round(4, 4, True, False, "model")  # 4 drafted, 4 accepted
    b.record_round(2, 0, False, False, "lookup")  # 2 drafted, 0 accepted
    b.record_round(0, 0, False, False)
    total = SpecStats.merged([a, b])
    assert (total.drafted_tokens, total.accepted_tokens, total.rounds) == (6, 4, 3)
    assert total.acceptance_rate == 4 / 6  # from the sums, not the mean of 1.0 and 0.0
    assert total.mean_accepted_length == 1 + 4 / 3
    assert total.drafted_per_position == [2, 1, 1, 1] and total.alpha == 4 / 5
    assert set(total.by_drafter) == {"model", "lookup"}
    again = SpecStats.from_dict(total.to_dict())
    assert again.to_dict() == total.to_dict()
