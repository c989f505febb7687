"""A layer's keys and values in buffers with room to grow: a pass writes its new rows in
place instead of concatenating the whole cache again.

Why: transformers' ``DynamicLayer`` (and the batched runtime's layer cache, which copied it)
concatenates every pass, so a step copies the whole cache of every layer: 56 copies a step
of the 1.5B, ~0.5 ms at 64 cached positions and growing with the text. The int4 runtime's
attention (``kernels/row_ops.cpp``) reads keys and values through their strides, so views
into a larger buffer cost nothing: its sequences (``batched.ModelSequence``, which
``HFModel`` uses for such models) keep their caches here. Keys and values are the same
numbers either way.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

MIN_CAPACITY = 256  # positions a buffer starts with; it doubles when full


class KVBuffer:
    """Keys and values  # [batch, kv_heads, capacity, head_dim] each, the first ``length``
    positions held; ``keys``/``values`` are views of those."""

    def __init__(self) -> None:
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None
        self.length = 0

    @property
    def keys(self) -> torch.Tensor | None:
        return None if self._keys is None else self._keys[:, :, : self.length]

    @property
    def values(self) -> torch.Tensor | None:
        return None if self._values is None else self._values[:, :, : self.length]

    @property
    def nbytes(self) -> int:
        """The memory its buffers take."""
        if self._keys is None or self._values is None:
            return 0
        return self._keys.nbytes + self._values.nbytes

    def update(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``keys``/``values``  # [batch, kv_heads, new, head_dim] after the held
        positions; returns views of all held positions."""
        end = self.length + keys.shape[-2]
        self.reserve(end, keys)
        assert self._keys is not None and self._values is not None
        self._keys[:, :, self.length : end] = keys
        self._values[:, :, self.length : end] = values
        self.length = end
        return self._keys[:, :, :end], self._values[:, :, :end]

    def reserve(self, end: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Room for ``end`` positions in buffers shaped as ``like``  # [batch, kv_heads, *,
        head_dim]; returns the whole buffers, for a writer (``layer_stack``) that fills
        positions ``length .. end - 1`` and then sets ``length``."""
        if self._keys is None or self._values is None or self._keys.shape[-2] < end:
            self._grow(like, end)
        assert self._keys is not None and self._values is not None
        return self._keys, self._values

    def crop(self, n: int) -> None:
        """Hold the first ``n`` positions (at most the held ones)."""
        self.length = min(self.length, max(n, 0))

    def keep_path(self, start: int, rows: Sequence[int]) -> None:
        """Hold the first ``start`` positions and then those at ``start + r`` for each of
        ``rows`` (increasing, ``rows[j] >= j``), moved to ``start + j``: a draft tree's
        accepted path, its other nodes dropped."""
        assert self._keys is not None and self._values is not None
        assert start + (rows[-1] if rows else -1) < self.length, "rows the buffer holds"
        for j, row in enumerate(rows):
            if row != j:
                self._keys[:, :, start + j] = self._keys[:, :, start + row]
                self._values[:, :, start + j] = self._values[:, :, start + row]
        self.length = start + len(rows)

    def copy_prefix(self, donor: KVBuffer, n: int) -> None:
        """Hold a copy of the first ``n`` positions of ``donor`` (which goes on changing)."""
        assert donor._keys is not None and donor._values is not None and n <= donor.length
        self._keys = donor._keys[:, :, : max(n, MIN_CAPACITY)].clone()
        self._values = donor._values[:, :, : max(n, MIN_CAPACITY)].clone()
        self.length = n

    def _grow(self, like: torch.Tensor, needed: int) -> None:
        held = 0 if self._keys is None else self._keys.shape[-2]
        capacity = max(needed, 2 * held, MIN_CAPACITY)
        shape = (*like.shape[:-2], capacity, like.shape[-1])
        keys = like.new_empty(shape)
        values = like.new_empty(shape)
        if self._keys is not None and self._values is not None and self.length:
            keys[:, :, : self.length] = self._keys[:, :, : self.length]
            values[:, :, : self.length] = self._values[:, :, : self.length]
        self._keys, self._values = keys, values
