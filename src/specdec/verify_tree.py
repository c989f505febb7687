"""Verification of a draft tree: pure functions over tensors, no models, no caches.

Terms as in ``verify``, for a tree (``specdec.tree``): ``token_ids``  # [n] and ``parents``
(node i under node parents[i], -1 the root); ``draft_probs``  # [n, vocab] or None: the
distribution node i's token was drawn from, given its parent and the siblings before it (a
sibling drawn without replacement has the earlier siblings' tokens removed and the rest
renormalised; None: point masses, deterministic drafts); ``target_probs``  # [n + 1, vocab]:
the target's distribution at each row (row 0 the root, row i + 1 node i) from ONE pass.

Verification walks down from the root. At each reached row it holds the target's
distribution there, p, and tries the row's children in order:

- greedy: the child whose token is the target's argmax, if there is one;
- coupled: the child whose token is the target's keyed sample at that position, if there is
  one; every emitted token is then the target's own keyed sample, as in plain decoding;
- rejection (multi-draft speculative sampling: SpecInfer, Miao et al. 2024; recursive
  rejection sampling, Jeon et al. 2024): child x, drawn from q, is accepted with probability
  min(1, p(x) / q(x)); if it is rejected, p becomes norm(max(0, p - q)) and the next sibling
  is tried against that.

The first accepted child is descended into; when none is, the round ends with a token
sampled from the p left (the target's, or the last residual); at a leaf that was accepted it
ends with the bonus token from the leaf's row. Exactness of the rejection rule, by induction
from the last sibling: one stage is Algorithm 1 for a target p and a draft q, whose rejected
branch must yield a sample of norm(max(0, p - q)); the stages after it yield exactly that,
since each is again Algorithm 1 for its own (p, q) whatever that q is, so long as its child
was drawn from that very q with fresh randomness (which children there are may depend on
anything drawn before, but not on the child's own token). Hence the bugs the tests inject:
siblings drawn with replacement (from q) but verified as without (against q with the
earlier ones removed), deterministic (top-k) drafts verified as if sampled from q, a
residual not renormalised before the next sibling, and a sibling kept only when its own
token is likely. Point masses are exact for drafts chosen any way at all (the walk is then a
sample of p matched against the children), sampled ones included, at a lower acceptance.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.sampling import argmax_rows, sample
from specdec.tree import children
from specdec.verify import RESIDUAL_EPSILON, VerifyResult


def verify_tree_greedy(
    token_ids: Sequence[int], parents: Sequence[int], target_logits: torch.Tensor
) -> VerifyResult:
    """The longest path whose tokens are the target's argmax at each row."""
    return _follow(token_ids, parents, argmax_rows(target_logits))


def verify_tree_coupled(
    token_ids: Sequence[int],
    parents: Sequence[int],
    target_samples: Sequence[int],  # [n + 1]: the target's keyed sample at each row's position
) -> VerifyResult:
    """The longest path whose tokens are the target's keyed samples at each row."""
    assert len(target_samples) == len(token_ids) + 1, "one keyed sample per scored row"
    return _follow(token_ids, parents, target_samples)  # rows read down the path only


def verify_tree_stochastic(
    token_ids: Sequence[int],
    parents: Sequence[int],
    draft_probs: torch.Tensor | None,  # [n, vocab], None = point masses on the drafts
    target_probs: torch.Tensor,  # [n + 1, vocab]
    generator: torch.Generator,
) -> VerifyResult:
    """Recursive rejection sampling down the tree (see the module's docstring): one uniform
    per child tried, one sample at the end."""
    n = len(token_ids)
    assert target_probs.shape[0] == n + 1, "target must score the root and every node"
    assert draft_probs is None or draft_probs.shape == (n, target_probs.shape[1]), (
        "one draft distribution per node, the target's vocabulary"
    )
    under = children(parents)
    path: list[int] = []
    fallback = False
    row = 0
    while True:
        p = target_probs[row].double()
        p = p / p.sum()
        accepted = None
        for node in under[row]:
            x = int(token_ids[node])
            u = float(torch.rand(1, generator=generator, dtype=torch.float64))
            if draft_probs is None:  # q = 1: accept with p(x); the rest renormalised
                if u < float(p[x]):
                    accepted = node
                    break
                p = _without(p, x)
                continue
            q = draft_probs[node].double()
            if u * float(q[x]) < float(p[x]):
                accepted = node
                break
            residual = _residual(p, q)
            if residual is None:  # p and q equal up to rounding: keep p
                fallback = True
                continue
            p = residual
        if accepted is None:
            tokens = [int(token_ids[node]) for node in path] + [sample(p.float(), generator)]
            return VerifyResult(tokens, len(path), False, fallback, tuple(path))
        path.append(accepted)
        row = accepted + 1
        if not under[row]:
            bonus = sample(target_probs[row], generator)
            tokens = [int(token_ids[node]) for node in path] + [bonus]
            return VerifyResult(tokens, len(path), True, fallback, tuple(path))


def _without(p: torch.Tensor, x: int) -> torch.Tensor:
    """p without token x, renormalised: the target after a rejected point-mass draft (which
    is rejected only where the other tokens have mass)."""
    rest = p.clone()
    rest[x] = 0.0
    return rest / rest.sum()


def _residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor | None:
    """norm(max(0, p - q)), or None where it has no mass beyond float noise."""
    residual = torch.clamp(p - q, min=0.0)
    mass = float(residual.sum())
    return None if mass <= RESIDUAL_EPSILON else residual / mass


def _follow(
    token_ids: Sequence[int], parents: Sequence[int], winners: Sequence[int]
) -> VerifyResult:
    """Descend while a child's token is the target's token (``winners``, one per row, read
    only at the rows the path reaches)."""
    assert len(winners) == len(token_ids) + 1, "target must score the root and every node"
    under = children(parents)
    path: list[int] = []
    row = 0
    while True:
        match = next((node for node in under[row] if token_ids[node] == winners[row]), None)
        if match is None:
            tokens = [int(token_ids[node]) for node in path] + [int(winners[row])]
            return VerifyResult(tokens, len(path), not under[row], path=tuple(path))
        path.append(match)
        row = match + 1
