"""Choosing k each round from measured acceptance and cost (the paper's section 4, online).

One model decides both how deep to draft and when to stop early: a round's expected token
rate is E[tokens] / time, where E[tokens] = 1 + sum_j P(drafts 1..j accepted) and
time = j * draft_step + target_pass(j + 1). Before drafting, ``max_k`` picks the j that
maximises it from per-position acceptance. While drafting, ``keep_going`` sees the draft's
confidence in each token it just drafted, turns it into an acceptance probability
(calibrated online by confidence bucket), and stops as soon as no deeper round promises a
higher expected rate: a low-confidence draft ends the round. No separate threshold knob.

All evidence decays (``decay`` per round), so the controller follows a change of text, and
each rate also holds one undecaying pseudo-observation of an optimistic prior: after rounds
without drafting, the estimate drifts back up and the controller tries drafting again rather
than staying stuck on one unlucky round. Costs are medians of the last few observations
(``COST_WINDOW``), per pass size and for the draft step: one slow pass (a cold first one, or
one that met another process's threads) does not stand for its size. The same optimism
holds for costs: a pass size measured fewer than ``TRUSTED_AFTER`` times costs no more than
the sizes measured well predict, so that it is tried and measured again instead of being
ruled out by one slow observation (seen: a first 4-token pass measured at 2.8 steps kept
prompt lookup at k = 1 for 45 rounds of a copy-heavy reply, its copies accepted 95% of the
time: ``bench/lookup_policy.py``). And every
``EXPLORE_EVERY`` rounds the controller drafts one token deeper than it would, so the cost and
acceptance of the next size stay measured. That holds from k = 0 too: a controller that has
stopped drafting measures a round of one draft now and then, for costs measured in a slow
moment would otherwise keep it from drafting for good (seen on the 2-core EPYC: a 2-token
pass measured at 67 ms while the machine was busy, 1-token passes at 31-45 ms since, and an
int4 pair whose drafts were accepted 95% of the time decoded plainly from then on).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field, replace

from specdec.theory import expected_tokens_per_round_by_position
from specdec.tree import choose_copy, choose_siblings

BUCKETS = 10
POSITION_PRIOR = 0.8  # optimistic: acceptance of a same-family draft model
PRIOR_WEIGHT = 1.0  # pseudo-observations of the prior, never decayed
EXPLORE_EVERY = 16  # rounds between drafts one token deeper than the best estimate
COST_WINDOW = 5  # observations a cost estimate is the median of
TRUSTED_AFTER = 3  # observations before a pass size's own cost is believed over its neighbours'
# A guide's first guess where the draft parts from it, accepted once that depth is reached:
# taken in 7 of the 26 rounds that hung one, over 20 prompts of the bench's four workloads (0
# of 8 on code, 5 of 12 on edits; reached or not, so a little under the chance once reached:
# bench/results/2026-12-06-tree-copy-zen4-epyc-avx512).
COPY_PRIOR = 0.27


@dataclass(frozen=True)
class Round:
    """One verified round as a k controller learns from it: the tokens drafted (``k``), how
    many the target accepted, the drafter's confidence in each (None: it gives none), the
    seconds drafting took and the seconds of the target's pass. ``caught_up``: the drafter
    first caught up on text it had not seen (it did not draft the round before), so its time
    stands for a draft step only while none is known."""

    k: int
    num_accepted: int
    confidences: list[float] | None
    draft_seconds: float
    pass_seconds: float
    caught_up: bool = False
    rows: int | None = None  # rows the target's pass scored (None: k + 1, a chain's)
    batch: int = 1  # requests the pass scored together (continuous batching: ``Costs``)
    # A tree's branch of a guide's guesses (``Proposal.copied``): the depth it hung at, its
    # guesses verified, how many of them were accepted. None: the round had none.
    copy: tuple[int, int, int] | None = None


@dataclass
class Costs:
    """What a draft step and the target's passes cost, by pass size, as measured in one
    setting: a request alone, or in a batched pass with others (``AdaptiveK``)."""

    draft_history: deque = field(default_factory=lambda: deque(maxlen=COST_WINDOW))
    draft_step_seconds: float | None = None
    pass_seconds: dict[int, float] = field(default_factory=dict)  # block size -> seconds
    pass_history: dict[int, deque] = field(default_factory=dict)  # block size -> recent seconds


def _ema(old: float | None, new: float, weight: float) -> float:
    return new if old is None else (1.0 - weight) * old + weight * new


@dataclass
class AdaptiveK:
    max_k: int = 8
    decay: float = 0.8
    # Decayed (accepted, reached) pseudo-counts: per draft position, and per confidence bucket.
    position_counts: list[list[float]] = field(default_factory=list)
    bucket_counts: list[list[float]] = field(default_factory=list)
    # A tree's branches of guide guesses (``Round.copy``), per guess: decayed once a round
    # that had one, as such rounds are few.
    copy_counts: list[list[float]] = field(default_factory=list)
    # Costs alone and in a batch, kept apart: in a batched pass a request is charged its
    # share of the pass and of the lockstep draft passes (``engine.step_together``), a
    # fraction of what the same sizes cost it alone. In one table, a request alone after a
    # burst read the burst's shares beside its own costs and drafted too little until they
    # aged out (``bench/results/2026-12-06-batch-costs-zen4-epyc-avx512``). Decisions read
    # the table of the setting of the last round observed (``in_batch``).
    solo: Costs = field(default_factory=Costs)
    batched: Costs = field(default_factory=Costs)
    in_batch: bool = False
    rounds: int = 0
    trusted_after: int = TRUSTED_AFTER  # 1: every measured size's own median (no optimism)
    exploring: int = 0  # this round's depth when it explores one deeper (choose_k), else 0

    def __post_init__(self) -> None:
        self.position_counts = self.position_counts or [[0.0, 0.0] for _ in range(self.max_k)]
        # Buckets' prior (in _rate): a calibrated drafter, acceptance = its confidence.
        self.bucket_counts = self.bucket_counts or [[0.0, 0.0] for _ in range(BUCKETS)]
        self.copy_counts = self.copy_counts or [[0.0, 0.0] for _ in range(self.max_k)]

    # ---- costs, in the setting decisions are made for ----------------------------------

    @property
    def costs(self) -> Costs:
        return self.batched if self.in_batch else self.solo

    @property
    def pass_seconds(self) -> dict[int, float]:
        return self.costs.pass_seconds

    @pass_seconds.setter
    def pass_seconds(self, table: dict[int, float]) -> None:
        self.costs.pass_seconds = table

    @property
    def pass_history(self) -> dict[int, deque]:
        return self.costs.pass_history

    @property
    def draft_step_seconds(self) -> float | None:
        return self.costs.draft_step_seconds

    @draft_step_seconds.setter
    def draft_step_seconds(self, seconds: float | None) -> None:
        self.costs.draft_step_seconds = seconds

    # ---- decisions ----------------------------------------------------------------

    def choose_k(self) -> int:
        """The draft depth that maximises the expected token rate (at most ``max_k``)."""
        rates = self.rates()
        if rates is None:
            return min(4, self.max_k)  # measure first
        best = max(range(len(rates)), key=lambda k: (rates[k], -k))
        self.exploring = 0
        if best < self.max_k and self.rounds % EXPLORE_EVERY == EXPLORE_EVERY - 1:
            self.exploring = best + 1  # keep_going lets the round reach it
            return best + 1
        return best

    def rates(self) -> list[float] | None:
        """The expected token rate (tokens/second) of a round drafting k = 0..max_k, from
        what was measured; None before a draft step and a pass are."""
        if self.draft_step_seconds is None or not self.pass_seconds:
            return None
        acceptance = self.position_rates()
        return [
            expected_tokens_per_round_by_position(acceptance, k) / self.round_seconds(k)
            for k in range(self.max_k + 1)
        ]

    def keep_going(self, confidences: list[float]) -> bool:
        """After drafting ``len(confidences)`` tokens: does a deeper round promise a higher
        expected rate than stopping here? Every depth up to ``max_k`` is weighed, not only
        the next: where the measured costs are not convex (one pass size measured slow, a
        bump between two cheap ones), a one-step look stops every round before the bump,
        so the size behind it is never measured again, whatever ``choose_k`` asks for
        (``bench/results/2026-12-06-keep-going-zen4-epyc-avx512``)."""
        n = len(confidences)
        if n >= self.max_k:
            return False
        if self.draft_step_seconds is None or not self.pass_seconds or n < self.exploring:
            return True  # measuring first, or a round exploring one size deeper
        # the drafted tokens' calibrated acceptance, then the positions' rates (as choose_k)
        acceptance = [self.acceptance_at(c) for c in confidences] + self.position_rates()[n:]

        def rate(depth: int) -> float:
            expected = expected_tokens_per_round_by_position(acceptance, depth)
            return expected / self.round_seconds(depth)

        here = rate(n)
        return any(rate(depth) > here for depth in range(n + 1, self.max_k + 1))

    def siblings(self, confidences: list[float], second_confidences: list[float]) -> list[int]:
        """The depths at which a draft tree gets the draft's second choice as a leaf
        (``tree.choose_siblings``): the chain's acceptance from its confidences, a leaf's
        from the chance that the chain's node is rejected times the calibrated acceptance of
        the runner-up's probability once the first choice is ruled out; costs as measured.
        No leaf before costs are measured."""
        if self.draft_step_seconds is None or not self.pass_seconds:
            return []
        acceptance = [self.acceptance_at(c) for c in confidences]
        leaves = [
            (1.0 - a) * self.acceptance_at(s)
            for a, s in zip(acceptance, second_confidences, strict=True)
        ]
        draft = len(confidences) * self.draft_step_seconds
        return choose_siblings(acceptance, leaves, draft, self.pass_estimate)

    def copy_length(self, confidences: list[float], rows: int, at: int, length: int) -> int:
        """How many of a guide's ``length`` guesses a tree verifies as a branch at depth
        ``at`` (``tree.choose_copy``), beside ``rows`` rows: the chain's acceptance from its
        confidences, the guesses' as measured in the rounds that had such a branch; costs
        as measured. None of them (0) before costs are measured."""
        if self.draft_step_seconds is None or not self.pass_seconds:
            return 0
        acceptance = [self.acceptance_at(c) for c in confidences]
        draft = len(confidences) * self.draft_step_seconds
        copy = self.copy_rates()[:length]
        return choose_copy(acceptance, at, copy, rows, draft, self.pass_estimate)

    def copy_rates(self) -> list[float]:
        """P(a branch's guess i is accepted | its depth reached and the guesses before it
        accepted): each guess borrows the estimate of the one before it as its prior."""
        return _chained_rates(self.copy_counts, COPY_PRIOR)

    def tree_nodes(self, paths: list[list[float]], passes: int) -> int:
        """How many nodes of a deep tree the target verifies (``tree.likeliest_first``):
        ``paths`` holds each node's path confidences, likeliest node first, ancestors before
        descendants; ``passes`` the draft passes it took. The count whose round has the
        highest expected token rate: a node is accepted with the product of the calibrated
        acceptance of its path's confidences (EAGLE-2's value, calibrated), rows cost as
        measured. Before costs are measured: as many as a chain of the depth would hold."""
        if self.draft_step_seconds is None or not self.pass_seconds:
            return min(len(paths), max(len(path) for path in paths))
        draft = max(passes, 1) * self.draft_step_seconds
        expected, best, best_rate = 1.0, 1, 0.0
        for count, path in enumerate(paths, start=1):
            value = 1.0
            for confidence in path:
                value *= self.acceptance_at(confidence)
            expected += value
            rate = expected / (draft + self.pass_estimate(count + 1))
            if rate > best_rate:
                best, best_rate = count, rate
        return best

    def position_rates(self) -> list[float]:
        """Acceptance per draft position. A position seldom reached borrows the estimate of
        the one before it as its prior: deep positions look like the last measured one."""
        return _chained_rates(self.position_counts, POSITION_PRIOR)

    def acceptance_at(self, confidence: float) -> float:
        bucket = _bucket(confidence)
        return _rate(self.bucket_counts[bucket], (bucket + 0.5) / BUCKETS)

    def round_seconds(self, k: int) -> float:
        return k * (self.draft_step_seconds or 0.0) + self.pass_estimate(k + 1)

    def pass_estimate(self, n: int) -> float:
        """Target pass time for n tokens: its own measurement where that is trusted (enough
        observations), no more than what the trusted sizes predict where it is not, and
        that prediction where n is unmeasured (``_interpolated``)."""
        trusted = {
            size: seconds
            for size, seconds in self.pass_seconds.items()
            if len(self.pass_history.get(size, ())) >= self.trusted_after
            or size not in self.pass_history  # given, not measured here
        }
        if n in trusted:
            return trusted[n]
        if not trusted:
            return _interpolated(self.pass_seconds, n)
        predicted = _interpolated(trusted, n)
        own = self.pass_seconds.get(n)
        return predicted if own is None else min(own, predicted)

    # ---- learning -----------------------------------------------------------------

    def observe(self, round_: Round) -> None:
        """Update from one round: what was drafted, what survived, what it cost."""
        k, num_accepted, confidences = round_.k, round_.num_accepted, round_.confidences
        self.rounds += 1
        self.in_batch = round_.batch > 1
        costs = self.costs
        if k > 0 and not (round_.caught_up and costs.draft_step_seconds is not None):
            costs.draft_history.append(round_.draft_seconds / k)
            costs.draft_step_seconds = statistics.median(costs.draft_history)
        rows = round_.rows or k + 1
        history = costs.pass_history.setdefault(rows, deque(maxlen=COST_WINDOW))
        history.append(round_.pass_seconds)
        costs.pass_seconds[rows] = statistics.median(history)
        _decay(self.position_counts + self.bucket_counts, self.decay)
        for position in range(min(k, num_accepted + 1)):  # positions the verifier reached
            accepted = float(position < num_accepted)
            self.position_counts[position][0] += accepted
            self.position_counts[position][1] += 1.0
            if confidences is not None and position < len(confidences):
                bucket = self.bucket_counts[_bucket(confidences[position])]
                bucket[0] += accepted
                bucket[1] += 1.0
        if round_.copy is not None and num_accepted >= round_.copy[0]:  # the branch reached
            _, length, taken = round_.copy
            _decay(self.copy_counts, self.decay)
            for guess in range(min(length, taken + 1, len(self.copy_counts))):
                self.copy_counts[guess][0] += float(guess < taken)
                self.copy_counts[guess][1] += 1.0


@dataclass
class DrafterChoice:
    """Which of several drafters drafts a round (``--drafter model/eagle``), chosen as k
    is: from measured rounds. Each member keeps its own ``AdaptiveK`` (its acceptance, its
    draft cost, its k); the target's pass costs are one table shared by all. A round goes
    to the member whose best k promises the highest token rate; every member first drafts
    ``warmup`` rounds in turn, and every ``explore_every``-th round goes to another member,
    so that an estimate left behind by a change of text is measured again.

    Why: which drafter is fastest depends on the text (on the 2-core EPYC, EAGLE heads ran
    ahead of the 0.5B draft model on chat and level or behind on code), so no one choice
    made before a request is right for all. A member that has not drafted for a while
    catches up on the text in its next draft (a draft model feeds the tokens accepted
    since); that catching up is a cost of switching, not of drafting, so it is left out of
    the member's draft cost (``Round.caught_up``). Warm-up gives each
    member ``warmup`` consecutive rounds for the same reason."""

    members: list[str]
    max_k: int = 8
    warmup: int = 2
    explore_every: int = 12
    controllers: dict[str, AdaptiveK] = field(default_factory=dict)
    rounds: int = 0

    def __post_init__(self) -> None:
        if len(self.members) < 2 or len(set(self.members)) != len(self.members):
            raise ValueError(f"a choice needs two or more distinct drafters, got {self.members}")
        self.controllers = self.controllers or _member_controllers(self.members, self.max_k)

    def choose(self) -> str:
        """The member that drafts this round (the same until ``observe``)."""
        count = len(self.members)
        if self.rounds < self.warmup * count:
            return self.members[self.rounds // self.warmup]
        best = max(self.members, key=self.expected_rate)
        if self.rounds % self.explore_every == self.explore_every - 1:
            others = [name for name in self.members if name != best]
            return others[(self.rounds // self.explore_every) % len(others)]
        return best

    def expected_rate(self, member: str) -> float:
        """A member's expected token rate at its best k (0 before it is measured)."""
        rates = self.controllers[member].rates()
        return max(rates) if rates is not None else 0.0

    def choose_k(self) -> int:
        return self.controllers[self.choose()].choose_k()

    def observe(self, member: str, round_: Round) -> None:
        """A round ``member`` drafted (named by the caller: with many requests sharing this
        choice, another may have chosen since); ``round_.caught_up``: the request's previous
        round was another member's, or drafted nothing."""
        self.rounds += 1
        _set_setting(self.controllers, round_)
        self.controllers[member].observe(round_)


@dataclass
class FallbackK:
    """k for a fallback chain (``lookup+eagle``: the first member with a proposal drafts).
    Each member keeps its own ``AdaptiveK`` (its acceptance, its draft cost, its k); the
    target's pass costs are one table shared by all. A member drafts, when it has a
    proposal, at its own best k, if its expected token rate there is at least that of every
    member behind it (so a copy from the prompt is taken where copies have paid); else it
    leaves the round to them, and every ``EXPLORE_EVERY``-th round it left drafts anyway, so
    its estimate stays measured.

    Why: one controller for the whole chain mixed what its members do. Prompt lookup's
    drafts cost nothing and are accepted in long runs where the reply copies the prompt,
    EAGLE's cost a head step and are accepted one or two at a time; mixed, the chain drafted
    EAGLE deeper than EAGLE alone did on chat (k = 2 against 1, on the 2-core EPYC) and cut
    lookup's long copies to EAGLE's k (docs/notes/heads.md, "Prompt lookup in front")."""

    members: list[str]
    max_k: int = 8
    controllers: dict[str, AdaptiveK] = field(default_factory=dict)
    declined: dict[str, int] = field(default_factory=dict)  # rounds left to those behind

    def __post_init__(self) -> None:
        if not self.members or len(set(self.members)) != len(self.members):
            raise ValueError(f"a fallback chain needs distinct drafters, got {self.members}")
        self.controllers = self.controllers or _member_controllers(self.members, self.max_k)
        self.declined = self.declined or dict.fromkeys(self.members, 0)

    def choose_k(self) -> int:
        """The most any member would draft this round (0: none would)."""
        return max(controller.choose_k() for controller in self.controllers.values())

    def member_k(self, member: str) -> int:
        """How many tokens ``member`` drafts, when asked in turn (0: leave the round to the
        members behind it). Counts a round left to them."""
        k = self.controllers[member].choose_k()
        behind = self.members[self.members.index(member) + 1 :]
        if not behind:
            return k
        if k > 0 and self._pays(member, behind):
            return k
        self.declined[member] += 1
        return max(k, 1) if self.declined[member] % EXPLORE_EVERY == 0 else 0

    def _pays(self, member: str, behind: list[str]) -> bool:
        """Whether ``member``'s best expected rate is at least every one behind it. Measure
        first: the members behind it (else a front member that always has a proposal would
        keep them unmeasured), then it."""
        others = [self.controllers[name].rates() for name in behind]
        if any(rates is None for rates in others):
            return False
        own = self.controllers[member].rates()
        if own is None:
            return True
        return max(own) >= max(max(rates) for rates in others if rates is not None)

    def keep_going(self, member: str, confidences: list[float]) -> bool:
        return self.controllers[member].keep_going(confidences)

    def observe(self, member: str | None, round_: Round) -> None:
        """A round ``member`` drafted; a round without drafts (``member`` None, or k = 0)
        is the last member's: it drafts whenever it is asked to (``member_k``)."""
        if member is None or round_.k == 0:
            member, round_ = self.members[-1], replace(round_, k=0)
        _set_setting(self.controllers, round_)
        self.controllers[member].observe(round_)


def _set_setting(controllers: dict[str, AdaptiveK], round_: Round) -> None:
    """Every member decides next for the setting (alone or in a batch) of the last round,
    whichever member drafted it: their rates are compared with one another."""
    for controller in controllers.values():
        controller.in_batch = round_.batch > 1


def _member_controllers(members: list[str], max_k: int) -> dict[str, AdaptiveK]:
    """One ``AdaptiveK`` per member, all with one table of the target's pass costs (one
    alone, one in a batch); each member's draft step its own."""
    solo, batched = Costs(), Costs()

    def costs(shared: Costs) -> Costs:
        return Costs(pass_seconds=shared.pass_seconds, pass_history=shared.pass_history)

    return {
        name: AdaptiveK(max_k=max_k, solo=costs(solo), batched=costs(batched)) for name in members
    }


KPolicy = AdaptiveK | DrafterChoice | FallbackK  # the k policy of k=auto requests


def _interpolated(pass_seconds: dict[int, float], n: int) -> float:
    """Pass time for n tokens from a table of sizes: measured, else piecewise linear between
    the nearest sizes. Outside them: above the largest, the last segment's slope; below the
    smallest, 5% less a token (a memory-bound pass). A pass's cost is convex in n (the
    weights are read once, each row adds its arithmetic), so a line through two large
    measured sizes, extended down, would make short passes look nearly free (seen on the
    int4 runtime: a line through 5 and 9 tokens put 3 tokens at half a step)."""
    if n in pass_seconds:
        return pass_seconds[n]
    sizes = sorted(pass_seconds)
    below = [s for s in sizes if s < n]
    above = [s for s in sizes if s > n]
    if not below:  # shorter than anything measured
        low = above[0]
        return pass_seconds[low] * max(0.5, 1.0 - 0.05 * (low - n))
    if not above:  # longer than anything measured
        high = below[-1]
        if len(below) == 1:
            return pass_seconds[high] * (1.0 + 0.05 * (n - high))
        previous = below[-2]
        slope = (pass_seconds[high] - pass_seconds[previous]) / (high - previous)
        return pass_seconds[high] + max(0.0, slope) * (n - high)
    low, high = below[-1], above[0]
    share = (n - low) / (high - low)
    return pass_seconds[low] + share * (pass_seconds[high] - pass_seconds[low])


def _rate(counts: list[float], prior: float) -> float:
    """accepted / reached, with PRIOR_WEIGHT pseudo-observations of ``prior``."""
    accepted, reached = counts
    return (accepted + PRIOR_WEIGHT * prior) / (reached + PRIOR_WEIGHT)


def _chained_rates(counts: list[list[float]], first_prior: float) -> list[float]:
    """``_rate`` of each position's counts, with the estimate of the position before it as
    its prior (the first's: ``first_prior``): a position seldom reached looks like the last
    one measured."""
    rates: list[float] = []
    for position in counts:
        rates.append(_rate(position, rates[-1] if rates else first_prior))
    return rates


def _decay(counts: list[list[float]], decay: float) -> None:
    """Age every (accepted, reached) pair by one round, in place."""
    for pair in counts:
        pair[0] *= decay
        pair[1] *= decay


def _bucket(confidence: float) -> int:
    return min(BUCKETS - 1, max(0, int(confidence * BUCKETS)))


@dataclass
class BatchDrafting:
    """Whether the requests of a batched step draft at all, learned per batch size from the
    token rate of whole steps (tokens emitted by every request / the step's seconds, drafting
    included), drafting vs not. When a request drafts, its own ``AdaptiveK`` picks its k.

    Why: a batched pass reads every weight once for all its rows, so a batch of N requests
    decoding plainly already fills the spare compute that speculation uses alone. Measured
    on the 2-core EPYC (``bench/batch_burst.py``, code, int8 pair): 8 requests made 95
    tok/s without drafting, 75 with every request drafting (k auto); 1 request 21 vs 36;
    4 requests 70 vs 66. The crossover depends on the machine, the pair and the text, so it
    is measured, not set: a batch size measures both ways (``samples`` steps each) unless it
    starts without drafts (``prefers_drafting``), keeps the faster, and tries the other after
    ``explore_every`` steps (evidence decays by ``decay`` a step). A try that finds the other
    way still slower doubles that size's wait for the next (up to ``explore_most`` steps); one
    that finds it faster brings the wait back to ``explore_every``. Why: a drafting step after
    many without first catches every draft up on the text it skipped (a pass of every
    request's missed tokens), so each try of drafting where it loses costs several steps;
    measured on the family 26 EPYC (int4 pair, code, 8 requests of 48 tokens, bursts of the
    learning policy against decoding plainly, ``bench/batch_burst.py``): 142.6 tok/s against
    168.5, with the same rows verified, the difference the tries' catch-up passes."""

    explore_every: int = 40
    explore_most: int = 640
    decay: float = 0.8
    samples: int = 3  # steps measured each way before one step's luck decides
    rates: dict[tuple[int, bool], float] = field(default_factory=dict)  # (n, drafting) -> tok/s
    counts: dict[tuple[int, bool], int] = field(default_factory=dict)  # steps measured
    steps: dict[int, int] = field(default_factory=dict)
    waits: dict[int, int] = field(default_factory=dict)  # n -> steps between tries
    due: dict[int, int] = field(default_factory=dict)  # n -> the step that tries next
    trying: dict[int, bool] = field(default_factory=dict)  # n -> the way a try took, unseen

    def drafting(self, n: int) -> bool:
        """Whether a step of ``n`` requests drafts. One request alone always may (its own
        controller decides, and may choose not to)."""
        if n <= 1:
            return True
        count = self.steps.get(n, 0)
        self.steps[n] = count + 1
        measuring = self._measuring(n)
        if measuring is not None:
            return measuring
        best = self.prefers_drafting(n)
        wait = self.waits.setdefault(n, self.explore_every)
        if count + 1 >= self.due.setdefault(n, count + wait):
            self.due[n] = count + 1 + wait
            self.trying[n] = not best
            return not best
        return best

    def prefers_drafting(self, n: int) -> bool:
        """What a step of ``n`` requests does, exploration aside: the faster way when both
        are measured at this size; else not drafting if a smaller size measured both ways
        did better without (a batch that does better without drafts does so when larger
        too); else the way of the nearest size measured, one request counting as drafting
        (its own controller decides), the smaller on a tie.

        Why the nearest: a larger batch that does better without drafts suggests, without
        proving, that a smaller one near it does too, and measuring a size drafting first
        is dear there. The drafts of a batch that decoded plainly have not followed the
        text (not even the prompt, when the batch did not draft as they joined), so the
        first drafting step catches every one up in a pass of its own: under 8 clients,
        the sizes met as requests finish each paid one such step to measure drafts first
        (``bench/results/2026-12-06-batch-costs-zen4-epyc-avx512``). A size that starts
        without drafts is tried with them every ``explore_every`` steps, as a measured one
        is."""
        if n <= 1:
            return True
        if self._measured(n):
            return self.rates[(n, True)] >= self.rates[(n, False)]
        if self._smaller_does_without(n):
            return False
        measured = {size for size, _ in self.rates if self._measured(size)}
        nearest = min([1, *measured], key=lambda size: (abs(size - n), size))
        return nearest == 1 or self.rates[(nearest, True)] >= self.rates[(nearest, False)]

    def _measured(self, n: int) -> bool:
        return min(self.counts.get((n, True), 0), self.counts.get((n, False), 0)) >= self.samples

    def _smaller_does_without(self, n: int) -> bool:
        return any(
            self._measured(size) and self.rates[(size, False)] > self.rates[(size, True)]
            for size in range(2, n)
        )

    def _measuring(self, n: int) -> bool | None:
        """Until this size is measured both ways, where it starts with drafts
        (``prefers_drafting``): the way with fewer steps measured, drafting first."""
        if self._measured(n) or not self.prefers_drafting(n):
            return None
        return self.counts.get((n, True), 0) <= self.counts.get((n, False), 0)

    def observe(self, n: int, drafting: bool, tokens: int, seconds: float) -> None:
        if n > 1 and seconds > 0:
            key = (n, drafting)
            self.rates[key] = _ema(self.rates.get(key), tokens / seconds, 1.0 - self.decay)
            self.counts[key] = self.counts.get(key, 0) + 1
            if self.trying.get(n) == drafting:  # a try of the other way, now seen
                del self.trying[n]
                wait = self.waits.get(n, self.explore_every)
                # still the slower: wait longer (by this size's own rates, once both ways
                # have any: a size that started without drafts is not measured yet)
                if self.rates[key] < self.rates.get((n, not drafting), 0.0):
                    self.waits[n] = min(2 * wait, self.explore_most)
                else:
                    self.waits[n] = self.explore_every
                self.due[n] = self.steps.get(n, 0) + self.waits[n]
