"""An n-gram language model as a drafter, built from a token corpus.

It drafts with real ``draft_probs`` (its backed-off next-token distribution, passed through
the request's temperature / top-k / top-p), so stochastic verification stays exact and
gains acceptance at temperature > 0. Greedy requests draft its argmax.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from specdec.config import SamplingParams
from specdec.drafters.base import KeepGoing, Proposal
from specdec.sampling import Sampler

_GREEDY = SamplingParams(temperature=0.0)
FORMAT = "specdec-ngram-1"


class NGramModel:
    """Counts of next tokens after each context of 0 .. order-1 tokens; stupid-backoff style:
    the longest context seen in training decides the distribution."""

    def __init__(
        self,
        order: int,
        vocab_size: int,
        counts: dict[tuple[int, ...], Counter] | None = None,
        tokenizer_name: str = "",
    ):
        if order < 2:
            raise ValueError(f"order must be >= 2 (2 = bigram), got {order}")
        self.order = order
        self.vocab_size = vocab_size
        self.tokenizer_name = tokenizer_name
        self.counts: dict[tuple[int, ...], Counter] = (
            counts if counts is not None else defaultdict(Counter)
        )

    @classmethod
    def build(
        cls,
        sequences: Iterable[Sequence[int]],
        order: int,
        vocab_size: int,
        tokenizer_name: str = "",
    ) -> NGramModel:
        model = cls(order, vocab_size, tokenizer_name=tokenizer_name)
        for sequence in sequences:
            tokens = [int(t) for t in sequence]
            for position, token in enumerate(tokens):
                for n in range(0, min(order - 1, position) + 1):
                    model.counts[tuple(tokens[position - n : position])][token] += 1
        return model

    def next_counts(self, context: Sequence[int]) -> Counter:
        for n in range(min(self.order - 1, len(context)), -1, -1):
            found = self.counts.get(tuple(context[len(context) - n :]))
            if found:
                return found
        return Counter()

    def probs(self, context: Sequence[int]) -> torch.Tensor:
        """The next-token distribution  # [vocab_size]; uniform if nothing was seen at all."""
        counts = self.next_counts(context)
        probs = torch.zeros(self.vocab_size)
        if not counts:
            return probs + 1.0 / self.vocab_size
        ids = torch.tensor(list(counts.keys()))
        probs[ids] = torch.tensor(list(counts.values()), dtype=torch.float32)
        return probs / probs.sum()

    def save(self, path: str | Path) -> None:
        rows = [
            [list(context), {str(t): c for t, c in counter.items()}]
            for context, counter in self.counts.items()
        ]
        payload = {
            "format": FORMAT,
            "order": self.order,
            "vocab_size": self.vocab_size,
            "tokenizer": self.tokenizer_name,
            "counts": rows,
        }
        Path(path).write_text(json.dumps(payload))

    @classmethod
    def load(cls, path: str | Path) -> NGramModel:
        try:
            payload = json.loads(Path(path).read_text())
        except (OSError, ValueError) as error:
            raise ValueError(f"cannot read n-gram model {path}: {error}") from None
        if payload.get("format") != FORMAT:
            raise ValueError(
                f"{path} is not a specdec n-gram model (format {payload.get('format')!r})"
            )
        counts = {
            tuple(context): Counter({int(t): c for t, c in counter.items()})
            for context, counter in payload["counts"]
        }
        return cls(payload["order"], payload["vocab_size"], counts, payload.get("tokenizer", ""))


class NGramDrafter:
    name = "ngram"

    def __init__(self, model: NGramModel):
        self.model = model
        self.vocab_size = model.vocab_size

    def prepare(self, context: Sequence[int]) -> None:
        pass  # nothing to precompute

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampler: Sampler | None = None,
        keep_going: KeepGoing | None = None,
    ) -> Proposal:
        sampler = sampler or Sampler(_GREEDY)
        history = list(context[-(self.model.order - 1) :]) if self.model.order > 1 else []
        token_ids: list[int] = []
        probs: list[torch.Tensor] = []
        for _ in range(max(0, k)):
            if sampler.greedy:
                counts = self.model.next_counts(history)
                if not counts:
                    break  # nothing seen: no draft beats a wasted one
                token_id = max(counts, key=lambda t: (counts[t], -t))
            else:
                # log(0) = -inf keeps unseen tokens impossible through any filter.
                logits = torch.log(self.model.probs(history))
                token_id, token_probs = sampler.pick(logits, len(context) + len(token_ids))
                assert token_probs is not None, "sampling returns the distribution it drew from"
                probs.append(token_probs)
            token_ids.append(token_id)
            history = (history + [token_id])[-(self.model.order - 1) :]
        return Proposal(token_ids, torch.stack(probs) if probs else None, self.name)
