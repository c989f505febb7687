"""A transformers model as specdec runs it: ``model_of`` gives the model that makes its
sequences, and ``HFModel`` (the public name) is one sequence of it, a ``Backend``.

Which runtime runs the model is decided here, once: specdec's layer stack
(``backends/batched.py``: int8 and int4 with the kernel, every sequence's keys and values in
``KVBuffer``s, passes of many sequences at once) where it runs the model's layers, else
transformers' own forward (``backends/transformers_forward.py``). On a model both can run they
give the same logits bit for bit (``tests/backends/test_layer_stack.py``); the stack skips
transformers' per-pass setup of masks, cache objects and outputs (about 0.5-1 ms a pass of
the 1.5B and of the 0.5B, measured) and writes its caches in place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from specdec.backends.base import Backend
from specdec.backends.batched import BatchedModel, supports
from specdec.backends.transformers_forward import TransformersModel


def model_of(model: Any, tokenizer: Any | None = None) -> BatchedModel | TransformersModel:
    """The model a transformers module ``model`` makes sequences of: on the layer stack where
    it runs the module's layers, else on transformers' forward."""
    if supports(model):
        return BatchedModel(model, tokenizer)
    return TransformersModel(model, tokenizer)


class HFModel:
    """One sequence (a ``Backend``) of a ``transformers`` causal LM, on whichever runtime
    ``model_of`` gives it. ``source`` is that model; ``source.sequence()`` makes more
    sequences over the same weights.

    >>> model = HFModel(AutoModelForCausalLM.from_pretrained(path), tokenizer)  # doctest: +SKIP
    >>> model.forward([1, 2, 3]).shape   # doctest: +SKIP
    torch.Size([3, vocab])
    """

    def __init__(self, model: Any, tokenizer: Any | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.source = model_of(model, tokenizer)
        self._sequence = self.source.sequence()
        self.vocab_size = self._sequence.vocab_size
        self.eos_token_ids = self._sequence.eos_token_ids
        self.max_length = self._sequence.max_length

    @property
    def cached_token_ids(self) -> Sequence[int]:
        return self._sequence.cached_token_ids

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def hidden_size(self) -> int:
        return self._sequence.hidden_size

    def keep_hidden_states(self) -> None:
        """From now on keep, for every cached position, the last layer's output after the
        final norm (the feature Medusa and EAGLE heads read), cut back by ``truncate`` like
        the cache. The cache restarts empty. Idempotent."""
        self._sequence.keep_hidden_states()

    def hidden_states(self, start: int = 0, end: int | None = None) -> torch.Tensor:
        """The kept features of cached positions ``start:end``  # [n, hidden_size] float32
        (a view: copy it to keep it past the next forward or truncate)."""
        return self._sequence.hidden_states(start, end)

    def forward(self, token_ids: Sequence[int], last_only: bool = False) -> torch.Tensor:
        return self._sequence.forward(token_ids, last_only)

    def truncate(self, n: int) -> None:
        self._sequence.truncate(n)

    @property
    def scores_trees(self) -> bool:
        """Whether a draft tree can be scored in one pass here (specdec's layer stack)."""
        return bool(getattr(self._sequence, "scores_trees", False))

    def forward_tree(self, token_ids: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """``batched.ModelSequence.forward_tree``, where ``scores_trees``."""
        return self._sequence.forward_tree(token_ids, parents)  # type: ignore[union-attr]

    def keep_path(self, start: int, rows: Sequence[int]) -> None:
        self._sequence.keep_path(start, rows)  # type: ignore[union-attr]


def source_of(backend: Backend) -> Any:
    """The model ``backend`` is a sequence of (its ``sequence()`` makes more): an
    ``HFModel``'s ``source``; a llama.cpp model is its own (it is model and sequence)."""
    return backend.source if isinstance(backend, HFModel) else backend
