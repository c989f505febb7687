"""Prompt lookup: copy what followed the latest earlier occurrence of the context's tail.

Input-grounded tasks (editing code, summarising, RAG) repeat long spans of the prompt; the
continuation of a matching n-gram is a free, often long, draft. Deterministic: verified as a
point mass, so sampling stays exact.
"""

from __future__ import annotations

from collections.abc import Sequence

from specdec.drafters.base import KeepGoing, Proposal
from specdec.sampling import Sampler


class PromptLookupDrafter:
    """Longest match first, from ``max_ngram`` down to ``min_ngram`` tokens.

    An index maps every n-gram to the end of its latest occurrence that has a continuation,
    and is extended with new tokens only, so a proposal costs O(new tokens), not O(context).

    >>> drafter = PromptLookupDrafter(max_ngram=2)
    >>> drafter.propose([5, 6, 7, 8, 1, 5, 6], k=3).token_ids
    [7, 8, 1]
    """

    name = "lookup"
    vocab_size = None  # copies token ids: works with any vocabulary

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self._tokens: list[int] = []
        self._latest_end: dict[tuple[int, ...], int] = {}

    def prepare(self, context: Sequence[int]) -> None:
        self._sync(context)

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampler: Sampler | None = None,
        keep_going: KeepGoing | None = None,
    ) -> Proposal:
        if k <= 0:
            return Proposal([], drafter=self.name)
        self._sync(context)
        tokens = self._tokens
        for n in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            end = self._latest_end.get(tuple(tokens[-n:]))
            if end is not None:
                return Proposal(tokens[end : end + k], drafter=self.name)
        return Proposal([], drafter=self.name)

    def _sync(self, context: Sequence[int]) -> None:
        """Extend the index with the tokens ``context`` adds; rebuild if it is not an extension."""
        known = len(self._tokens)
        if len(context) < known or list(context[:known]) != self._tokens:
            self._tokens, self._latest_end, known = [], {}, 0
        self._tokens.extend(int(t) for t in context[known:])
        tokens = self._tokens
        # An n-gram ending at `end` has a continuation once tokens[end] exists: end <= len - 1.
        for end in range(max(1, known), len(tokens)):
            for n in range(self.min_ngram, min(self.max_ngram, end) + 1):
                self._latest_end[tuple(tokens[end - n : end])] = end
