"""A request's drafting, round by round: its drafter, its k policy, and how far the drafter has
followed the text. The engine drives every kind of drafter through this one interface
(``Speculation``); what a composite drafter needs (a choice of members, a fallback
chain's members each with its own k) lives in the kind made for it here, not in the engine.

One round, as the engine asks it:
``choose_k()`` (a choice picks this round's member) -> the engine caps k -> ``begin(k, round)``
-> ``catch_up_apart(context)`` when the drafter sat out long -> ``drafting(context, k, sampler)``
-> the target's pass -> ``observe(...)``.

Catching up: a drafter that sat out rounds (k was 0, or another member drafted) has text to
follow before it drafts. After ``CATCH_UP_APART`` rounds or more (or never having followed
the text) it catches up in a pass of its own before it drafts (a request alone): its way
behind costs well above a step, so the extra pass is small beside it, and the draft after it
is timed as a step again (how a k policy at 0, exploring, measures today's draft cost).
After fewer, it catches up within its first draft pass, which is then left out of its draft
cost (``Round.caught_up``): a choice of drafters that switches after a round or two does not
pay a pass more each time.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import partial
from typing import cast

from specdec.config import SpecConfig
from specdec.controller import AdaptiveK, DrafterChoice, FallbackK, KPolicy, Round
from specdec.drafters.base import (
    Branch,
    Drafter,
    Drafting,
    Growth,
    KeepGoing,
    Proposal,
    Siblings,
    drafting_of,
    grows_trees,
    prepare_part,
)
from specdec.drafters.composite import ChoiceDrafter, FallbackDrafter
from specdec.sampling import Sampler

CATCH_UP_APART = 4


class Speculation:
    """One drafter (or none) with an ``AdaptiveK`` (k auto) or a fixed k."""

    def __init__(self, drafter: Drafter | None, policy: KPolicy | None, k: int):
        self.drafter, self.policy, self.fixed_k = drafter, policy, k
        self.member: str | None = None  # a choice of drafters: this round's
        # The round up to which each drafter has followed the text (by member name; None:
        # the one drafter): the rounds it drafted, and the prefill.
        self.fed: dict[str | None, int] = {}
        self.sat_out = 0  # rounds this round's drafter sat out (0: drafted the last one)
        self.tree = "off"  # SpecConfig.tree, where the drafter grows trees (speculation_for)
        # What shapes a tree "auto" from measured acceptance and costs: the k policy, or
        # with a fixed k an AdaptiveK that only learns (``speculation_for``)
        self.shaper: AdaptiveK | None = None

    # ---- kinds ---------------------------------------------------------------------

    @staticmethod
    def takes(drafter: Drafter | None) -> bool:
        return True

    @staticmethod
    def new_policy(drafter: Drafter | None, max_k: int) -> KPolicy:
        return AdaptiveK(max_k=max_k)

    @staticmethod
    def fits(policy: KPolicy, drafter: Drafter | None) -> bool:
        return not isinstance(policy, DrafterChoice | FallbackK)  # an AdaptiveK, or one like it

    def members(self) -> list[str | None]:
        """The names ``fed`` follows (None: the one drafter)."""
        return [None]

    # ---- the prefill ----------------------------------------------------------------

    def will_draft(self) -> bool:
        """Whether the first round would draft (else the drafter's prefill is left for later)."""
        if self.drafter is None:
            return False
        return self.policy.choose_k() > 0 if self.policy is not None else self.fixed_k != 0

    def prepare(self, context: Sequence[int]) -> None:
        """The drafter's own prefill: every member has then followed the text to round 0."""
        assert self.drafter is not None, "only a request with a drafter prepares it"
        self.drafter.prepare(context)
        self.fed = dict.fromkeys(self.members(), 0)

    def prepare_part(self, prompt: Sequence[int], given: int) -> None:
        """A part of the drafter's prefill, as far as the prompt's first ``given`` tokens
        (prefills in parts give more in turn; ``drafters.base.prepare_part``). Until
        ``prepare`` has had the whole prompt the drafter counts as not having followed the
        text (it catches up apart)."""
        assert self.drafter is not None, "only a request with a drafter prepares it"
        prepare_part(self.drafter, prompt, given)

    # ---- a round ----------------------------------------------------------------------

    def round_policy(self) -> AdaptiveK | FallbackK | None:
        """This round's k policy."""
        assert not isinstance(self.policy, DrafterChoice), "a choice's kind picks a member"
        return self.policy

    def choose_k(self) -> int:
        """This round's k before the engine's caps (a choice picks its member first)."""
        policy = self.round_policy()
        return policy.choose_k() if policy is not None else self.fixed_k

    def begin(self, k: int, round_index: int) -> None:
        """Note how many rounds this round's drafter sat out: it catches up on them first."""
        if k <= 0:
            self.sat_out = 0
            return
        fed = self.fed.get(self.member)  # None: never, the whole text is ahead of it
        self.sat_out = round_index - fed if fed is not None else CATCH_UP_APART
        self.fed[self.member] = round_index + 1

    def round_drafter(self) -> Drafter:
        assert self.drafter is not None, "a round drafts with a drafter"
        return self.drafter

    def catch_up_apart(self, context: Sequence[int]) -> float:
        """A drafter a long way behind catches up in a pass of its own: the seconds it took
        (0.0 when it was not that far behind)."""
        if self.sat_out < CATCH_UP_APART:
            return 0.0
        started = time.perf_counter()
        self.round_drafter().prepare(context)
        self.sat_out = 0
        return time.perf_counter() - started

    def drafting(
        self, context: Sequence[int], k: int, sampler: Sampler, tree: bool = False
    ) -> Drafting:
        """At most ``k`` drafts, pass by pass (``drafters.base.Drafting``); ``tree``: as a
        tree where ``self.tree`` asks for one (a round the target scores alone)."""
        policy = cast(AdaptiveK | None, self.round_policy())  # a chain's kind drafts otherwise
        keep_going = policy.keep_going if policy is not None else None
        branch = self._branch(policy) if tree else None
        return drafting_of(self.round_drafter(), context, k, sampler, keep_going, branch)

    def _branch(self, policy: AdaptiveK | None) -> Branch | None:
        if self.tree == "full":
            return lambda confidences, seconds: list(range(len(confidences)))
        shaper = policy if policy is not None else self.shaper
        if self.tree == "deep":  # shaped by measured costs once a shaper has them
            if shaper is None:
                return Growth()
            return Growth(
                keep=shaper.tree_nodes, leaves=Siblings(shaper.siblings, shaper.copy_length)
            )
        if self.tree == "auto" and shaper is not None:
            return Siblings(shaper.siblings, shaper.copy_length)
        return None

    def observe(
        self,
        k: int,
        proposal: Proposal,
        num_accepted: int,
        draft_seconds: float,
        pass_seconds: float,
        round_index: int,
        rows: int | None = None,
        batch: int = 1,
        copy_taken: int = 0,
    ) -> None:
        """The verified round ``round_index`` (already counted), for the k policy (or the
        tree's shaper): ``k`` chain drafts, ``num_accepted`` of them accepted, a pass of
        ``rows`` (None: k + 1) scored together with ``batch`` - 1 other requests' rows;
        ``copy_taken`` of a tree's guide guesses (``Proposal.copied``) accepted."""
        policy = cast(AdaptiveK | None, self.policy or self.shaper)  # kinds override
        if policy is None:
            return
        policy.observe(
            self._round(
                k,
                proposal,
                num_accepted,
                draft_seconds,
                pass_seconds,
                self.sat_out > 0,
                rows,
                batch,
                copy_taken,
            )
        )

    @staticmethod
    def _round(
        k,
        proposal,
        num_accepted,
        draft_seconds,
        pass_seconds,
        caught_up,
        rows=None,
        batch=1,
        copy_taken=0,
    ) -> Round:
        copy = None
        if proposal.copied:  # the branch hangs below its first node's parent
            assert proposal.parents is not None, "a copy is a tree's branch"
            first = len(proposal.token_ids) - proposal.copied
            copy = (proposal.parents[first] + 1, proposal.copied, copy_taken)
        return Round(
            k, num_accepted, proposal.confidences, draft_seconds, pass_seconds, caught_up, rows,
            batch, copy,
        )  # fmt: skip


class ChoiceSpeculation(Speculation):
    """A choice of drafters (``model/eagle``): a ``DrafterChoice`` picks each round's member,
    which drafts at its own k."""

    drafter: ChoiceDrafter
    policy: DrafterChoice

    @staticmethod
    def takes(drafter: Drafter | None) -> bool:
        return isinstance(drafter, ChoiceDrafter)

    @staticmethod
    def new_policy(drafter: Drafter | None, max_k: int) -> KPolicy:
        assert isinstance(drafter, ChoiceDrafter), "takes() chose this kind"
        return DrafterChoice(list(drafter.members), max_k=max_k)

    @staticmethod
    def fits(policy: KPolicy, drafter: Drafter | None) -> bool:
        assert isinstance(drafter, ChoiceDrafter), "takes() chose this kind"
        return isinstance(policy, DrafterChoice) and policy.members == list(drafter.members)

    def members(self) -> list[str | None]:
        return list(self.drafter.members)

    def round_policy(self) -> AdaptiveK:
        assert self.member is not None, "the round's member is chosen first"
        return self.policy.controllers[self.member]

    def choose_k(self) -> int:
        self.member = self.policy.choose()
        self.drafter.choose(self.member)
        return self.round_policy().choose_k()

    def round_drafter(self) -> Drafter:
        assert self.member is not None, "the round's member is chosen first"
        return self.drafter.members[self.member]

    def observe(
        self, k, proposal, num_accepted, draft_seconds, pass_seconds, round_index, rows=None,
        batch=1, copy_taken=0,
    ):  # fmt: skip
        assert self.member is not None, "a round of a choice drafts with a member"
        measured = self._round(
            k, proposal, num_accepted, draft_seconds, pass_seconds, self.sat_out > 0,
            batch=batch, copy_taken=copy_taken,
        )  # fmt: skip
        self.policy.observe(self.member, measured)


class ChainSpeculation(Speculation):
    """A fallback chain of distinct members (``lookup+eagle``): each member, asked in turn,
    drafts at its own k or leaves the round to those behind (``FallbackK``)."""

    drafter: FallbackDrafter
    policy: FallbackK | None  # None: a fixed k for the whole chain

    def __init__(self, drafter: Drafter | None, policy: KPolicy | None, k: int):
        super().__init__(drafter, policy, k)
        self.chain_member: str | None = None  # the member whose proposal this round takes

    @staticmethod
    def takes(drafter: Drafter | None) -> bool:
        return isinstance(drafter, FallbackDrafter) and bool(_chain_members(drafter))

    @staticmethod
    def new_policy(drafter: Drafter | None, max_k: int) -> KPolicy:
        return FallbackK(_chain_members(drafter), max_k=max_k)

    @staticmethod
    def fits(policy: KPolicy, drafter: Drafter | None) -> bool:
        return isinstance(policy, FallbackK) and policy.members == _chain_members(drafter)

    def members(self) -> list[str | None]:
        return [None, *_chain_members(self.drafter)]

    def drafting(
        self, context: Sequence[int], k: int, sampler: Sampler, tree: bool = False
    ) -> Drafting:
        if self.policy is None:  # a fixed k: the chain as one drafter
            return (yield from super().drafting(context, k, sampler, tree))
        chain, self.chain_member = self.policy, None

        def policy(member: str) -> tuple[int, KeepGoing]:
            # the last member asked to draft is the one whose proposal is taken (a member's
            # own name: a nested chain's proposal names its inner member)
            member_k = min(k, chain.member_k(member))
            if member_k > 0:
                self.chain_member = member
            return member_k, partial(chain.keep_going, member)

        def branch_of(member: str) -> Branch | None:
            return self._branch(chain.controllers[member])

        return (
            yield from self.drafter.drafting_with(
                context, policy, sampler, branch_of if tree else None
            )
        )

    def observe(
        self, k, proposal, num_accepted, draft_seconds, pass_seconds, round_index, rows=None,
        batch=1, copy_taken=0,
    ):  # fmt: skip
        if self.policy is None:
            return
        member = self.chain_member if k else None
        caught_up = self._record_feed(member, round_index)
        measured = self._round(
            k, proposal, num_accepted, draft_seconds, pass_seconds, caught_up, rows, batch,
            copy_taken,
        )  # fmt: skip
        self.policy.observe(member, measured)

    def _record_feed(self, member: str | None, round_index: int) -> bool:
        """Record that the chain's drafting member has followed the text through this round
        (as ``begin`` does for the drafter), and answer whether it first caught up on text it
        had not followed (it did not draft the round before, or the whole chain sat out)."""
        if member is None:
            return False
        fed = self.fed.get(member)
        self.fed[member] = round_index + 1
        return self.sat_out > 0 or fed != round_index


KINDS: tuple[type[Speculation], ...] = (ChoiceSpeculation, ChainSpeculation, Speculation)


def kind_of(drafter: Drafter | None) -> type[Speculation]:
    """The kind of speculation ``drafter`` needs (the first of ``KINDS`` that takes it)."""
    return next(kind for kind in KINDS if kind.takes(drafter))


def new_policy(drafter: Drafter | None, max_k: int) -> KPolicy:
    """The k policy of adaptive requests with ``drafter``: an ``AdaptiveK``; for a choice
    of drafters a ``DrafterChoice``, for a fallback chain of distinct members a
    ``FallbackK`` (each with one ``AdaptiveK`` per member)."""
    return kind_of(drafter).new_policy(drafter, max_k)


def policy_fits(policy: KPolicy | None, drafter: Drafter | None, max_k: int) -> bool:
    """Whether a policy made before fits this request's drafter and max_k."""
    return policy is not None and policy.max_k == max_k and kind_of(drafter).fits(policy, drafter)


def speculation_for(
    drafter: Drafter | None, policy: KPolicy | None, spec: SpecConfig
) -> Speculation:
    """A request's drafting: ``policy`` for k auto; with a fixed ``spec.k`` and a tree
    "auto", the AdaptiveK that shapes its trees (it learns, it does not choose k)."""
    kind = kind_of(drafter)
    if drafter is None:
        return Speculation(None, None, 0)
    if spec.tree != "off" and (kind is ChoiceSpeculation or not grows_trees(drafter)):
        raise ValueError(
            f"drafter {drafter.name}: draft trees grow from a draft model's second choices "
            "(--drafter model, or lookup+model); this drafter proposes chains: use tree='off'"
        )
    if spec.tree in ("auto", "deep") and kind is ChainSpeculation and not spec.adaptive:
        raise ValueError(
            f"drafter {drafter.name}: tree={spec.tree!r} in a fallback chain is shaped by its "
            "members' own measurements, taken with k='auto': use k='auto' (or tree='full')"
        )
    speculation = _made(kind, drafter, policy if spec.adaptive else None, spec)
    speculation.tree = spec.tree
    if spec.tree in ("auto", "deep") and isinstance(policy, AdaptiveK):
        speculation.shaper = policy
    return speculation


def _made(
    kind: type[Speculation], drafter: Drafter, policy: KPolicy | None, spec: SpecConfig
) -> Speculation:
    if spec.adaptive:
        assert policy is not None, "k auto drafts with a policy"
        return kind(drafter, policy, spec.max_k)
    assert isinstance(spec.k, int), "a fixed k is an int ('auto' is adaptive)"
    if kind is ChoiceSpeculation and spec.k != 0:
        raise ValueError(
            f"drafter {drafter.name}: a choice of drafters is made from measured rounds, "
            "as k is: use k=auto"
        )
    return kind(drafter, None, spec.k)


def _chain_members(drafter: Drafter | None) -> list[str]:
    """A fallback chain's member names, when distinct (else [])."""
    if not isinstance(drafter, FallbackDrafter):
        return []
    names = [member.name for member in drafter.drafters]
    return names if len(set(names)) == len(names) else []
