"""A one-token step's memory floor: the bytes a step must read over what this machine reads a
second.

On these CPUs a decoding step is bound by memory: every weight is read once a step, so no
step can beat ``step_bytes(model) / read_bandwidth()``. How far a step is from that floor
says what a faster kernel could still win, and what only fewer bytes could (``specdec
doctor --floor``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from specdec.backends.quant.int4 import RowInt4Linear
from specdec.backends.quant.int8 import RowInt8Linear

# Twice the largest last-level cache a machine here has reported (480 MiB on the Xeon): the
# sum's reads come from memory.
BANDWIDTH_BYTES = 1 << 30


def read_bandwidth(size: int = BANDWIDTH_BYTES, repeats: int = 5) -> float:
    """Bytes a second this process reads from memory with torch's threads: the fastest of
    ``repeats`` sums over a buffer of ``size`` bytes (written first, so that its pages exist)."""
    buffer = torch.ones(size // 4, dtype=torch.float32)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - started)
    return size / best


def step_bytes(model: nn.Module) -> int:
    """The bytes of weights a one-token step of ``model`` reads: every linear layer's weight
    in the form the runtime stores it (int4 blocks, int8 rows with their scales, float),
    every norm's and bias's, and one row of the input embedding table. Tensors shared by two
    modules (tied embeddings) count once; the KV cache (small at short contexts) not at all."""
    seen: set[int] = set()
    total = 0

    def count(tensor: torch.Tensor | None) -> int:
        if tensor is None or tensor.data_ptr() in seen:
            return 0
        seen.add(tensor.data_ptr())
        return tensor.numel() * tensor.element_size()

    for module in model.modules():
        if isinstance(module, RowInt4Linear):
            total += count(module.packed) + count(module.bias)
        elif isinstance(module, RowInt8Linear):
            # int8 weights [out, in + 2] (fbgemm holds them packed) and a float scale a row
            total += module.out_features * (module.in_features + 2 + 4) + count(module.bias)
        elif isinstance(module, nn.Embedding):  # read at one row a token (a tied output
            total += module.embedding_dim * module.weight.element_size()  # layer: whole)
        else:
            for tensor in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
                total += count(tensor)
    return total


@dataclass(frozen=True)
class Floor:
    """One model's step against this machine's memory floor."""

    step_bytes: int
    step_ms: float  # the median step
    bandwidth: float  # bytes a second: the fastest read
    fastest_ms: float | None = None  # the fastest step, measured like the bandwidth

    @property
    def floor_ms(self) -> float:
        return 1000 * self.step_bytes / self.bandwidth

    @property
    def times_floor(self) -> float:
        return self.step_ms / self.floor_ms

    def line(self) -> str:
        fastest = ""
        if self.fastest_ms is not None:
            fastest = (
                f" (the fastest {self.fastest_ms:.1f} ms, {self.fastest_ms / self.floor_ms:.2f}x)"
            )
        return (
            f"{size(self.step_bytes)} a step, {self.step_ms:.1f} ms: its floor "
            f"{self.floor_ms:.1f} ms, {self.times_floor:.2f}x the floor{fastest}"
        )


def size(count: int) -> str:
    """Bytes as GB (0.1 GB and more) or MB."""
    return f"{count / 1e9:.2f} GB" if count >= 10**8 else f"{count / 1e6:.2f} MB"
