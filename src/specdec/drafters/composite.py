"""Drafters made of drafters: a fallback chain (the first non-empty proposal wins) and a
choice (one member drafts each round, chosen from measured rounds).

``FallbackDrafter([PromptLookupDrafter(), ModelDrafter(small)])`` copies from the context
when it finds a match of 2+ tokens (free) and asks the small model otherwise. Each proposal
names its drafter, so the stats report rounds and acceptance per member.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from specdec.drafters.base import (
    Branch,
    Drafter,
    Drafting,
    KeepGoing,
    Proposal,
    StepwiseDrafter,
    drafting_of,
    grows_trees,
    prepare_part,
)
from specdec.sampling import Sampler
from specdec.tree import chain_length

# A member's name -> the k it drafts at (0: it leaves the round to the next) and its early stop
MemberPolicy = Callable[[str], tuple[int, KeepGoing | None]]


def common_vocab_size(drafters: Sequence[Drafter]) -> int | None:
    """The vocabulary size the members draft over (None: any, e.g. lookup alone); members
    that disagree are refused."""
    sizes = {d.vocab_size for d in drafters if d.vocab_size is not None}
    if len(sizes) > 1:
        raise ValueError(f"the drafters disagree on the vocabulary size: {sorted(sizes)}")
    return sizes.pop() if sizes else None


class FallbackDrafter(StepwiseDrafter):
    def __init__(self, drafters: Sequence[Drafter]):
        if not drafters:
            raise ValueError("FallbackDrafter needs at least one drafter")
        self.drafters = list(drafters)
        for drafter in self.drafters[:-1]:
            in_front = getattr(drafter, "put_in_front", None)  # e.g. lookup: longer matches only
            if in_front is not None:
                in_front()
        self.name = "+".join(d.name for d in drafters)
        self.vocab_size = common_vocab_size(self.drafters)
        # a member that grows trees does, when the round is its (``drafting_with``)
        self.grows_trees = any(grows_trees(d) for d in self.drafters)

    def prepare(self, context: Sequence[int]) -> None:
        for drafter in self.drafters:
            drafter.prepare(context)

    def prepare_part(self, prompt: Sequence[int], given: int) -> None:
        for drafter in self.drafters:
            prepare_part(drafter, prompt, given)

    def drafting(
        self,
        context: Sequence[int],
        k: int,
        sampler: Sampler | None = None,
        keep_going: KeepGoing | None = None,
        branch: Branch | None = None,
    ) -> Drafting:
        """``propose``, one member's draft pass per step (see ``drafters.base.Drafting``);
        ``branch``: the shape of a tree, where the member drafting grows trees."""
        policy: MemberPolicy = lambda _: (k, keep_going)  # noqa: E731
        return (yield from self.drafting_with(context, policy, sampler, lambda _: branch))

    def drafting_with(
        self,
        context: Sequence[int],
        policy: MemberPolicy,
        sampler: Sampler | None = None,
        branch_of: Callable[[str], Branch | None] | None = None,
    ) -> Drafting:
        """``drafting`` with each member's own k and early stop, ``policy(member name)``
        (``controller.FallbackK``); a member given k = 0 leaves the round to the next.
        ``branch_of(member name)``: the shape of its tree, for a member that grows trees."""
        proposal = Proposal([], drafter=self.name)
        for drafter in self.drafters:
            k, keep_going = policy(drafter.name)
            if k <= 0:
                continue
            branch = branch_of(drafter.name) if branch_of and grows_trees(drafter) else None
            proposal = yield from drafting_of(drafter, context, k, sampler, keep_going, branch)
            assert chain_length(proposal.parents, len(proposal.token_ids)) <= k, (
                f"{drafter.name} proposed more than k tokens"
            )
            if proposal.token_ids:
                return proposal
        return proposal


class ChoiceDrafter(StepwiseDrafter):
    """One of several drafters (recipes: ``model/eagle``, ``lookup+eagle/model``) drafts
    each round: the one ``chosen`` by the run's ``controller.DrafterChoice``, from measured
    rounds. Every member fills its cache at ``prepare``; one that has not drafted for a
    while catches up on the text in its next draft, as ``ModelDrafter`` always does."""

    def __init__(self, members: Mapping[str, Drafter]):
        if len(members) < 2:
            raise ValueError("ChoiceDrafter needs two or more drafters")
        self.members = dict(members)
        self.name = "/".join(self.members)
        self.vocab_size = common_vocab_size(list(self.members.values()))
        self.chosen = next(iter(self.members))

    def choose(self, member: str) -> None:
        if member not in self.members:
            raise ValueError(f"{member!r} is not one of {self.name}")
        self.chosen = member

    def prepare(self, context: Sequence[int]) -> None:
        for drafter in self.members.values():
            drafter.prepare(context)

    def prepare_part(self, prompt: Sequence[int], given: int) -> None:
        for drafter in self.members.values():
            prepare_part(drafter, prompt, given)

    def drafting(
        self,
        context: Sequence[int],
        k: int,
        sampler: Sampler | None = None,
        keep_going: KeepGoing | None = None,
    ) -> Drafting:
        """The chosen member's ``drafting`` (see ``drafters.base.Drafting``)."""
        return (yield from drafting_of(self.members[self.chosen], context, k, sampler, keep_going))
