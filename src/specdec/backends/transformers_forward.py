"""transformers' own forward: the runtime of a model specdec's layer stack does not run.

That is every model on the float runtimes (float32, bfloat16), and an int8 model where the
kernel does not build (no C++ compiler) or whose layers it does not fit. ``TransformersModel``
is the model, loaded once; each ``sequence()`` is a ``Backend`` with a ``DynamicCache`` of
its own. Its passes run one sequence at a time (the server's requests take turns).
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from specdec.backends.base import eos_token_ids


class TransformersModel:
    """A ``transformers`` causal LM (transformers 5.x) and its tokenizer, making sequences.

    >>> module = AutoModelForCausalLM.from_pretrained(path)  # doctest: +SKIP
    >>> TransformersModel(module, tokenizer).sequence().forward([1, 2, 3]).shape  # doctest: +SKIP
    torch.Size([3, vocab])
    """

    def __init__(self, model: Any, tokenizer: Any | None = None):
        self.model, self.tokenizer = model.eval(), tokenizer
        self.vocab_size = int(model.get_output_embeddings().out_features)  # the logits width
        self.eos_token_ids = frozenset(eos_token_ids(model, tokenizer))
        self.max_length = getattr(model.config, "max_position_embeddings", None)
        # transformers' causal LMs can skip the output layer for all but the last position
        self.can_keep_last = "logits_to_keep" in inspect.signature(model.forward).parameters

    def sequence(self) -> TransformersSequence:
        return TransformersSequence(self)


class TransformersSequence:
    """One token sequence of a ``TransformersModel``: a ``Backend`` over its ``DynamicCache``."""

    def __init__(self, source: TransformersModel):
        self.source = source
        self.model, self.tokenizer = source.model, source.tokenizer
        self.vocab_size, self.eos_token_ids = source.vocab_size, source.eos_token_ids
        self.max_length = source.max_length
        self._cache: DynamicCache | None = None
        self._cached_ids: list[int] = []
        self._hidden: _HiddenStates | None = None

    @property
    def cached_token_ids(self) -> Sequence[int]:
        return self._cached_ids

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    def keep_hidden_states(self) -> None:
        """From now on keep, for every cached position, the last layer's output after the
        final norm (the feature Medusa and EAGLE heads read), cut back by ``truncate`` like
        the cache. The cache restarts empty. Idempotent."""
        if self._hidden is None:
            self.truncate(0)
            self._hidden = _HiddenStates(_final_norm(self.model))

    def hidden_states(self, start: int = 0, end: int | None = None) -> torch.Tensor:
        """The kept features of cached positions ``start:end``  # [n, hidden_size] float32
        (a view: copy it to keep it past the next forward or truncate)."""
        if self._hidden is None:
            raise ValueError("hidden states are not kept: call keep_hidden_states() first")
        return self._hidden.rows(len(self._cached_ids))[start:end]

    @torch.inference_mode()
    def forward(self, token_ids: Sequence[int], last_only: bool = False) -> torch.Tensor:
        assert len(token_ids) > 0, "forward needs at least one token"
        if self._cache is None:
            self._cache = DynamicCache(config=self.model.config)
        input_ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self.device)
        keep = {"logits_to_keep": 1} if last_only and self.source.can_keep_last else {}
        try:
            out = self.model(input_ids=input_ids, cache=self._cache, use_cache=True, **keep)
        except BaseException:
            self._restore(len(self._cached_ids))  # layers run before the failure grew
            raise
        if self._hidden is not None:
            self._hidden.commit(len(self._cached_ids))
        self._cached_ids.extend(int(t) for t in token_ids)
        logits = out.logits[0, :, : self.vocab_size]
        return (logits[-1:] if last_only else logits).float()

    def _restore(self, n: int) -> None:
        """Cut every cache layer longer than ``n`` positions back to ``n``."""
        assert self._cache is not None, "a forward made the cache"
        for layer in self._cache.layers:
            if isinstance(layer, DynamicLayer) and layer.get_seq_length() > n:
                layer.crop(n - layer.get_seq_length())
        if self._hidden is not None:
            _OUTPUTS.pop(self._hidden._norm, None)  # a failed pass's features are not kept

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


class _HiddenStates:
    """A growing [positions, hidden] buffer of the final norm's outputs. The norm module
    gets ONE hook, however many sequences run the model (a server makes one per request);
    each sequence takes the output right after its own forward."""

    def __init__(self, norm: torch.nn.Module):
        self._buffer = torch.empty(0)
        self._norm = norm
        if norm not in _HOOKED:
            norm.register_forward_hook(_keep_output)
            _HOOKED.add(norm)

    def commit(self, start: int) -> None:
        """Store the features of the forward pass just run at positions ``start:``."""
        last = _OUTPUTS.pop(self._norm, None)
        assert last is not None, "the final norm did not run"
        rows = last.reshape(-1, last.shape[-1]).float()
        end = start + rows.shape[0]
        if self._buffer.shape[0] < end:
            grown = torch.empty(max(end, 2 * self._buffer.shape[0], 256), rows.shape[1])
            if start:
                grown[:start] = self._buffer[:start]
            self._buffer = grown
        self._buffer[start:end] = rows

    def rows(self, n: int) -> torch.Tensor:
        return self._buffer[:n]


_HOOKED: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
_OUTPUTS: weakref.WeakKeyDictionary[torch.nn.Module, torch.Tensor] = weakref.WeakKeyDictionary()


def _keep_output(module, inputs, output) -> None:
    _OUTPUTS[module] = output.detach()


def _final_norm(model: Any) -> torch.nn.Module:
    """The module whose output the output layer reads (transformers' decoder ``norm``)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    norm = getattr(decoder, "norm", None)
    if not isinstance(norm, torch.nn.Module):
        raise ValueError(
            f"{type(model).__name__}: no final norm found to read hidden states from "
            "(heads need a decoder with a .norm module, as Llama/Qwen/Mistral models have)"
        )
    return norm
