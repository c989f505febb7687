"""Hugging Face transformers runtime: any causal LM instance behind ``Backend``."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache


class HFModel:
    """Wraps a ``transformers`` causal LM with a ``DynamicCache`` (transformers 5.x).

    >>> model = HFModel(AutoModelForCausalLM.from_pretrained(path), tokenizer)  # doctest: +SKIP
    >>> model.forward([1, 2, 3]).shape   # doctest: +SKIP
    torch.Size([3, vocab])
    """

    def __init__(self, model: Any, tokenizer: Any | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.vocab_size = int(model.get_output_embeddings().out_features)  # the logits width
        self.eos_token_ids = frozenset(_eos_token_ids(model, tokenizer))
        self.max_length = getattr(model.config, "max_position_embeddings", None)
        self._cache: DynamicCache | None = None
        # transformers' causal LMs can skip the output layer for all but the last position
        self._can_keep_last = "logits_to_keep" in inspect.signature(model.forward).parameters
        self._cached_ids: list[int] = []

    @property
    def cached_token_ids(self) -> Sequence[int]:
        return self._cached_ids

    @property
    def device(self) -> torch.device:
        return self.model.device

    @torch.inference_mode()
    def forward(self, token_ids: Sequence[int], last_only: bool = False) -> torch.Tensor:
        assert len(token_ids) > 0, "forward needs at least one token"
        if self._cache is None:
            self._cache = DynamicCache(config=self.model.config)
        input_ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self.device)
        keep = {"logits_to_keep": 1} if last_only and self._can_keep_last else {}
        out = self.model(input_ids=input_ids, cache=self._cache, use_cache=True, **keep)
        self._cached_ids.extend(int(t) for t in token_ids)
        logits = out.logits[0, :, : self.vocab_size]
        return (logits[-1:] if last_only else logits).float()

    def truncate(self, n: int) -> None:
        assert 0 <= n <= len(self._cached_ids), f"cannot keep {n} of {len(self._cached_ids)}"
        drop = len(self._cached_ids) - n
        if drop == 0:
            return
        if n == 0:
            self._cache = None  # an empty cache is a new one; cropping to zero is not needed
        else:
            assert self._cache is not None, "cached tokens imply a cache"
            self._cache.crop(-drop)  # transformers 5.x: a negative count removes from the end
        del self._cached_ids[n:]


def _eos_token_ids(model: Any, tokenizer: Any | None) -> set[int]:
    """EOS ids from the generation config (which may list several), else the tokenizer."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        if eos is None:
            continue
        ids.update([eos] if isinstance(eos, int) else eos)
    return ids
