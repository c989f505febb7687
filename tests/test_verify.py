"""Verification on hand-built logits and probabilities."""

import pytest
import torch

from specdec.config import SamplingParams
from specdec.verify import residual_distribution, verify_greedy, verify_stochastic

A, B, C = 0, 1, 2


def logits_with_argmax(argmaxes, vocab=5):
    """One row per position whose argmax is the given token."""
    logits = torch.zeros(len(argmaxes), vocab)
    for row, token in enumerate(argmaxes):
        logits[row, token] = 3.0
    return logits


def ids(*tokens):
    return torch.tensor(tokens, dtype=torch.long)


class TestGreedy:
    def test_perfect_match_takes_all_drafts_and_the_bonus(self):
        result = verify_greedy(ids(1, 2, 3), logits_with_argmax([1, 2, 3, 4]))
        assert result.token_ids == [1, 2, 3, 4]
        assert result.num_accepted == 3 and result.bonus

    def test_early_mismatch_stops_at_the_first_difference(self):
        # Position 2 matches again, but nothing after a rejection counts.
        result = verify_greedy(ids(1, 0, 3), logits_with_argmax([1, 2, 3, 4]))
        assert result.token_ids == [1, 2]
        assert result.num_accepted == 1 and not result.bonus

    def test_all_rejected_gives_the_targets_token(self):
        result = verify_greedy(ids(0, 0), logits_with_argmax([4, 4, 4]))
        assert result.token_ids == [4] and result.num_accepted == 0

    def test_k_equal_1(self):
        assert verify_greedy(ids(2), logits_with_argmax([2, 3])).token_ids == [2, 3]
        assert verify_greedy(ids(1), logits_with_argmax([2, 3])).token_ids == [2]

    def test_k_equal_0_is_a_plain_step(self):
        result = verify_greedy(ids(), logits_with_argmax([3]))
        assert result.token_ids == [3] and result.num_accepted == 0


def probs(*rows):
    return torch.tensor(rows, dtype=torch.float32)


class TestStochastic:
    def test_seed_article_walkthrough(self):
        """The seed's example: drafts [B, A, C]; B accepted (0.3/0.7), A always (0.7/0.6 > 1),
        C rejected (0.4/0.8) for a large enough uniform; the residual is all on B."""
        draft = probs([0.2, 0.7, 0.1], [0.6, 0.1, 0.3], [0.1, 0.1, 0.8])
        target = probs([0.5, 0.3, 0.2], [0.7, 0.2, 0.1], [0.1, 0.5, 0.4], [0.3, 0.4, 0.3])
        outcomes = set()
        for seed in range(200):
            result = verify_stochastic(
                ids(B, A, C), draft, target, torch.Generator().manual_seed(seed)
            )
            outcomes.add(tuple(result.token_ids))
        # Every outcome is: a rejection at 1 (residual (0.3, 0, 0.1)/0.4), at 3 -> B,
        # or all + bonus.
        for outcome in outcomes:
            if len(outcome) == 1:
                assert outcome[0] in (A, C)
            elif len(outcome) == 3:
                assert outcome == (B, A, B)
            else:
                assert len(outcome) == 4 and outcome[:3] == (B, A, C)
        assert (B, A, B) in outcomes

    def test_target_zero_probability_always_rejects(self):
        draft = probs([0.5, 0.5, 0.0])
        target = probs([0.0, 1.0, 0.0], [1.0, 0.0, 0.0])
        for seed in range(50):
            result = verify_stochastic(ids(A), draft, target, torch.Generator().manual_seed(seed))
            assert result.token_ids == [B] and result.num_accepted == 0

    def test_target_at_least_draft_always_accepts(self):
        draft = probs([0.2, 0.8, 0.0], [0.5, 0.5, 0.0])
        target = probs([0.1, 0.9, 0.0], [0.4, 0.6, 0.0], [0.0, 0.0, 1.0])
        for seed in range(50):
            result = verify_stochastic(
                ids(B, B), draft, target, torch.Generator().manual_seed(seed)
            )
            assert result.token_ids == [B, B, C] and result.bonus

    def test_deterministic_drafts_are_point_masses(self):
        target = probs([0.25, 0.75, 0.0], [0.0, 0.0, 1.0])
        accepted = 0
        for seed in range(400):
            result = verify_stochastic(ids(B), None, target, torch.Generator().manual_seed(seed))
            if result.num_accepted:
                assert result.token_ids == [B, C]
                accepted += 1
            else:
                # q = 1 on B, so the residual is the target without B: all mass on A.
                assert result.token_ids == [A]
        assert 0.65 < accepted / 400 < 0.85  # accepted with probability target[B] = 0.75

    def test_zero_residual_falls_back_to_the_target_without_nan(self):
        draft = torch.tensor([0.6, 0.4, 0.0])
        target = draft * (1 - 1e-4)  # float dust: below the draft everywhere
        residual, fallback = residual_distribution(target, draft, A)
        assert fallback and torch.equal(residual, target)
        assert not torch.isnan(residual).any()

    def test_zero_residual_rejection_is_counted(self):
        draft = probs([0.6, 0.4, 0.0])
        target = torch.cat([draft * (1 - 1e-4), probs([0.0, 0.0, 1.0])])
        # A rejection needs a uniform >= 0.9999: find a seed whose first draw is that large.
        seed = next(
            s
            for s in range(200_000)
            if torch.rand(1, generator=torch.Generator().manual_seed(s), dtype=torch.float64)
            >= 0.9999
        )
        result = verify_stochastic(ids(A), draft, target, torch.Generator().manual_seed(seed))
        assert result.num_accepted == 0 and result.residual_fallback
        assert result.token_ids[0] in (A, B)  # sampled from the target row, never NaN-driven

    def test_a_point_mass_residual_never_falls_back(self):
        # Issue 45.3: with 1 - target[x] <= 1e-6 the residual fell back to the target, so the
        # rejected draft could be emitted again.
        target = probs([1 - 3e-7, 3e-7, 0.0], [0.0, 0.0, 1.0])
        residual, fallback = residual_distribution(target[0], None, A)
        assert not fallback and residual.tolist() == [0.0, 1.0, 0.0]
        # Seed 287721's first uniform is the first from 0 up this large (found by search): it
        # rejects A (u * 1 >= 1 - 3e-7), and the recovered token is B.
        seed = 287721
        assert torch.rand(
            1, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
        ) >= (1 - 3e-7)
        result = verify_stochastic(ids(A), None, target, torch.Generator().manual_seed(seed))
        assert result.num_accepted == 0 and result.token_ids == [B]
        assert not result.residual_fallback

    def test_a_point_mass_with_all_of_the_rows_mass_always_accepts(self):
        # Rounding can leave target[x] under 1 with every other token at 0: the target's
        # distribution is then all on x, and x must never be rejected (the old code rejected
        # it with probability 1 - target[x], then "recovered" x itself from a fallback).
        target = probs([0.99, 0.0, 0.0], [0.0, 0.0, 1.0])
        for seed in range(2000):
            result = verify_stochastic(ids(A), None, target, torch.Generator().manual_seed(seed))
            assert result.token_ids == [A, C]

    def test_shapes_are_checked(self):
        with pytest.raises(AssertionError):
            verify_stochastic(ids(A, B), None, probs([1.0, 0.0]), torch.Generator())


# ---- coupled verification (hand-built) ------------------------------------------------


def test_coupled_accepts_drafts_equal_to_the_targets_race_winners():
    from specdec.sampling import race
    from specdec.verify import verify_coupled

    target_probs = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [0.0, 0.0, 1.0]])
    # Noise chosen by hand: winners are argmax(probs / noise) = 1, 2, 2.
    noise = torch.tensor([[2.0, 1.0, 0.1], [1.0, 1.0, 1.0], [0.5, 0.5, 9.0]], dtype=torch.float64)
    samples = race(target_probs, noise).tolist()
    assert samples == [1, 2, 2]  # the zero-probability token 2 at row 0 never wins
    both = verify_coupled(torch.tensor([1, 2]), samples)
    assert both.token_ids == [1, 2, 2] and both.num_accepted == 2 and both.bonus
    first_only = verify_coupled(torch.tensor([1, 0]), samples)
    assert first_only.token_ids == [1, 2] and first_only.num_accepted == 1
    none = verify_coupled(torch.tensor([0, 2]), samples)
    assert none.token_ids == [1] and not none.bonus
    assert verify_coupled(torch.tensor([], dtype=torch.long), samples[:1]).token_ids == [1]
    with pytest.raises(AssertionError):
        verify_coupled(torch.tensor([1, 2]), samples[:2])


def test_position_noise_is_a_function_of_seed_and_position():
    from specdec.sampling import position_noise

    a = position_noise(7, 3, 50)
    assert torch.equal(a, position_noise(7, 3, 50))
    assert not torch.equal(a, position_noise(7, 4, 50))
    assert not torch.equal(a, position_noise(8, 3, 50))
    assert (a > 0).all() and torch.isfinite(a).all()
    assert torch.equal(position_noise(-1, 0, 10), position_noise(2**64 - 1, 0, 10))


def test_position_noise_uses_every_bit_of_seed_and_position():
    from specdec.sampling import position_noise

    # Issue 45.2: the (seed, position) key went through torch's 32-bit seeding, so these two
    # positions of one sequence had the very same noise at Qwen's vocabulary.
    assert not torch.equal(position_noise(4, 12859, 151936), position_noise(4, 28091, 151936))
    assert not torch.equal(position_noise(9, 0, 64), position_noise(9 + 2**32, 0, 64))
    assert not torch.equal(position_noise(9, 0, 64), position_noise(9, 2**32, 64))
    # Counter-based: the first values of a position's row do not depend on the row's length.
    assert torch.equal(position_noise(3, 5, 151936)[:64], position_noise(3, 5, 64))


def test_no_two_positions_share_noise():
    from specdec.sampling import position_noise

    # A birthday search found a shared pair in 4 of 60 seeds within 32,768 positions on the
    # old code (seed 4: positions 12859 and 28091); rows are told apart by their first values.
    for seed in (4, 5):
        firsts = {tuple(position_noise(seed, p, 2).tolist()) for p in range(32_768)}
        assert len(firsts) == 32_768


def test_a_zero_uniform_never_makes_a_zero_probability_token_win():
    from specdec.sampling import race
    from specdec.verify import verify_coupled

    # Issue 45.4: noise 0 (a uniform of 0) made 0 / 0 = NaN the argmax.
    probs3 = torch.tensor([0.9, 0.1, 0.0])
    zero_noise = torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64)
    assert int(race(probs3, zero_noise)) == 0
    result = verify_coupled(torch.tensor([], dtype=torch.long), [int(race(probs3, zero_noise))])
    assert result.token_ids == [0]


def test_position_noise_is_never_zero_or_infinite():
    from specdec.sampling import position_noise

    noise = torch.cat([position_noise(seed, 0, 151936) for seed in range(20)])
    assert (noise > 0).all() and torch.isfinite(noise).all()
    assert float(noise.min()) >= 2.0**-53  # the smallest uniform, (0 + 0.5) * 2**-52


def test_coupled_verification_races_rows_only_up_to_the_first_differing_draft():
    from specdec.sampling import Sampler, logits_to_probs
    from specdec.verify import verify_coupled

    params = SamplingParams(temperature=0.9, top_p=0.9, seed=5)
    sampler = Sampler(params, coupled=True)
    logits = torch.randn(5, 40, generator=torch.Generator().manual_seed(0)) * 3
    positions = list(range(10, 15))
    rows = zip(logits_to_probs(logits, params), positions, strict=True)
    every = [sampler.race(row, position) for row, position in rows]
    for accepted in range(5):
        drafts = every[:accepted] + [(every[accepted] + 1) % 40] * (4 - accepted)
        samples = sampler.keyed_samples(logits, positions)
        result = verify_coupled(torch.tensor(drafts[:4]), samples)
        assert result.token_ids == every[: accepted + 1]
        assert samples.drawn == accepted + 1  # rows after the first differing draft: not raced
    assert sampler.keyed_samples(logits, positions)[:] == every


def test_coupled_tree_verification_races_only_the_rows_its_path_reaches():
    from specdec.sampling import Sampler, logits_to_probs
    from specdec.verify_tree import verify_tree_coupled

    params = SamplingParams(temperature=0.9, seed=5)
    sampler = Sampler(params, coupled=True)
    logits = torch.randn(6, 40, generator=torch.Generator().manual_seed(1)) * 3
    positions = [10, 11, 12, 11, 12, 13]  # rows' positions: root, then nodes by depth
    rows = zip(logits_to_probs(logits, params), positions, strict=True)
    every = [sampler.race(row, position) for row, position in rows]
    other = lambda token: (token + 1) % 40  # noqa: E731
    # Root's children: node 0 (a chain 0 -> 1) and node 2 (a chain 2 -> 3 -> 4).
    parents = [-1, 0, -1, 2, 3]
    tokens = [other(every[0]), other(every[1]), every[0], every[3], other(every[4])]
    samples = sampler.keyed_samples(logits, positions)
    result = verify_tree_coupled(tokens, parents, samples)
    assert result.token_ids == [every[0], every[3], every[4]]
    assert samples.drawn == 3  # the root's row and the rows of nodes 2 and 3, not 0 and 1
