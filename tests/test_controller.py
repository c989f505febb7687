"""Adaptive k: the cost model's decisions on hand-set estimates, and exactness through the
engine."""

import time
from dataclasses import replace

import numpy as np
import pytest

from helpers import VOCAB, assert_same_distribution, backend, perturbed_copy, tiny_llama
from specdec import Engine, SamplingParams, SpecConfig
from specdec.controller import EXPLORE_EVERY, AdaptiveK, DrafterChoice, FallbackK, Round
from specdec.drafters import ChoiceDrafter, FallbackDrafter, ModelDrafter, PromptLookupDrafter
from specdec.theory import optimal_k


def trained(
    acceptance: float, draft_step: float, pass_seconds: dict[int, float], max_k=8
) -> AdaptiveK:
    controller = AdaptiveK(max_k=max_k)
    controller.position_counts = [[acceptance * 1000, 1000.0] for _ in range(max_k)]
    controller.draft_step_seconds = draft_step
    controller.pass_seconds = dict(pass_seconds)
    return controller


def test_measures_before_it_decides():
    assert AdaptiveK().choose_k() == 4


def test_explores_again_after_rounds_without_drafting():
    controller = trained(0.8, 0.1, {n: 1.0 for n in range(1, 10)})
    controller.position_counts = [[0.0, 30.0] for _ in range(8)]  # everything rejected lately
    assert controller.choose_k() == 0
    for _ in range(40):
        controller.observe(
            Round(k=0, num_accepted=0, confidences=None, draft_seconds=0.0, pass_seconds=1.0)
        )
    assert controller.choose_k() > 0


def test_a_controller_that_stopped_drafting_measures_a_draft_again():
    """Costs measured in a slow moment (a 2-token pass at 67 ms, a draft step at 27 ms) and
    1-token passes at 35 ms since: k = 0 looks best, and rounds without drafts measure only
    the 1-token pass, so without exploring from 0 the stale costs would stand for good
    (seen on the 2-core EPYC with the int4 pair). Every EXPLORE_EVERY rounds it drafts one
    token; once those rounds measure today's costs, drafting wins again."""
    from specdec.controller import EXPLORE_EVERY

    controller = trained(0.8, 0.0275, {1: 0.035, 2: 0.067, 3: 0.073})
    controller.position_counts = [[0.0, 0.0] for _ in range(8)]  # evidence decayed away
    chosen = []
    for _ in range(2 * EXPLORE_EVERY):
        chosen.append(controller.choose_k())
        controller.observe(
            Round(
                k=chosen[-1],
                num_accepted=chosen[-1],
                confidences=None,
                draft_seconds=0.019 * chosen[-1],
                pass_seconds=0.036 if chosen[-1] else 0.035,
            )
        )
        if chosen[-1] == 1 and controller.choose_k() > 0:
            break
    assert chosen[:EXPLORE_EVERY] == [0] * (EXPLORE_EVERY - 1) + [1]
    assert controller.choose_k() > 0  # the measured draft and 2-token pass make drafts pay


def test_matches_the_papers_optimal_k_for_a_memory_bound_target():
    for alpha, c in [(0.9, 0.05), (0.8, 0.1), (0.6, 0.3), (0.3, 0.6)]:
        controller = trained(alpha, c, {n: 1.0 for n in range(1, 10)})
        assert controller.choose_k() == optimal_k(alpha, c, max_k=8), (alpha, c)


def test_a_costly_verify_pass_shortens_k():
    flat = trained(0.85, 0.1, {n: 1.0 for n in range(1, 10)})
    steep = trained(0.85, 0.1, {n: 1.0 + 0.6 * (n - 1) for n in range(1, 10)})
    assert steep.choose_k() < flat.choose_k()


def test_low_confidence_ends_the_draft_early():
    controller = trained(0.8, 0.1, {n: 1.0 for n in range(1, 10)})
    assert controller.keep_going([0.95, 0.9])
    assert not controller.keep_going([0.95, 0.02])


def test_pass_time_is_interpolated_from_measured_sizes():
    controller = trained(0.8, 0.1, {1: 1.0, 5: 2.0})
    assert controller.pass_estimate(3) == pytest.approx(1.5)
    assert controller.pass_estimate(9) == pytest.approx(3.0)


def test_short_passes_are_not_extrapolated_down_a_steep_line():
    """Measured only at 5 and 9 tokens on a convex curve (int4: 46 and 87 ms): a line through
    them put 3 tokens at 25 ms, half a step; below the smallest size, each token saves 5%
    at most, and between sizes the estimate interpolates its neighbours."""
    controller = trained(0.95, 0.0124, {5: 0.046, 9: 0.087})
    assert controller.pass_estimate(3) == pytest.approx(0.046 * 0.9)
    assert controller.pass_estimate(1) == pytest.approx(0.046 * 0.8)
    assert controller.pass_estimate(7) == pytest.approx((0.046 + 0.087) / 2)
    assert controller.pass_estimate(11) == pytest.approx(0.087 + 2 * (0.087 - 0.046) / 4)
    # with these costs and acceptance 0.95, drafting 2-5 tokens beats 1 (the old line chose 1-2)
    assert controller.choose_k() >= 3


def observed(controller: AdaptiveK, k: int, accepted: int, pass_seconds: float) -> None:
    controller.observe(Round(k, accepted, None, draft_seconds=0.0, pass_seconds=pass_seconds))


@pytest.mark.parametrize("trusted_after", [1, 3])
def test_one_slow_pass_does_not_rule_out_its_size(trusted_after):
    """Issue 45.12: prompt lookup (free drafts, copies accepted 95% of the time) met one slow
    4-token pass in its first round (2.8 steps); every size above 2 then looked costly, and
    k stayed at 1 for tens of rounds, a mean accepted length of 1.6 on a copy-heavy reply.
    A size measured fewer than TRUSTED_AFTER times costs at most what the well measured
    sizes predict, so it is tried again, and measured at its real cost."""
    controller = AdaptiveK(max_k=8, trusted_after=trusted_after)
    observed(controller, 3, 0, 0.83)  # the first round: 4 tokens, a slow pass, a miss
    for _ in range(6):  # then no match (k = 0) and single copies, at 0.3 s a pass
        observed(controller, 0, 0, 0.30)
        observed(controller, 1, 1, 0.31)
    chosen = []
    for _ in range(10):  # copies accepted whole; every pass of n tokens costs 0.3 + 0.01 n
        k = controller.choose_k()
        chosen.append(k)
        observed(controller, k, k, 0.30 + 0.01 * (k + 1))
    if trusted_after == 1:  # before issue 45: the one slow pass stood for its size
        assert max(chosen) <= 2
    else:
        assert chosen[0] >= 3 and chosen[-1] == 8, chosen


def test_a_size_measured_slow_again_and_again_is_believed():
    controller = AdaptiveK(max_k=8)
    for _ in range(6):
        observed(controller, 0, 0, 0.30)
        observed(controller, 1, 1, 0.31)
    for _ in range(3):
        observed(controller, 3, 3, 0.90)  # really slow: three observations
    assert controller.pass_estimate(4) == pytest.approx(0.90)
    assert controller.choose_k() <= 2


def test_observe_learns_acceptance_and_costs():
    controller = AdaptiveK(max_k=4, decay=0.9)
    for _ in range(60):
        controller.observe(
            Round(
                k=4,
                num_accepted=1,
                confidences=[0.95, 0.95, 0.95, 0.95],
                draft_seconds=0.4,
                pass_seconds=2.0,
            )
        )
    assert controller.draft_step_seconds == pytest.approx(0.1)
    assert controller.pass_seconds[5] == pytest.approx(2.0)
    assert controller.position_counts[0][0] / controller.position_counts[0][1] == pytest.approx(
        1.0, abs=0.01
    )
    assert controller.position_counts[1][0] / controller.position_counts[1][1] == pytest.approx(
        0.0, abs=0.01
    )
    assert controller.choose_k() == 1


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(seed=10, init=0.3)
    return target, perturbed_copy(target, noise=0.05, seed=11)


def test_auto_k_greedy_equals_plain_and_records_its_choices(pair):
    target, draft = pair
    params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    expected = Engine(backend(target)).generate([1, 2, 3], params)
    engine = Engine(backend(target), ModelDrafter(backend(draft)))
    out = engine.generate([1, 2, 3], params, SpecConfig(k="auto", max_k=6))
    assert out.token_ids == expected.token_ids
    assert sum(out.stats.k_per_round.values()) == out.stats.rounds
    assert max(out.stats.k_per_round) <= 6
    assert engine.controller is not None and engine.controller.pass_seconds


class _Scripted(AdaptiveK):
    """Drafts nothing for ``idle`` rounds, then two tokens a round but for one round more
    without; notes whether each drafted round's drafter had caught up first."""

    idle = 3
    caught_up: list[bool]

    def choose_k(self) -> int:
        return 0 if self.rounds < self.idle or self.rounds == self.idle + 2 else 2

    def observe(self, round_: Round) -> None:
        if round_.k > 0:
            self.caught_up.append(round_.caught_up)
        super().observe(round_)


class _SlowToCatchUp(ModelDrafter):
    """A draft model whose catching up (``prepare``) takes a long while."""

    prepared = 0

    def prepare(self, context) -> None:
        self.prepared += 1
        time.sleep(0.25)
        super().prepare(context)


def test_catching_up_after_rounds_without_drafts_is_not_a_draft_step(pair):
    """A controller that drafted nothing for a few rounds (and so skipped the draft's
    prefill) drafts again: the drafter first catches up on the text, apart. That time is the
    request's drafter time but not the controller's draft step, which would otherwise
    stand at a catch-up's cost and keep k at 0. After a single round without drafts the
    drafter catches up within its first draft pass (no pass more), and that round's draft
    time is left out of the draft step."""
    from specdec.speculation import CATCH_UP_APART

    assert _Scripted.idle < CATCH_UP_APART  # never prepared: far behind all the same
    target, draft = pair
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    expected = Engine(backend(target)).generate([1, 2, 3], params)
    drafter = _SlowToCatchUp(backend(draft))
    controller = _Scripted(max_k=8)
    controller.caught_up = []
    engine = Engine(backend(target), drafter, controller)
    out = engine.generate([1, 2, 3], params, SpecConfig(k="auto"))
    assert out.token_ids == expected.token_ids
    assert drafter.prepared == 1  # not in the prefill (k was 0), once before drafting
    assert out.stats.k_per_round[0] >= _Scripted.idle + 1 and out.stats.drafted_tokens > 0
    assert out.stats.drafter_seconds >= 0.25
    assert controller.draft_step_seconds < 0.1
    assert controller.caught_up[:4] == [False, False, True, False]


@pytest.mark.parametrize("verification", ["rejection", "coupled"])
def test_auto_k_sampling_is_exact(pair, verification):
    """Adaptive k changes how many draws a round makes; every position must still follow
    the target (all three generated tokens counted, the bonus included)."""
    from test_engine_statistical import marginals

    target, draft = pair
    prompt = [3, 1, 4, 1, 5]
    params = SamplingParams(temperature=1.0, max_tokens=3, ignore_eos=True)
    engine = Engine(backend(target), ModelDrafter(backend(draft)))
    counts = sample_counts(engine, prompt, params, verification)
    for position, expected in enumerate(marginals(target, prompt, params)):
        assert_same_distribution(counts[position], expected)


def sample_counts(engine: Engine, prompt, params: SamplingParams, verification: str):
    """Counts of generated tokens 1..3 over 1500 seeded requests with k auto."""
    counts = np.zeros((3, VOCAB))
    spec = SpecConfig(k="auto", max_k=4, verification=verification)
    for seed in range(1500):
        out = engine.generate(prompt, replace(params, seed=seed), spec)
        for position, token_id in enumerate(out.token_ids):
            counts[position, token_id] += 1
    return counts


@pytest.mark.parametrize("value", ["fast", -1, 2.5])
def test_bad_k(value):
    with pytest.raises(ValueError, match="k must be"):
        SpecConfig(k=value)


def test_batch_drafting_keeps_the_faster_choice_per_batch_size_and_explores():
    from specdec.controller import BatchDrafting

    policy = BatchDrafting(explore_every=5, samples=2)
    assert policy.drafting(1) and policy.prefers_drafting(1)  # alone: the run's controller
    measured = []
    for _ in range(4):  # measuring: each way in turn, drafting first
        drafting = policy.drafting(8)
        measured.append(drafting)
        policy.observe(8, drafting, *((24, 0.3) if drafting else (8, 0.075)))  # 80 vs 107 tok/s
    assert measured == [True, False, True, False]
    choices = [policy.drafting(8) for _ in range(10)]
    assert choices.count(True) == 2 and choices.count(False) == 8  # exploring every 5th step
    # drafts did not pay at 8: nor at 12 (a larger batch); a smaller one is measured anew
    assert not policy.prefers_drafting(8) and not policy.prefers_drafting(12)
    assert policy.drafting(12) is False
    assert policy.prefers_drafting(4) and policy.drafting(4) is True
    # drafts paying at 2 says nothing about 3: it is measured both ways
    for _ in range(4):
        policy.observe(2, True, 10, 0.1)  # 100 tok/s
        policy.observe(2, False, 2, 0.04)  # 50 tok/s
    assert policy.prefers_drafting(2)
    ways = []
    for _ in range(2):
        ways.append(policy.drafting(3))
        policy.observe(3, ways[-1], 6, 0.1)
    assert ways == [True, False]
    policy.observe(1, False, tokens=1, seconds=0.03)  # one request: nothing to learn here
    assert (1, False) not in policy.rates


def test_a_batch_size_not_measured_starts_the_way_of_the_nearest_measured_size():
    """8 requests measured faster without drafts: 5-7 start without them (no dear first
    drafting step, every draft catching up) and try them every explore_every steps; 2-4,
    nearer to one request alone (which drafts), are measured drafting first. Once 2 is
    measured faster with drafts, 5 (as near to 2 as to 8) drafts too."""
    from specdec.controller import BatchDrafting

    policy = BatchDrafting(explore_every=5, samples=2)
    for _ in range(2):
        for drafting in (True, False):
            policy.observe(8, drafting, *((24, 0.3) if drafting else (8, 0.075)))
    assert not policy.prefers_drafting(8)
    for n in (5, 6, 7):
        assert not policy.prefers_drafting(n)
        assert [policy.drafting(n) for _ in range(5)] == [False] * 4 + [True], "a try at 5"
    assert [policy.prefers_drafting(n) for n in (2, 3, 4)] == [True] * 3
    assert policy.drafting(3) is True, "measured, drafting first"
    for _ in range(2):
        policy.observe(2, True, 10, 0.1)  # 100 tok/s
        policy.observe(2, False, 2, 0.04)  # 50 tok/s
    assert policy.prefers_drafting(5) and not policy.prefers_drafting(6)
    # a try at a size that started without drafts is judged by that size's own rates,
    # though it is not measured yet: one that wins comes round again as soon, one that
    # loses waits twice as long
    for n, try_rate in ((9, (30, 0.1)), (10, (3, 0.1))):  # 300 and 30 tok/s against 107
        for _ in range(5):
            drafting = policy.drafting(n)
            policy.observe(n, drafting, *(try_rate if drafting else (8, 0.075)))
    assert policy.waits[9] == 5 and policy.waits[10] == 10


def test_batch_drafting_tries_a_losing_way_ever_less_often_and_a_winning_one_again_soon():
    from specdec.controller import BatchDrafting

    policy = BatchDrafting(explore_every=4, explore_most=16, samples=1)
    for drafting in (True, False):  # measured: plain decoding is faster at 8
        assert policy.drafting(8) is drafting
        policy.observe(8, drafting, *((24, 0.3) if drafting else (8, 0.075)))
    tries = []
    for step in range(60):
        drafting = policy.drafting(8)
        if drafting:
            tries.append(step)
        policy.observe(8, drafting, *((24, 0.3) if drafting else (8, 0.075)))  # still slower
    gaps = [later - earlier for earlier, later in zip(tries, tries[1:], strict=False)]
    assert gaps[:3] == [8, 16, 16], "each losing try doubles the wait, up to explore_most"
    # the way tried turns faster (200 tok/s): once its tries make it the preferred way, the
    # wait is back to explore_every (for tries of plain decoding now)
    for _ in range(60):
        drafting = policy.drafting(8)
        policy.observe(8, drafting, *((60, 0.3) if drafting else (8, 0.075)))
        if policy.prefers_drafting(8):
            break
    assert policy.prefers_drafting(8), "drafting measured faster now"
    assert policy.waits[8] == 4


def test_a_slow_pass_does_not_stand_for_its_size_and_deeper_sizes_are_revisited():
    """One slow first 5-token pass (58 ms, cold) among 46 ms ones: the estimate is the
    median of the last COST_WINDOW, 46 ms, not an average pulled up by the outlier; the draft
    step likewise; and every EXPLORE_EVERY rounds k goes one deeper than the estimate's best
    so that a size not chosen lately is measured again."""
    from specdec.controller import COST_WINDOW, EXPLORE_EVERY

    controller = AdaptiveK(max_k=8, decay=0.8)
    for seconds, draft in [(0.058, 0.09), (0.046, 0.05), (0.046, 0.05)]:
        controller.observe(
            Round(k=4, num_accepted=4, confidences=None, draft_seconds=draft, pass_seconds=seconds)
        )
    assert controller.pass_seconds[5] == pytest.approx(0.046)
    assert controller.draft_step_seconds == pytest.approx(0.0125)
    for _ in range(COST_WINDOW):  # the machine really got slower: followed within a window
        controller.observe(
            Round(k=4, num_accepted=4, confidences=None, draft_seconds=0.05, pass_seconds=0.060)
        )
    assert controller.pass_seconds[5] == pytest.approx(0.060)
    trained_controller = trained(0.8, 0.1, {n: 1.0 for n in range(1, 10)})
    best = trained_controller.choose_k()
    assert 0 < best < 8
    chosen = []
    for _ in range(2 * EXPLORE_EVERY):
        chosen.append(trained_controller.choose_k())
        trained_controller.rounds += 1
    assert chosen.count(best + 1) == 2 and chosen.count(best) == 2 * EXPLORE_EVERY - 2


# ---- a choice of drafters ----------------------------------------------------------------


def test_a_choice_measures_every_member_then_keeps_the_faster_and_explores():
    choice = DrafterChoice(["slow", "fast"], max_k=4, warmup=2, explore_every=6)
    chosen = []
    for _ in range(24):
        member = choice.choose()
        assert choice.choose() == member, "the same member until the round is observed"
        chosen.append(member)
        draft_step = 0.3 if member == "slow" else 0.05  # equal acceptance, unequal cost
        k = choice.controllers[member].choose_k()
        choice.observe(member, Round(k, max(k - 1, 0), None, draft_step * k, 1.0))
    assert chosen[:4] == ["slow", "slow", "fast", "fast"]  # warm-up: each in turn
    assert chosen[4:] == ["slow" if r % 6 == 5 else "fast" for r in range(4, 24)]
    assert choice.expected_rate("fast") > choice.expected_rate("slow")
    # The target's pass costs are one table for all members.
    assert choice.controllers["slow"].pass_seconds is choice.controllers["fast"].pass_seconds


def test_a_choice_follows_a_change_of_text():
    """A member that falls behind (its drafts stop being accepted) loses the rounds."""
    choice = DrafterChoice(["a", "b"], max_k=4, warmup=1, explore_every=4)
    for _ in range(12):
        member = choice.choose()
        k = choice.controllers[member].choose_k()
        choice.observe(member, Round(k, k if member == "a" else 0, None, 0.05 * k, 1.0))
    assert choice.choose() == "a"
    for _ in range(16):
        member = choice.choose()
        k = choice.controllers[member].choose_k()
        choice.observe(member, Round(k, 0 if member == "a" else k, None, 0.05 * k, 1.0))
    assert choice.choose() == "b"


def test_a_switch_costs_nothing_as_a_draft_step():
    """A member's first draft after another's caught up on the text: its time is left out
    of the member's draft cost once there is one (the first one measured counts)."""
    choice = DrafterChoice(["model", "eagle"], max_k=4)
    model = choice.controllers["model"]
    choice.observe("model", Round(4, 2, None, 4.0, 1.0, caught_up=True))  # no cost yet: counted
    choice.observe("model", Round(4, 2, None, 0.4, 1.0))
    assert model.draft_step_seconds == pytest.approx((1.0 + 0.1) / 2)
    choice.observe("model", Round(4, 2, None, 40.0, 1.0, caught_up=True))  # a catch-up: left out
    assert model.draft_step_seconds == pytest.approx((1.0 + 0.1) / 2)
    assert model.rounds == 3 and choice.rounds == 3  # its acceptance still counts


def test_a_choice_needs_two_distinct_members():
    with pytest.raises(ValueError, match="two or more distinct"):
        DrafterChoice(["model"])
    with pytest.raises(ValueError, match="two or more distinct"):
        DrafterChoice(["model", "model"])


def choice_engine(target, members) -> Engine:
    return Engine(backend(target), ChoiceDrafter(members))


def test_a_choice_greedy_equals_plain_and_each_member_drafts(pair):
    target, draft = pair
    worse = perturbed_copy(target, noise=0.3, seed=12)
    params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    for prompt in ([1, 2, 3], [5, 9, 5, 9, 5, 9, 5], [(3 * i) % 29 + 1 for i in range(30)]):
        expected = Engine(backend(target)).generate(prompt, params)
        engine = choice_engine(
            target,
            {
                "model": ModelDrafter(backend(draft)),
                "worse": ModelDrafter(backend(worse)),
                "lookup": PromptLookupDrafter(),
            },
        )
        out = engine.generate(prompt, params, SpecConfig(k="auto", max_k=6))
        assert out.token_ids == expected.token_ids
        assert isinstance(engine.controller, DrafterChoice)
        assert all(c.rounds >= 2 for c in engine.controller.controllers.values())


def test_a_choice_needs_k_auto(pair):
    target, draft = pair
    engine = choice_engine(
        target, {"model": ModelDrafter(backend(draft)), "lookup": PromptLookupDrafter()}
    )
    with pytest.raises(ValueError, match="use k=auto"):
        engine.generate([1, 2, 3], SamplingParams(max_tokens=4), SpecConfig(k=3))


@pytest.mark.parametrize("verification", ["rejection", "coupled"])
def test_a_choice_samples_exactly(pair, verification):
    """Rounds drafted by different members (each its own q; one a point mass) in one
    request: every generated position still follows the target."""
    from test_engine_statistical import marginals

    target, draft = pair
    worse = perturbed_copy(target, noise=0.3, seed=12)
    prompt = [3, 1, 4, 1, 5]
    params = SamplingParams(temperature=1.0, max_tokens=3, ignore_eos=True)
    engine = choice_engine(
        target,
        {
            "model": ModelDrafter(backend(draft)),
            "worse": ModelDrafter(backend(worse)),
            "lookup": PromptLookupDrafter(min_ngram=1),
        },
    )
    counts = sample_counts(engine, prompt, params, verification)
    assert isinstance(engine.controller, DrafterChoice)
    assert all(c.rounds >= 20 for c in engine.controller.controllers.values())
    for position, expected in enumerate(marginals(target, prompt, params)):
        assert_same_distribution(counts[position], expected)


# ---- a fallback chain (lookup+eagle): each member its own k ----


def run_chain(chain: FallbackK, rounds: int, accepted_by: dict) -> list[tuple[str | None, int]]:
    """Rounds of a two-member chain whose front member always has a proposal: who drafted,
    at what k. ``accepted_by[member](k)``: how many of its k drafts the target accepts."""
    drafted: list[tuple[str | None, int]] = []
    for _ in range(rounds):
        member, k = None, 0
        for name in chain.members:
            k = chain.member_k(name)
            if k > 0:
                member = name
                break
        draft_step = 0.0 if member == "lookup" else 0.05  # a copy costs nothing
        pass_seconds = 1.0 + 0.05 * k
        accepted = accepted_by[member](k) if member else 0
        chain.observe(member, Round(k, accepted, None, draft_step * k, pass_seconds))
        drafted.append((member, k))
    return drafted


def test_a_chain_copies_deep_where_copies_are_accepted_and_its_model_keeps_its_own_k():
    chain = FallbackK(["lookup", "eagle"], max_k=8)
    assert chain.controllers["lookup"].pass_seconds is chain.controllers["eagle"].pass_seconds
    drafted = run_chain(chain, 40, {"lookup": lambda k: k, "eagle": lambda k: k // 2})
    assert drafted[-1] == ("lookup", 8)  # free, always accepted: as deep as allowed
    assert drafted[0][0] == "eagle"  # the member behind is measured first, then left be
    assert all(member == "lookup" for member, _ in drafted[1:])
    # EAGLE's estimate is its own: copies accepted in full do not deepen it
    chain.observe("eagle", Round(2, 1, None, 0.1, 1.1))
    lookup, eagle = chain.controllers["lookup"], chain.controllers["eagle"]
    assert eagle.rounds == 2 and min(lookup.position_rates()) > 0.9
    assert eagle.position_rates()[1] < lookup.position_rates()[1] - 0.2


def test_a_chain_leaves_rounds_behind_where_copies_fail_and_still_measures_them():
    chain = FallbackK(["lookup", "eagle"], max_k=8)
    drafted = run_chain(chain, 160, {"lookup": lambda k: 0, "eagle": lambda k: k})
    late = [member for member, _ in drafted[32:]]
    assert late.count("eagle") >= len(late) - len(late) // EXPLORE_EVERY - 1
    assert late.count("lookup") >= 2  # explored now and then
    assert chain.controllers["eagle"].choose_k() == 8


def test_a_chain_round_without_drafts_is_its_last_members():
    chain = FallbackK(["lookup", "eagle"], max_k=4)
    chain.observe(None, Round(0, 0, None, 0.0, 1.0))
    chain.observe("lookup", Round(0, 0, None, 0.0, 1.0))
    assert chain.controllers["eagle"].rounds == 2 and chain.controllers["lookup"].rounds == 0
    with pytest.raises(ValueError, match="distinct"):
        FallbackK(["lookup", "lookup"])


def chain_engine(target, draft) -> Engine:
    return Engine(
        backend(target),
        FallbackDrafter([PromptLookupDrafter(min_ngram=1), ModelDrafter(backend(draft))]),
    )


def test_a_chain_greedy_equals_plain_and_each_member_drafts(pair):
    target, draft = pair
    params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    engine = chain_engine(target, draft)
    for prompt in ([1, 2, 3], [5, 9, 5, 9, 5, 9, 5], [(3 * i) % 29 + 1 for i in range(30)]):
        expected = Engine(backend(target)).generate(prompt, params)
        out = engine.generate(prompt, params, SpecConfig(k="auto", max_k=6))
        assert out.token_ids == expected.token_ids
    assert isinstance(engine.controller, FallbackK)
    assert all(c.rounds >= 2 for c in engine.controller.controllers.values())


def test_a_nested_chain_learns_under_its_members_names(pair):
    """A chain inside a chain: the outer chain's k policy knows the inner one by its name
    (``lookup+model``), though its proposals name the inner member that drafted."""
    target, draft = pair
    inner = FallbackDrafter([PromptLookupDrafter(min_ngram=1), ModelDrafter(backend(draft))])
    worse = ModelDrafter(backend(perturbed_copy(target, noise=0.3, seed=12)))
    worse.name = "worse"
    engine = Engine(backend(target), FallbackDrafter([inner, worse]))
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    prompt = [5, 9, 5, 9, 5, 9, 5]
    out = engine.generate(prompt, params, SpecConfig(k="auto", max_k=4))
    assert out.token_ids == Engine(backend(target)).generate(prompt, params).token_ids
    assert isinstance(engine.controller, FallbackK)
    assert engine.controller.members == ["lookup+model", "worse"]
    assert engine.controller.controllers["lookup+model"].rounds > 0


@pytest.mark.parametrize("verification", ["rejection", "coupled"])
def test_a_chain_samples_exactly(pair, verification, monkeypatch):
    """Rounds drafted by either member, each at its own k, one a point mass: every
    generated position still follows the target. The costs the k policies see come from a
    seeded modelled clock: on the real clock the tiny models' timings decided how often prompt
    lookup drafted (12-36 rounds of 4,360 here, under the 20 this test needs about half the
    time), so the test depended on the machine's load."""
    from test_engine_statistical import marginals
    from test_reproducible import erratic_clock

    clock = erratic_clock(0)
    monkeypatch.setattr("specdec.engine.time", clock)
    monkeypatch.setattr("specdec.speculation.time", clock)
    target, draft = pair
    prompt = [3, 1, 4, 3, 1, 4, 3, 1]
    params = SamplingParams(temperature=1.0, max_tokens=3, ignore_eos=True)
    engine = chain_engine(target, draft)
    counts = sample_counts(engine, prompt, params, verification)
    assert isinstance(engine.controller, FallbackK)
    assert all(c.rounds >= 20 for c in engine.controller.controllers.values())
    for position, expected in enumerate(marginals(target, prompt, params)):
        assert_same_distribution(counts[position], expected)


def test_a_round_that_explores_drafts_to_its_depth_whatever_the_confidence():
    """A 3-token pass once measured slow makes every first draft stop the round (keep_going
    says no), and a round that explores one size deeper must still reach it, or that size is
    never measured again (seen in specdec bench on the family 26 EPYC: k auto at 1 draft a
    round for hundreds of rounds of code whose drafts were accepted 97% of the time, where a
    fixed k = 3 ran 1.05-1.15x faster)."""
    controller = trained(0.9, 0.010, {1: 0.025, 2: 0.027, 3: 0.080})
    assert controller.choose_k() == 1 and not controller.keep_going([0.6])
    while controller.rounds % EXPLORE_EVERY != EXPLORE_EVERY - 1:
        controller.observe(Round(1, 1, [0.6], 0.010, 0.027))
    assert controller.choose_k() == 2
    assert controller.keep_going([0.6]), "the exploring round drafts its second token"
    assert not controller.keep_going([0.6, 0.6])
    controller.observe(Round(2, 2, [0.6, 0.6], 0.020, 0.029))
    assert controller.choose_k() >= 2, "today's 3-token pass, measured, makes deeper drafts pay"
    assert controller.keep_going([0.6])


def test_a_bump_in_the_measured_costs_does_not_stop_every_round_before_it():
    """The Zen 4 EPYC's table in the middle of an edit (ms): a 3-token pass measured slow
    between a cheap 2-token and a 6-token pass, drafts accepted 95% of the time. The best
    round drafts 5; a look one draft ahead (2 drafts cost more a token than 1) stopped every
    round at its first draft, confident or not, and the 3-token pass was never measured
    again. Deeper drafts must go on until no depth promises more."""
    table = {1: 30.5, 2: 27.5, 3: 38.4, 4: 38.4, 5: 46.3, 6: 46.4, 7: 52.6, 8: 58.7, 9: 66.6}
    controller = trained(0.95, 0.0092, {n: ms / 1000 for n, ms in table.items()})
    assert controller.choose_k() == 5
    assert controller.keep_going([1.0]), "the round's best depth lies past the bump"
    assert controller.keep_going([1.0, 1.0, 1.0, 1.0])
    assert not controller.keep_going([1.0, 1.0, 1.0, 1.0, 1.0]), "past the best depth"
    assert not controller.keep_going([1.0, 0.02]), "an unlikely draft still ends the round"


def _rounds(controller, rounds: int, batch: int, table: dict[int, tuple[float, float]]) -> None:
    """``rounds`` rounds of each k in ``table`` (k -> draft step, pass seconds), all drafts
    accepted, scored alone (``batch`` 1) or with ``batch`` - 1 other requests."""
    for _ in range(rounds):
        for k, (step, seconds) in table.items():
            controller.observe(Round(k, k, None, step * k, seconds, batch=batch))


# A request alone (Zen 4 EPYC, int4 pair: a 6.9 ms draft step, 1 row 23.6 ms, 6 rows 43.9)
# and its shares of 8-request batched passes (2.8 ms a draft, 2-4 rows at 15.5-24.9 ms):
# bench/results/2026-12-06-batch-costs-zen4-epyc-avx512.
ALONE = {0: (0.0069, 0.0236), 5: (0.0069, 0.0439), 8: (0.0069, 0.0546)}
IN_A_BATCH = {1: (0.0028, 0.0155), 2: (0.0028, 0.0194), 3: (0.0028, 0.0249)}


def test_costs_in_a_batch_do_not_stand_for_a_request_alone():
    """A burst of batched rounds, then one round alone: the request alone decides on what
    rounds alone cost (the same table, draft step and k as a controller that never saw the
    batch); back in a batch, on what batched rounds cost."""
    seen_batch, alone_only = AdaptiveK(max_k=8), AdaptiveK(max_k=8)
    for controller, bursts in ((seen_batch, True), (alone_only, False)):
        _rounds(controller, 4, 1, ALONE)
        if bursts:
            _rounds(controller, 6, 8, IN_A_BATCH)
        _rounds(controller, 1, 1, {5: ALONE[5]})
        controller.position_counts = [[950.0, 1000.0] for _ in range(8)]  # the same acceptance
        controller.rounds = 0  # no exploring round
    assert seen_batch.pass_seconds == alone_only.pass_seconds
    assert seen_batch.draft_step_seconds == pytest.approx(alone_only.draft_step_seconds)
    assert seen_batch.choose_k() == alone_only.choose_k() >= 5
    _rounds(seen_batch, 1, 8, {2: IN_A_BATCH[2]})
    assert sorted(seen_batch.pass_seconds) == [2, 3, 4]  # rows of the batched rounds only
    assert seen_batch.draft_step_seconds == pytest.approx(0.0028)


def test_every_member_of_a_chain_decides_for_the_setting_of_the_last_round():
    """A chain's members share one table alone and one in a batch, and all read the one of
    the last round, whichever member drafted it: their rates are compared."""
    chain = FallbackK(["lookup", "model"], max_k=8)
    chain.observe("model", Round(3, 3, None, 0.02, 0.030))
    chain.observe("model", Round(2, 2, None, 0.006, 0.019, batch=8))
    lookup, model = chain.controllers["lookup"], chain.controllers["model"]
    assert lookup.in_batch and model.in_batch
    assert lookup.pass_seconds is model.pass_seconds and list(model.pass_seconds) == [3]
    chain.observe("lookup", Round(4, 4, None, 0.0, 0.032))
    assert not model.in_batch and model.pass_seconds == {4: 0.030, 5: 0.032}
    assert model.draft_step_seconds == pytest.approx(0.02 / 3)
