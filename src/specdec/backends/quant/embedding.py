"""A token embedding kept in its GGUF blocks, rows dequantized when they are looked up.

Why: the float32 route kept the table as float32, 0.93 GB for the 1.5B and 0.55 GB for the
0.5B, in every int4/int8 runtime form on disk (half of the default pair's int4 forms) and,
on a first run, in memory. A lookup reads a few rows, so the table stays in the file's
format (Q4_K for the 1.5B, Q5_0 for the 0.5B: 0.13 and 0.10 GB) and each row looked up is
dequantized by gguf-py's ``dequantize`` on its own.

Exactness: every GGUF block format quantizes a row in blocks that do not cross rows, so a
row dequantized alone is that row of the whole table dequantized, bit for bit
(``tests/backends/quant/test_embedding.py``): the model is the float32 route's.
"""

from __future__ import annotations

import threading

import numpy as np
import torch
from torch import nn

# Rows kept once dequantized, for the one or few tokens of a decoding step: dequantizing a
# row through gguf-py's numpy code took 0.24 ms of a 0.5B step (measured inside the step,
# whose weights stream through the caches in between; 0.03 ms in a loop of lookups alone).
# 2,048 rows of the 1.5B: 12.6 MB. A pass of more tokens (a prompt) dequantizes its rows
# directly.
CACHED_ROWS = 2048
CACHED_LOOKUP = 16  # lookups of at most this many tokens go through the kept rows
_kept_lock = threading.Lock()  # a server's threads may look up at once


class BlockEmbedding(nn.Module):
    """``nn.Embedding``'s lookup over ``blocks``  # uint8 [vocab, bytes of a row] of GGUF
    ``ggml_type``; rows come out float32."""

    def __init__(self, blocks: torch.Tensor, ggml_type: int, embedding_dim: int):
        super().__init__()
        self.blocks, self.ggml_type = blocks, int(ggml_type)
        self.num_embeddings, self.embedding_dim = blocks.shape[0], embedding_dim
        self._kept: dict[int, torch.Tensor] = {}  # token -> its row, least recently used first

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        tokens = ids.reshape(-1).tolist()
        if not 0 < len(tokens) <= CACHED_LOOKUP:
            return self._rows(tokens).reshape(*ids.shape, self.embedding_dim)
        with _kept_lock:
            unique = list(dict.fromkeys(tokens))
            missing = [t for t in unique if t not in self._kept]
            fresh = dict(zip(missing, self._rows(missing), strict=True)) if missing else {}
            # every row this lookup uses moves to the newest end
            found = {t: fresh[t] if t in fresh else self._kept.pop(t) for t in unique}
            self._kept.update(found)
            while len(self._kept) > CACHED_ROWS:  # the least recently used go first
                del self._kept[next(iter(self._kept))]
            rows = [found[t] for t in tokens]  # this lookup's rows, whatever was dropped
        return torch.stack(rows).reshape(*ids.shape, self.embedding_dim)

    def _rows(self, tokens: list[int]) -> torch.Tensor:
        """The rows of ``tokens``, dequantized  # [len(tokens), embedding_dim] float32."""
        from gguf import GGMLQuantizationType, dequantize

        if not tokens:  # gguf-py cannot shape no blocks
            return torch.empty(0, self.embedding_dim)

        rows = dequantize(self.blocks.numpy()[tokens], GGMLQuantizationType(self.ggml_type))
        assert rows.shape[-1] == self.embedding_dim, "a row's blocks hold embedding_dim values"
        return torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float32)).reshape(
            len(tokens), self.embedding_dim
        )

    @property
    def weight(self) -> torch.Tensor:
        """The whole table in float32 (for what needs it as a tensor: the float32 route's
        ``weight``; 0.93 GB for the 1.5B, made on each call)."""
        return self.forward(torch.arange(self.num_embeddings))

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, ggml type {self.ggml_type}"
