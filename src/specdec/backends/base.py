"""The backend protocol: a model plus its KV cache over ONE growing token sequence; and the
model protocol: weights loaded once, making such sequences.

``forward(token_ids)`` appends tokens to the cache and returns logits for every new
position (or only the last, with ``last_only``); ``truncate(n)`` keeps the first n cached
positions and is the only rollback.
The backend remembers which tokens its cache holds (``cached_token_ids``), so callers can
reuse a shared prefix instead of re-running it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class Backend(Protocol):
    vocab_size: int  # width of the logits rows
    eos_token_ids: frozenset[int]
    tokenizer: Any | None  # something with encode/decode, or None
    max_length: int | None  # positions the model supports, None if unbounded

    @property
    def cached_token_ids(self) -> Sequence[int]: ...

    def forward(self, token_ids: Sequence[int], last_only: bool = False) -> torch.Tensor:
        """Append ``token_ids`` to the cache; logits  # [len(token_ids), vocab_size] float32,
        or [1, vocab_size] for the last position alone when ``last_only`` (a prefill, or a
        drafter that needs only the next token; runtimes then skip the other rows)."""
        ...

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` cached positions (0 <= n <= len(cached_token_ids))."""
        ...


@runtime_checkable
class Model(Protocol):
    """Weights on a runtime, loaded once. Each ``sequence()`` is a new, empty ``Backend``
    with a KV cache of its own over them (a request, a draft): ``batched.BatchedModel``
    (specdec's layer stack; its ``forward_many`` scores many sequences in one pass),
    ``transformers_forward.TransformersModel``, ``llamacpp.LlamaCppModel``."""

    tokenizer: Any | None
    max_length: int | None  # positions the model supports, None if unbounded

    def sequence(self) -> Backend: ...


def common_prefix_length(cached: Sequence[int], tokens: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences.

    Compared in C-speed list compares of blocks that double (64 tokens, then 128, ...): a
    cache that is a prefix of ``tokens`` (the usual case) costs about one compare of it all,
    and two texts that part early (a server's donors, mostly) a compare of their first block,
    not of their whole length; only the block where they part is walked token by token.
    """
    n = min(len(cached), len(tokens))
    start, size = 0, 64
    while start < n:
        end = min(n, start + size)
        if list(cached[start:end]) != list(tokens[start:end]):
            for i in range(start, end):
                if cached[i] != tokens[i]:
                    return i
        start, size = end, size * 2
    return n


def sync_cache(backend: Backend, tokens: Sequence[int], most: int | None = None) -> int:
    """Make the cache hold exactly ``tokens``: keep the prefix it shares with them, feed the
    rest. ``most``: feed at most that many (a part of a prefill; the cache then holds a
    prefix of ``tokens``, and a later call goes on from it). Returns how many tokens a
    forward pass fed (0: none ran)."""
    keep = held_prefix(backend, tokens)
    if keep == len(tokens):
        return 0
    end = len(tokens) if most is None else min(len(tokens), keep + max(most, 1))
    backend.forward(list(tokens[keep:end]), last_only=True)
    return end - keep


def sync_cache_scoring_last(backend: Backend, tokens: Sequence[int]) -> torch.Tensor:
    """``sync_cache`` of all of ``tokens`` in one pass that feeds at least the last of them
    (the cache is cut back by one where it held them all): the logits after the last
    # [1, vocab_size]."""
    assert tokens, "tokens to score"
    keep = min(held_prefix(backend, tokens), len(tokens) - 1)
    backend.truncate(keep)
    return backend.forward(list(tokens[keep:]), last_only=True)


def held_prefix(backend: Backend, tokens: Sequence[int]) -> int:
    """Keep (or, where the backend can, copy from another sequence: ``reuse_prefix``) the
    longest prefix of ``tokens`` held; its length."""
    reuse = getattr(backend, "reuse_prefix", None)  # a backend that can copy a shared prefix
    if reuse is not None:
        return int(reuse(tokens))
    keep = common_prefix_length(backend.cached_token_ids, tokens)
    backend.truncate(keep)
    return keep


def shareable_prefixes(backend: Backend) -> list[Sequence[int]]:
    """The token ids whose prefixes ``held_prefix`` can give ``backend`` without computing
    them: its cache's, and, where the backend can copy from other sequences, theirs."""
    shareable = getattr(backend, "shareable_prefixes", None)
    return list(shareable()) if shareable is not None else [backend.cached_token_ids]


def eos_token_ids(model: Any, tokenizer: Any | None) -> set[int]:
    """EOS ids from the generation config (which may list several), else the tokenizer."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        if eos is None:
            continue
        ids.update([eos] if isinstance(eos, int) else eos)
    return ids
