"""Drafting with a small model of the same family, over its own KV cache."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.backends.base import Backend, common_prefix_length
from specdec.config import SamplingParams
from specdec.drafters.base import Proposal
from specdec.sampling import Sampler

_GREEDY = SamplingParams(temperature=0.0)


class ModelDrafter:
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

    def propose(self, context: Sequence[int], k: int, sampler: Sampler | None = None) -> Proposal:
        assert len(context) > 0, "drafting needs a context"
        sampler = sampler or Sampler(_GREEDY)
        if self.backend.max_length is not None:
            k = min(k, self.backend.max_length - len(context))
        if k <= 0:
            return Proposal([], drafter=self.name)
        # Keep at least the last context token unfed: its logits give the first draft.
        keep = min(common_prefix_length(self.backend.cached_token_ids, context), len(context) - 1)
        self.backend.truncate(keep)
        logits = self.backend.forward(context[keep:])[-1]
        token_ids: list[int] = []
        probs: list[torch.Tensor] = []
        while True:
            token_id, token_probs = sampler.pick(logits)
            token_ids.append(token_id)
            if token_probs is not None:
                probs.append(token_probs)
            if len(token_ids) == k:
                break
            logits = self.backend.forward([token_id])[-1]
        return Proposal(token_ids, torch.stack(probs) if probs else None, self.name)
