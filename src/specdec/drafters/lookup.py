"""Prompt lookup: copy what followed the latest earlier occurrence of the context's tail.

Input-grounded tasks (editing code, summarising, RAG) repeat long spans of the prompt; the
continuation of a matching n-gram is a free, often long, draft. Deterministic: verified as a
point mass, so sampling stays exact.

In front of another drafter (``lookup+eagle``) a match must be 2+ tokens long unless
``min_ngram`` says otherwise: a 1-token match is a weak guess where the drafter behind it is
a good one. Replayed on the greedy outputs of the bench's four workloads (1.5B target, 4
prompts each, k = 4, ``bench/lookup_matches.py``): after a 1-token match the copied draft
gave 0.18 (chat), 0.52 (code), 0.17 (editing) and 1.04 (summaries) accepted tokens a round,
after a 2-token match 0.80, 0.64, 1.67 and 2.86, after 3+ tokens 2.9-3.6 on editing and
summaries; EAGLE's drafts are accepted 0.4-0.7 a round (docs/notes/heads.md, "Prompt lookup in
front").
"""

from __future__ import annotations

from collections.abc import Sequence

from specdec.drafters.base import KeepGoing, Proposal
from specdec.sampling import Sampler

IN_FRONT_MIN_NGRAM = 2  # the shortest match taken in front of another drafter (module doc)


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

    def __init__(self, max_ngram: int = 3, min_ngram: int | None = None):
        """``min_ngram`` None: 1 alone, ``IN_FRONT_MIN_NGRAM`` in front of another drafter."""
        if min_ngram is not None and not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}")
        if max_ngram < 1:
            raise ValueError(f"need max_ngram >= 1, got {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = 1 if min_ngram is None else min_ngram
        self._min_ngram_given = min_ngram is not None
        self._tokens: list[int] = []
        self._latest_end: dict[tuple[int, ...], int] = {}

    def put_in_front(self) -> None:
        """Another drafter drafts where this one finds no match (``FallbackDrafter`` calls
        this before any drafting): take matches of ``IN_FRONT_MIN_NGRAM``+ tokens only,
        unless ``min_ngram`` was given."""
        if not self._min_ngram_given:
            self.min_ngram = min(IN_FRONT_MIN_NGRAM, self.max_ngram)

    def prepare(self, context: Sequence[int]) -> None:
        self._sync(context)

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampler: Sampler | None = None,
        keep_going: KeepGoing | None = None,
    ) -> Proposal:
        return Proposal(self.continuation(context, (), k), drafter=self.name)

    def continuation(self, context: Sequence[int], after: Sequence[int], k: int) -> list[int]:
        """Up to k tokens: what followed the latest earlier occurrence in ``context`` of the
        tail of ``context`` and then ``after`` (drafts, not text yet: matched, not indexed,
        so the index stays the text's as rounds accept and reject them).

        >>> PromptLookupDrafter(max_ngram=2).continuation([5, 6, 7, 8, 1, 5], [6], 2)
        [7, 8]
        """
        if k <= 0:
            return []
        self._sync(context)
        tokens = self._tokens
        tail = (tokens[-self.max_ngram :] + list(after))[-self.max_ngram :]
        longest = min(self.max_ngram, len(tokens) + len(after) - 1)
        for n in range(longest, self.min_ngram - 1, -1):
            end = self._latest_end.get(tuple(tail[-n:]))
            if end is not None:
                return tokens[end : end + k]
        return []

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
