"""Verification of a drafted block: pure functions over tensors, no models, no caches.

Terms (Leviathan, Kalman, Matias 2023, "Fast Inference from Transformers via Speculative
Decoding", Algorithm 1; the paper calls the target p and the draft q):

- ``draft_token_ids``  # [k]: the drafter's proposal x_1..x_k.
- ``draft_probs``      # [k, vocab] or None: the distribution each x_i was sampled from
  (the paper's q). None means a deterministic drafter: a point mass, q(x_i) = 1.
- ``target_probs``     # [k + 1, vocab]: the target's distribution at each drafted position
  and one past the last (the paper's p), from ONE forward pass over the block.

Left to right, x_i is accepted with probability min(1, target_probs[i, x_i] / draft_probs[i, x_i]).
At the first rejection the round ends with a **recovered** token sampled from
norm(max(0, target_probs[i] - draft_probs[i])); if all k are accepted, a **bonus** token is
sampled from target_probs[k]. A round therefore emits 1 to k + 1 tokens, and each emitted
token is distributed exactly as the target would have sampled it (the paper's Theorem 3.5).

Worked example (k = 2, vocab {a, b}): target_probs[0] = (0.6, 0.4), draft_probs[0] = (0.9, 0.1),
x_1 = a. Accept with probability 0.6 / 0.9 = 2/3; if rejected, the residual is
max(0, (0.6 - 0.9, 0.4 - 0.1)) = (0, 0.3) -> normalised (0, 1): the recovered token is b.
P(a) = 0.9 * 2/3 = 0.6, P(b) = 0.1 + 0.9 * 1/3 = 0.4: the target's distribution.

Greedy decoding is the point-mass case: accept while x_i == argmax(target at i); the token
that ends the round is the target's argmax there.

Coupled verification (``verify_coupled``; Daliri, Musco and Suresh 2024, "Coupling without
Communication and Drafter-Invariant Speculative Decoding") is the greedy rule applied to
keyed samples: each sequence position p has fixed noise E_p (``sampling.PositionNoise``),
the drafter drafts argmax(draft_probs / E_p) and the target's token at p is
argmax(target_probs / E_p), an exact sample from target_probs. Drafts are accepted while
they equal the target's tokens; the round ends with the target's token. Every emitted token
is the target's own keyed sample, so the output does not depend on k or on the drafter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specdec.sampling import argmax_rows, sample

# A distribution draft's residual with less mass than this is float noise (the two
# distributions are equal up to rounding): sampling from it would amplify the noise, so
# fall back to the target. A point-mass draft's residual is exact and never falls back.
RESIDUAL_EPSILON = 1e-6


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of one round. ``token_ids`` are the accepted drafts followed by the one
    token the target contributes, so ``len(token_ids) == num_accepted + 1``."""

    token_ids: list[int]
    num_accepted: int
    bonus: bool  # all drafts accepted: the last token came from target_probs[k]
    residual_fallback: bool = False  # the residual had no mass; sampled from the target
    path: tuple[int, ...] = ()  # a tree's accepted nodes (``verify_tree``), root's child first


def verify_greedy(
    draft_token_ids: torch.Tensor,  # [k] int64
    target_logits: torch.Tensor,  # [k + 1, vocab]
) -> VerifyResult:
    """Accept the longest prefix of drafts that equals the target's argmax."""
    k = draft_token_ids.shape[0]
    assert target_logits.shape[0] == k + 1, "target must score k + 1 positions"
    target_argmax = argmax_rows(target_logits)
    num_accepted = _leading_true(draft_token_ids == torch.tensor(target_argmax[:k]))
    token_ids = draft_token_ids[:num_accepted].tolist() + [target_argmax[num_accepted]]
    return VerifyResult(token_ids, num_accepted, bonus=num_accepted == k)


def verify_stochastic(
    draft_token_ids: torch.Tensor,  # [k] int64
    draft_probs: torch.Tensor | None,  # [k, vocab], None = point masses on the drafts
    target_probs: torch.Tensor,  # [k + 1, vocab]
    generator: torch.Generator,
) -> VerifyResult:
    """Modified rejection sampling (Algorithm 1). Uses k uniforms plus one sample."""
    k = draft_token_ids.shape[0]
    assert target_probs.shape[0] == k + 1, "target must score k + 1 positions"
    positions = torch.arange(k)
    # In float64, with 53-bit uniforms: a float32 uniform's 24 bits would never reject a
    # draft the target gives 1 - 1e-9, where it must once in 1e9 rounds.
    target_p = target_probs[positions, draft_token_ids].double()
    if draft_probs is None:
        # q = 1: accept with probability target_probs[x] / (the row's mass), so a row whose
        # other tokens all rounded to 0 (x has all of the mass) always accepts; then the
        # rejection's residual, the row without x, always has mass.
        draft_p = target_probs[:k].double().sum(dim=-1)
    else:
        assert draft_probs.shape == (k, target_probs.shape[1]), "draft/target vocab differ"
        draft_p = draft_probs[positions, draft_token_ids].double()
    uniforms = torch.rand(k, generator=generator, dtype=torch.float64)
    # u < p/q written without the division: q = 0 cannot happen for a sampled draft, and
    # p = 0 must always reject (u * q < 0 is false even for u = 0).
    accepted = uniforms * draft_p < target_p
    num_accepted = _leading_true(accepted)
    accepted_ids = draft_token_ids[:num_accepted].tolist()
    if num_accepted == k:
        bonus_id = sample(target_probs[k], generator)
        return VerifyResult(accepted_ids + [bonus_id], num_accepted, bonus=True)
    residual, fallback = residual_distribution(
        target_probs[num_accepted],
        None if draft_probs is None else draft_probs[num_accepted],
        int(draft_token_ids[num_accepted]),
    )
    recovered_id = sample(residual, generator)
    return VerifyResult(accepted_ids + [recovered_id], num_accepted, False, fallback)


def verify_coupled(
    draft_token_ids: torch.Tensor,  # [k] int64
    target_samples: Sequence[int],  # [k + 1]: the target's keyed sample at each scored row
) -> VerifyResult:
    """Accept the longest prefix of drafts equal to the target's keyed samples (the race of
    each row's distribution against its position's noise, ``Sampler.race``: what plain
    decoding emits there); the round ends with the target's sample. Samples are read in row
    order and only up to the first draft that differs (``sampling.KeyedSamples`` draws each
    when read)."""
    drafts = draft_token_ids.tolist()
    assert len(target_samples) == len(drafts) + 1, "one keyed sample per scored position"
    num_accepted = 0
    while num_accepted < len(drafts) and drafts[num_accepted] == target_samples[num_accepted]:
        num_accepted += 1
    token_ids = drafts[:num_accepted] + [int(target_samples[num_accepted])]
    return VerifyResult(token_ids, num_accepted, bonus=num_accepted == len(drafts))


def residual_distribution(
    target_probs: torch.Tensor,  # [vocab]
    draft_probs: torch.Tensor | None,  # [vocab], None = point mass on rejected_id
    rejected_id: int,
) -> tuple[torch.Tensor, bool]:
    """norm(max(0, target_probs - draft_probs)), and whether it fell back to the target.

    For a point-mass draft the residual is exactly the target with the rejected token
    removed, whatever its mass: ``verify_stochastic`` rejects such a draft only when the
    rest of the row has mass. Only a distribution draft whose residual is float noise
    (mass <= ``RESIDUAL_EPSILON``) falls back to the target.
    """
    if draft_probs is None:
        residual = target_probs.clone()
        residual[rejected_id] = 0.0
        mass = float(residual.sum())
        assert mass > 0, "a point-mass draft is rejected only where other tokens have mass"
        return residual / mass, False
    residual = torch.clamp(target_probs - draft_probs, min=0.0)
    mass = float(residual.sum())
    if mass <= RESIDUAL_EPSILON:
        return target_probs, True
    return residual / mass, False


def _leading_true(flags: torch.Tensor) -> int:
    """Length of the run of True at the start of a 1-D bool tensor."""
    if flags.numel() == 0:
        return 0
    # cumprod stays 1 until the first False, then 0 forever.
    return int(torch.cumprod(flags.to(torch.int64), dim=0).sum())
