"""The drafter protocol: ``propose(context, k, sampler) -> Proposal``."""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from specdec.sampling import Sampler

KeepGoing = Callable[[list[float]], bool]
# A tree's shape (``SpecConfig.tree`` "auto", "full"): given the chain's confidences and, per
# depth, the draft's probability of its second choice once the first is ruled out, the
# depths (0-based) that get that second choice as a leaf.
Leaves = Callable[[list[float], list[float]], list[int]]
# How many of a guide's guesses to verify beside the chain where the draft parts from them
# (``drafters.model.with_copy``): given the chain's confidences, the tree's rows so far, the
# depth where they part and how many guesses are left, a count from 0 to that many.
CopyLength = Callable[[list[float], int, int, int], int]


@dataclass(frozen=True)
class Siblings:
    """A chain's tree shaped by measured costs (``SpecConfig.tree = "auto"``): ``leaves``
    picks the depths that get the draft's second choice; ``copy`` how many of the guide's
    guesses are verified as a branch where the draft parts from them. A bare ``Leaves`` as
    a branch verifies every such guess."""

    leaves: Leaves
    copy: CopyLength


@dataclass(frozen=True)
class Growth:
    """A deep tree's shape (``SpecConfig.tree = "deep"``; EAGLE-2's dynamic expansion): at
    each depth the draft scores the ``beam`` likeliest open nodes in one pass and keeps the
    ``width`` candidates of each (its own pick first, then its next choices); once grown,
    ``keep`` (each node's path confidences, the likeliest node first; the draft passes the
    growing took) says how many of the likeliest nodes the target verifies (None: all). ``leaves``:
    the shape where a deep tree cannot grow (rejection sampling, a draft that scores no
    trees): its chain with second-choice leaves, or a chain (None)."""

    width: int = 3
    beam: int = 3
    keep: Callable[[list[list[float]], int], int] | None = None
    leaves: Leaves | Siblings | None = None


Branch = Leaves | Siblings | Growth  # what a drafter that grows trees is asked for


@dataclass(frozen=True)
class Proposal:
    """Up to k drafted tokens. ``draft_probs`` is the distribution each token was sampled
    from (``[len(token_ids), vocab]``), or None for a deterministic proposal (point masses)."""

    token_ids: list[int]
    draft_probs: torch.Tensor | None = None
    drafter: str = ""  # which drafter proposed it (a composite drafter names its member)
    confidences: list[float] | None = None  # the drafter's probability of each of its tokens
    # A tree (``specdec.tree``): node i under node parents[i] (-1: the root); None: a chain.
    # ``confidences`` are then the leading chain's.
    parents: list[int] | None = None
    # A tree's last ``copied`` nodes: a guide's guesses, one branch hung where the draft
    # parted from them (``drafters.model.with_copy``)
    copied: int = 0
    # A chain's first ``given`` drafts: tokens the request's grammar forces (q = 1), the
    # ``drafter``'s after them (``after_given``); ``confidences`` are the drafter's own.
    given: int = 0

    def __post_init__(self) -> None:
        if self.draft_probs is not None:
            assert self.draft_probs.shape[0] == len(self.token_ids), "one distribution per draft"
        if self.parents is not None:
            assert len(self.parents) == len(self.token_ids), "one parent per node"
        assert self.given == 0 or self.parents is None, "given drafts lead a chain"

    def drafters_part(self) -> Proposal:
        """The drafts after the ``given`` ones, as the drafter proposed them."""
        if not self.given:
            return self
        probs = None if self.draft_probs is None else self.draft_probs[self.given :]
        return Proposal(self.token_ids[self.given :], probs, self.drafter, self.confidences)


def after_given(given: Sequence[int], proposal: Proposal) -> Proposal:
    """``proposal``, a chain drafted after the ``given`` tokens, behind them: one chain whose
    first drafts are point masses (q = 1 at each given token)."""
    if not given:
        return proposal
    assert proposal.parents is None, "given drafts lead a chain"
    probs = proposal.draft_probs
    if probs is not None:
        ones = torch.zeros(len(given), probs.shape[1], dtype=probs.dtype)
        ones[torch.arange(len(given)), torch.tensor(list(given))] = 1.0
        probs = torch.cat([ones, probs])
    return Proposal(
        [*given, *proposal.token_ids], probs, proposal.drafter, proposal.confidences,
        given=len(given),
    )  # fmt: skip


@runtime_checkable
class Drafter(Protocol):
    name: str

    @property
    def vocab_size(self) -> int | None:
        """Width of ``draft_probs`` rows; None: works on any vocabulary (e.g. lookup)."""
        ...

    def prepare(self, context: Sequence[int]) -> None:
        """Called per request with the prompt, during prefill: a drafter with a cache
        fills it here, so that drafting costs (which steer adaptive k) exclude it. A prefill
        in parts (``Run.prefill_part``) calls it on longer and longer prefixes of the prompt
        first (or the drafter's own ``prepare_part``: ``prepare_part`` below): each call goes
        on from the last, ending as one call with the whole prompt."""
        ...

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampler: Sampler | None = None,
        keep_going: KeepGoing | None = None,
    ) -> Proposal:
        """Draft at most k tokens following ``context`` (prompt + accepted output).

        A drafter that drafts token by token may call ``keep_going(confidences)`` after each
        token and stop early when it returns False; others may ignore it.
        """
        ...


# A drafter that drafts with a model may do it step by step: ``drafting(...)`` is a generator
# that yields each forward pass it needs, ``(backend, token_ids)`` (the last position's
# logits), ``(backend, token_ids, True)`` (every position's) or ``(backend, token_ids,
# parents)`` (a tree pass, ``forward_tree``: a deep tree's depth, drafted in a round the
# target scores alone), is sent that pass's logits, and returns its Proposal. ``propose``
# runs it pass by pass; ``engine.step_together`` runs the drafting of many requests in
# lockstep, their passes on one batched model together.
ForwardCall = tuple[Any, list[int]] | tuple[Any, list[int], bool] | tuple[Any, list[int], list[int]]
Drafting = Generator[ForwardCall, torch.Tensor, Proposal]


def pass_work(call: ForwardCall) -> tuple[Any, list[int], bool]:
    """A drafting pass as ``(backend, token_ids, last_only)``."""
    backend, token_ids, *every_row = call
    assert not (every_row and isinstance(every_row[0], list)), "a tree pass runs alone (drive)"
    return backend, token_ids, not (every_row and every_row[0])


def run_pass(call: ForwardCall) -> torch.Tensor:
    """One drafting pass, run."""
    backend, token_ids, *rest = call
    if rest and isinstance(rest[0], list):
        return backend.forward_tree(token_ids, rest[0])
    _, _, last_only = pass_work(call)
    return backend.forward(token_ids, last_only=last_only)


class StepwiseDrafter:
    """A drafter whose ``propose`` is its ``drafting`` run one pass at a time."""

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampler: Sampler | None = None,
        keep_going: KeepGoing | None = None,
    ) -> Proposal:
        return drive(self.drafting(context, k, sampler, keep_going))

    def drafting(
        self,
        context: Sequence[int],
        k: int,
        sampler: Sampler | None = None,
        keep_going: KeepGoing | None = None,
    ) -> Drafting:
        raise NotImplementedError


def drive(drafting: Drafting) -> Proposal:
    """Run a ``drafting`` generator with one pass at a time."""
    try:
        call = next(drafting)
        while True:
            call = drafting.send(run_pass(call))
    except StopIteration as done:
        return done.value


def prepare_part(drafter: Drafter, prompt: Sequence[int], given: int) -> None:
    """A part of ``drafter``'s prefill of ``prompt``, as far as its first ``given`` tokens:
    the drafter's own ``prepare_part(prompt, given)`` where it has one (one that reads only
    part of a prompt knows which part from the whole: ``ModelDrafter``), else ``prepare`` of
    those tokens."""
    own = getattr(drafter, "prepare_part", None)
    if own is not None:
        own(prompt, given)
    else:
        drafter.prepare(prompt[:given])


def grows_trees(drafter: Drafter | None) -> bool:
    """Whether ``drafter`` can propose a tree (its ``drafting`` takes a ``branch``)."""
    return bool(getattr(drafter, "grows_trees", False))


def drafting_of(
    drafter: Drafter,
    context: Sequence[int],
    k: int,
    sampler: Sampler | None = None,
    keep_going: KeepGoing | None = None,
    branch: Branch | None = None,
) -> Drafting:
    """``drafter``'s step-by-step drafting, or its whole ``propose`` as one step with no
    pass to share (lookup, n-grams, heads). ``branch``: a tree's shape, for a drafter that
    ``grows_trees``."""
    steps = getattr(drafter, "drafting", None)
    if branch is not None:
        assert grows_trees(drafter), f"{drafter.name} proposes chains only"
        return (yield from drafter.drafting(context, k, sampler, keep_going, branch))  # type: ignore[attr-defined]
    if steps is not None:
        return (yield from steps(context, k, sampler, keep_going))
    return drafter.propose(context, k, sampler, keep_going)
