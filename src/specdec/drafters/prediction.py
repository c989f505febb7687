"""Predicted outputs (OpenAI's ``prediction``): the client sends the text it expects the
output to be, mostly (a file regenerated with a few changes), and its tokens are the drafts.

The drafter follows the output through the prediction: while the output is the prediction's
beginning, or has written all of the last proposal and what follows it in the prediction,
the next tokens are proposed; where the output parts from it (the change), nothing is
proposed until the output's last tokens are found in the prediction again (the longest
match first, from ``max_ngram`` down to ``min_ngram`` tokens; of its places, the first past
where the output parted, so that a text that repeats lines is followed in order), and the
prediction goes on from there. Deterministic: verified as point masses, so the output stays
exactly the target's.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from specdec.backends.base import common_prefix_length
from specdec.drafters.base import KeepGoing, Proposal
from specdec.sampling import Sampler

PREDICTION = "prediction"  # the drafter's name, in a request's ``SpecStats.by_drafter``


def predicted_ids(tokenizer, text: str) -> list[int]:
    """A predicted output's token ids: its text encoded as output is (no special tokens
    added in front)."""
    return list(tokenizer.encode(text, add_special_tokens=False))


class Prediction:
    """A predicted output's token ids and where each of its n-grams (``min_ngram`` to
    ``max_ngram`` tokens) ends, where a continuation follows. Made once a request (0.45 s
    for 32,000 tokens: a server makes it off its scheduler's thread) and read by the drafter
    of each of its choices."""

    def __init__(self, token_ids: Sequence[int], max_ngram: int = 8, min_ngram: int = 2):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}")
        self.token_ids = [int(t) for t in token_ids]
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.ends: dict[tuple[int, ...], list[int]] = {}
        tokens = self.token_ids
        for end in range(1, len(tokens)):
            for n in range(min_ngram, min(max_ngram, end) + 1):
                self.ends.setdefault(tuple(tokens[end - n : end]), []).append(end)


class PredictionDrafter:
    """Drafts from ``prediction`` (its token ids, or a ``Prediction`` made of them) for one
    request whose prompt has ``prompt_tokens`` tokens.

    >>> drafter = PredictionDrafter([7, 8, 9, 10, 11], prompt_tokens=2)
    >>> drafter.propose([1, 2], k=3).token_ids  # nothing written yet: the beginning
    [7, 8, 9]
    >>> drafter.propose([1, 2, 7, 8, 5, 9, 10], k=3).token_ids  # 5 was a change: back after 9 10
    [11]
    """

    name = PREDICTION
    vocab_size = None  # copies token ids: works with any vocabulary

    def __init__(self, prediction: Prediction | Sequence[int], prompt_tokens: int):
        self.indexed = prediction if isinstance(prediction, Prediction) else Prediction(prediction)
        self.prediction = self.indexed.token_ids
        self.prompt_tokens = prompt_tokens
        # the last proposal: where in the prediction it came from, and the output's length then
        self._from = 0
        self._written: int | None = None

    def prepare(self, context: Sequence[int]) -> None:
        """Nothing to fill: the prediction was indexed before."""

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampler: Sampler | None = None,
        keep_going: KeepGoing | None = None,
    ) -> Proposal:
        output = context[self.prompt_tokens :]
        at = self.position(output)
        if at is None or k <= 0:
            return Proposal([], drafter=self.name)
        self._from, self._written = at, len(output)
        return Proposal(self.prediction[at : at + k], drafter=self.name)

    def position(self, output: Sequence[int]) -> int | None:
        """Where in the prediction ``output`` (the text written so far) has reached: its
        length while it is the prediction's beginning; past the last proposal where the
        output has written what the prediction has there; else the end of the place of its
        longest tail n-gram (the first past where it parted from the prediction, or the
        last); None where its tail is nowhere in the prediction, or the prediction is all
        written."""
        predicted, written = self.prediction, len(output)
        if written <= len(predicted) and list(output) == predicted[:written]:
            return written if written < len(predicted) else None
        parted = 0  # where the output parted from the prediction
        if self._written is not None and self._written <= written:
            since = output[self._written :]
            ahead = predicted[self._from : self._from + len(since)]
            same = common_prefix_length(since, ahead)
            if same == len(since):  # in step since the last proposal
                at = self._from + same
                return at if at < len(predicted) else None
            parted = self._from + same
        indexed = self.indexed
        tail = tuple(output[-indexed.max_ngram :])
        for n in range(min(indexed.max_ngram, len(tail)), indexed.min_ngram - 1, -1):
            ends = indexed.ends.get(tail[-n:])
            if ends:
                i = bisect_left(ends, parted + 1)
                return ends[i] if i < len(ends) else ends[-1]
        return None
