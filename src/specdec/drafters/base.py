"""The drafter protocol: ``propose(context, k, sampler) -> Proposal``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from specdec.sampling import Sampler

KeepGoing = Callable[[list[float]], bool]


@dataclass(frozen=True)
class Proposal:
    """Up to k drafted tokens. ``draft_probs`` is the distribution each token was sampled
    from (``[len(token_ids), vocab]``), or None for a deterministic proposal (point masses)."""

    token_ids: list[int]
    draft_probs: torch.Tensor | None = None
    drafter: str = ""  # which drafter proposed it (a composite drafter names its member)
    confidences: list[float] | None = None  # the drafter's probability of each of its tokens

    def __post_init__(self) -> None:
        if self.draft_probs is not None:
            assert self.draft_probs.shape[0] == len(self.token_ids), "one distribution per draft"


@runtime_checkable
class Drafter(Protocol):
    name: str

    @property
    def vocab_size(self) -> int | None:
        """Width of ``draft_probs`` rows; None: works on any vocabulary (e.g. lookup)."""
        ...

    def prepare(self, context: Sequence[int]) -> None:
        """Called once per request with the prompt, during prefill: a drafter with a cache
        fills it here, so that drafting costs (which steer adaptive k) exclude it."""
        ...

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampler: Sampler | None = None,
        keep_going: KeepGoing | None = None,
    ) -> Proposal:
        """Draft at most k tokens following ``context`` (prompt + accepted output).

        A drafter that drafts token by token may call ``keep_going(confidences)`` after each
        token and stop early when it returns False; others may ignore it.
        """
        ...
