"""The log-probabilities a request asks for (``SamplingParams.logprobs``): pure functions.

Which distribution: the target model's own, ``log_softmax`` of its raw logits, before
temperature, top-k and top-p. That is what vLLM returns by default (its ``raw_logprobs``) and
what OpenAI documents for its logprobs (the model's log-probability of each token). A
sampled token outside a top-k or top-p filter cannot occur, so every returned token has a
finite value.

They come from the rows the verify pass already scored (no extra pass): row ``i`` of a
round's logits is the distribution of the round's ``i``-th emitted token. Each row is
computed on its own (``row_logprobs``), so on the batch-invariant int8 and int4 runtimes a
token's values are the same bits whether its row was scored alone (plain decoding) or among
drafts (``tests/test_logprobs.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenLogprob:
    """One emitted token's log-probability, the ``top`` most likely tokens at its position,
    most likely first, as (token id, log-probability) pairs, and its ``rank`` in its row
    (1 + the tokens more likely than it, vLLM's)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    rank: int | None = None


def row_logprobs(logits_row: torch.Tensor) -> torch.Tensor:
    """log_softmax of one row of logits  # [vocab] -> [vocab] float32."""
    return torch.log_softmax(logits_row.float(), dim=-1)


def token_logprobs(logits: torch.Tensor, token_ids: Sequence[int], top: int) -> list[TokenLogprob]:
    """The log-probability of ``token_ids[i]`` under row ``i`` of ``logits``  # [>= n, vocab],
    its rank there and the ``top`` most likely tokens of that row. (The rank is a comparison
    over the row, about 0.1 ms for 151,936 tokens, a fifth of what a top-5 list costs.)"""
    out = []
    for i, token_id in enumerate(token_ids):
        row = row_logprobs(logits[i])
        best: tuple[tuple[int, float], ...] = ()
        if top:
            values, ids = torch.topk(row, top, sorted=True)
            best = tuple(zip(ids.tolist(), values.tolist(), strict=True))
        value = row[token_id]
        rank = int((row > value).sum()) + 1
        out.append(TokenLogprob(int(token_id), float(value), best, rank))
    return out
