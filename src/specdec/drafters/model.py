"""Drafting with a small model of the same family, over its own KV cache."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.backends.base import Backend, common_prefix_length, sync_cache
from specdec.config import SamplingParams
from specdec.drafters.base import Drafting, KeepGoing, Proposal, StepwiseDrafter
from specdec.sampling import Sampler

_GREEDY = SamplingParams(temperature=0.0)


class ModelDrafter(StepwiseDrafter):
    """Samples k tokens autoregressively from a draft model.

    Its cache follows the accepted text lazily: each ``propose`` rolls the cache back to the
    longest prefix it shares with ``context`` and feeds what is missing. After a round in
    which all k drafts were accepted, that is the last draft (never fed) plus the bonus
    token; after a rejection, just the recovered token.
    """

    name = "model"

    def __init__(self, backend: Backend):
        self.backend = backend
        self.vocab_size = backend.vocab_size

    def prepare(self, context: Sequence[int]) -> None:
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
    ) -> Drafting:
        """``propose``, one draft pass per step (see ``drafters.base.Drafting``)."""
        assert len(context) > 0, "drafting needs a context"
        sampler = sampler or Sampler(_GREEDY)
        if self.backend.max_length is not None:
            k = min(k, self.backend.max_length - len(context))
        if k <= 0:
            return Proposal([], drafter=self.name)
        # Keep at least the last context token unfed: its logits give the first draft.
        keep = min(common_prefix_length(self.backend.cached_token_ids, context), len(context) - 1)
        self.backend.truncate(keep)
        logits = (yield (self.backend, list(context[keep:])))[-1]
        token_ids: list[int] = []
        probs: list[torch.Tensor] = []
        confidences: list[float] = []
        while True:
            token_id, token_probs = sampler.pick(logits, len(context) + len(token_ids))
            token_ids.append(token_id)
            if token_probs is not None:
                probs.append(token_probs)
            if keep_going is not None:
                confidences.append(_confidence(logits, token_id, token_probs))
                if len(token_ids) < k and not keep_going(confidences):
                    break
            if len(token_ids) == k:
                break
            logits = (yield (self.backend, [token_id]))[-1]
        return Proposal(
            token_ids,
            torch.stack(probs) if probs else None,
            self.name,
            confidences if keep_going is not None else None,
        )


def _confidence(logits: torch.Tensor, token_id: int, probs: torch.Tensor | None) -> float:
    """The draft's probability of its own token: from the sampled distribution, or the
    softmax of the raw logits when greedy."""
    if probs is None:
        probs = torch.softmax(logits.float(), dim=-1)
    return float(probs[token_id])
