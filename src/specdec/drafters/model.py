"""Drafting with a small model of the same family, over its own KV cache."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.backends.base import Backend, common_prefix_length, sync_cache
from specdec.config import SamplingParams
from specdec.drafters.base import Branch, Drafting, KeepGoing, Proposal, StepwiseDrafter
from specdec.drafters.lookup import PromptLookupDrafter
from specdec.sampling import Sampler, sample
from specdec.tree import chain

_GREEDY = SamplingParams(temperature=0.0)


class ModelDrafter(StepwiseDrafter):
    """Samples k tokens autoregressively from a draft model.

    Its cache follows the accepted text lazily: each ``propose`` rolls the cache back to the
    longest prefix it shares with ``context`` and feeds what is missing. After a round in
    which all k drafts were accepted, that is the last draft (never fed) plus the bonus
    token; after a rejection, just the recovered token.

    With a ``guide`` (prompt lookup: what followed an earlier occurrence of the context's
    tail), the draft first reads the guide's guesses in the same pass as what it catches up
    on, every row's logits kept: while the draft's own pick at a position is the guess it
    read there, the next row's logits are the ones a step would have given, so the chain
    goes on without another pass; at the first pick that differs the guesses after it are
    cut from the cache and drafting goes on step by step. The proposal is the one the
    unguided draft makes (the same tokens from the same logits, the same random numbers
    drawn in the same order; on specdec's runtimes a row in a pass is its step bit for bit),
    for one pass of several rows where it would take as many passes as guesses it confirms
    (CS Drafting's cascade: a statistical draft for the draft model).
    """

    name = "model"
    grows_trees = True  # its second choices, as leaves beside the chain (``SpecConfig.tree``)

    def __init__(self, backend: Backend, guide: PromptLookupDrafter | None = None):
        self.backend = backend
        self.vocab_size = backend.vocab_size
        self.guide = guide

    def prepare(self, context: Sequence[int]) -> None:
        if self.guide is not None:
            self.guide.prepare(context)  # its index of the prompt, built during prefill
        limit = self.backend.max_length
        if limit is not None and len(context) >= limit:
            return  # longer than the draft's window (a llama.cpp n_ctx): it will not draft
        sync_cache(self.backend, list(context[:-1]))  # the last token is fed by the first propose

    def drafting(
        self,
        context: Sequence[int],
        k: int,
        sampler: Sampler | None = None,
        keep_going: KeepGoing | None = None,
        branch: Branch | None = None,
    ) -> Drafting:
        """``propose``, one draft pass per step (see ``drafters.base.Drafting``). With
        ``branch``, a tree: the chain, then the draft's second choice beside the chain
        node at each depth ``branch`` picks (``second_choice``)."""
        assert len(context) > 0, "drafting needs a context"
        sampler = sampler or Sampler(_GREEDY)
        if self.backend.max_length is not None:
            k = min(k, self.backend.max_length - len(context))
        if k <= 0:
            return Proposal([], drafter=self.name)
        # Keep at least the last context token unfed: its logits give the first draft.
        keep = min(common_prefix_length(self.backend.cached_token_ids, context), len(context) - 1)
        self.backend.truncate(keep)
        catch_up = list(context[keep:])
        guesses = self._guesses(context, k)
        offered = guesses  # what the guide offered, kept for a tree's branch
        if guesses:
            # rows[j]: the logits after the context and the first j guesses
            rows = (yield (self.backend, catch_up + guesses, True))[len(catch_up) - 1 :]
            logits = rows[0]
        else:
            logits = (yield (self.backend, catch_up))[-1]
        token_ids: list[int] = []
        probs: list[torch.Tensor] = []
        confidences: list[float] = []
        dists: list[torch.Tensor] = []  # each depth's distribution, for a tree's leaves
        while True:
            token_id, token_probs = sampler.pick(logits, len(context) + len(token_ids))
            token_ids.append(token_id)
            if token_probs is not None:
                probs.append(token_probs)
            if keep_going is not None or branch is not None:
                dist = _distribution(logits, token_probs)
                confidences.append(float(dist[token_id]))
                if branch is not None:
                    dists.append(dist)
            if keep_going is not None and len(token_ids) < k and not keep_going(confidences):
                break
            if len(token_ids) == k:
                break
            confirmed = len(token_ids) - 1  # guesses read before this pick
            if confirmed < len(guesses) and guesses[confirmed] == token_id:
                logits = rows[confirmed + 1]  # the draft read this token already
                continue
            if guesses:  # it picked otherwise: the guesses from here on are not the text
                self.backend.truncate(len(context) + confirmed)
                guesses = []
            logits = (yield (self.backend, [token_id]))[-1]
        if branch is not None:
            tree = self._tree(context, token_ids, probs, confidences, dists, sampler, branch)
            return with_copy(tree, offered, token_ids, sampled=bool(probs), coupled=sampler.coupled)
        return Proposal(
            token_ids,
            torch.stack(probs) if probs else None,
            self.name,
            confidences if keep_going is not None else None,
        )

    def _guesses(self, context: Sequence[int], k: int) -> list[int]:
        """The guide's guesses for the first k - 1 drafts (the k-th is read from the row
        after them): none without a guide, k = 1, or a draft window too short for them."""
        if self.guide is None or k < 2:
            return []
        guesses = self.guide.propose(context, k - 1).token_ids
        limit = self.backend.max_length
        if limit is not None:
            guesses = guesses[: max(0, limit - len(context) - 1)]
        return guesses

    def _tree(self, context, token_ids, probs, confidences, dists, sampler, branch) -> Proposal:
        """The chain and, at the depths ``branch`` picks, the second choice as a leaf."""
        sampled = bool(probs)
        seconds = [
            second_choice(dist, sampled, token_ids[depth], sampler, len(context) + depth)
            for depth, dist in enumerate(dists)
        ]
        leaves = [d for d in branch(confidences, [s[2] for s in seconds]) if seconds[d][0] >= 0]
        parents = [*chain(len(token_ids)), *(d - 1 for d in leaves)]
        nodes = token_ids + [seconds[d][0] for d in leaves]
        draft_probs = None
        if probs:
            draft_probs = torch.stack([*probs, *(seconds[d][1] for d in leaves)])
        return Proposal(nodes, draft_probs, self.name, confidences, parents)


def with_copy(
    tree: Proposal, offered: list[int], chain_ids: list[int], sampled: bool, coupled: bool
) -> Proposal:
    """``tree`` and, where the guide's guesses part from the chain, the rest of them as a
    branch of their own: hung beside the chain's node where the draft picked otherwise (or
    after its last node where the chain ended first), so that where the target copies and
    the draft did not, the copy is scored too. Greedy and coupled only: those verifiers take
    the child whose token is the target's own (argmax or keyed sample), whatever the child
    was drawn from; rejection sampling's tries would need each child's own distribution, so
    its trees stay as they are. A leaf with the branch's first token at that depth gives way
    to it (siblings with one token: the first would end the path)."""
    confirmed = 0
    while (
        confirmed < min(len(offered), len(chain_ids)) and offered[confirmed] == chain_ids[confirmed]
    ):
        confirmed += 1
    copy = offered[confirmed:]
    if not copy or (sampled and not coupled):
        return tree
    assert tree.parents is not None, "a tree"
    n_chain = len(chain_ids)
    keep = [
        i
        for i in range(n_chain, len(tree.token_ids))
        if not (tree.parents[i] == confirmed - 1 and tree.token_ids[i] == copy[0])
    ]
    nodes = list(range(n_chain)) + keep
    token_ids = [tree.token_ids[i] for i in nodes] + copy
    first = len(nodes)
    parents = (
        [tree.parents[i] for i in nodes]
        + [confirmed - 1]
        + [first + i for i in range(len(copy) - 1)]
    )
    draft_probs = None
    if tree.draft_probs is not None:  # coupled: the copy's rows are point masses
        points = torch.zeros(len(copy), tree.draft_probs.shape[1])
        points[torch.arange(len(copy)), torch.tensor(copy)] = 1.0
        draft_probs = torch.cat([tree.draft_probs[nodes], points])
    return Proposal(token_ids, draft_probs, tree.drafter, tree.confidences, parents)


def second_choice(
    dist: torch.Tensor,  # [vocab]: the draft's distribution at this depth (``_distribution``)
    sampled: bool,  # the chain's token was drawn from ``dist`` (else greedy: its argmax)
    chosen: int,  # the chain's token
    sampler: Sampler,
    position: int,
) -> tuple[int, torch.Tensor | None, float]:
    """The draft's second choice at a depth, the distribution it came from (None: greedy,
    a point mass), and the runner-up's probability once the chain's token is ruled out (what
    decides whether the leaf is verified); -1 where there is none. Drawn as a sibling
    without replacement: greedy, the runner-up; coupled, the runner-up of the same race; else
    a sample of the distribution without the chain's token, renormalised (what
    ``verify_tree`` verifies it against).

    Exactness: whether a sampled leaf is kept may depend on the chain's tokens but not on
    the leaf's own: kept only when likely, a leaf would no longer be a draw from the
    distribution it is verified against. Hence the runner-up's probability, the same
    whichever token was drawn."""
    rest = dist.clone()
    rest[chosen] = 0.0
    mass = float(rest.sum())
    if mass <= 0.0:
        return -1, None, 0.0
    rest = rest / mass
    if not sampled:
        token = int(rest.argmax())
    elif sampler.coupled:
        token = sampler.race(rest, position)
    else:
        token = sample(rest, sampler.generator)
    return token, rest if sampled else None, float(rest.max())


def _distribution(logits: torch.Tensor, probs: torch.Tensor | None) -> torch.Tensor:
    """What the draft's confidence in its token is read from: the distribution it was
    sampled from, or the softmax of the raw logits when greedy."""
    return probs if probs is not None else torch.softmax(logits.float(), dim=-1)


def _confidence(logits: torch.Tensor, token_id: int, probs: torch.Tensor | None) -> float:
    """The draft's probability of its own token (``_distribution``)."""
    return float(_distribution(logits, probs)[token_id])
