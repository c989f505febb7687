"""A batch-invariant int8 CPU runtime for transformers models.

Why: on CPUs without AVX-512, PyTorch's bf16/fp32 matrix kernels make a (k+1)-token verify
pass cost 3-4x a one-token step, which eats the whole gain of speculation. fbgemm's int8
kernels read each weight once for all rows: a 5-token pass costs about 1.1x a step, and a
step reads a quarter of the bytes of fp32.

Exactness: a target is a (weights, runtime, dtype) triple, and speculation is exact when
the target scores a position the same whether it sees one token or a block. Here it does,
bit for bit:
- ``RowInt8Linear``: int8 weights (per output channel) times int8 activations with a
  per-row scale. fbgemm picks ONE activation range per call, so each row is first scaled to
  max |x| = 1 and two constant columns (+1, -1, with zero weights) pin every call's range to
  exactly [-1, 1]: a row's quantization no longer depends on its neighbours. Integer
  accumulation is exact, so the row's result is the same in any block.
- ``row_invariant_sdpa``: attention for a block runs one query row at a time over its own
  causal prefix, the same call a one-token step makes.
- ``TokenByToken``: the norms, the MLP's activation and the rotary embedding run one token
  at a time too. PyTorch splits an elementwise op or a reduction across threads once it has
  more than 32,768 elements, and each thread's range ends in scalar code that rounds
  transcendental functions (SiLU's exp, a norm's reduction) differently from the vector
  code: with 3+ threads, a 9-token block's SiLU over 9 x 8960 elements differs from nine
  one-token steps in a few elements. Called on pieces of at most 32,767 elements whose rows
  are a multiple of 64 floats wide (or one token at a time otherwise), each op runs on one
  thread with every row meeting the same vector code as in a step, whatever the thread count.
What is left (residual adds, products, the rotary mix, embedding lookups) is exactly-rounded
IEEE arithmetic, the same in any block and on any thread.

Where the int4 kernel builds (a C++ compiler), the norms, the SiLU-gated product, the rotary
mix and attention of Llama-family layers run in its row operations instead
(``kernels/row_ops.cpp``: each row alone, by one thread, in a fixed order), one call a pass
each, with KV caches written in place (``convert.use_row_kernels``); the forms above remain
where it does not build. ``tests/backends/quant/test_int8.py`` checks block == steps bit for
bit at the 1.5B's layer sizes with 1, 2, 3, 4 and 8 threads, both ways.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

# Bumped when the runtime's operations change what a step costs (runtime choices measured
# before are then stale): 2 = the kernel's row operations where it builds.
FORM = 2

# fbgemm's prepack slows down badly on very tall weights (a 152k-row lm_head takes 10 s as
# one piece, under 5 s in pieces), so tall weights are split by output rows.
ROWS_PER_PIECE = 16_384


class RowInt8Linear(nn.Module):
    def __init__(self, linear: nn.Linear):
        super().__init__()
        int8, scales = _padded_rows(linear.weight.detach().float())
        bias = None if linear.bias is None else linear.bias.detach().float()
        self._set(int8, scales, bias)

    @classmethod
    def from_row_pieces(cls, pieces, bias: torch.Tensor | None) -> RowInt8Linear:
        """From the float weight given as consecutive pieces of output rows (each
        [rows, in]): every row is quantized on its own, so this is ``RowInt8Linear`` of the
        whole weight, without the whole in memory at once."""
        parts = [_padded_rows(piece.float()) for piece in pieces]
        int8, scales = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        return cls.from_int8(int8, scales, bias)

    @classmethod
    def from_int8(
        cls, int8: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None
    ) -> RowInt8Linear:
        """From ``int8_state()``'s tensors (the on-disk runtime cache): no float weights."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer._set(int8, scales, bias)
        return layer

    def _set(self, int8: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> None:
        """int8  # [out, in + 2] (the two pin columns zero), scales  # [out] float64"""
        self.pieces = [
            _prepack(rows, row_scales)
            for rows, row_scales in zip(
                int8.split(ROWS_PER_PIECE), scales.split(ROWS_PER_PIECE), strict=True
            )
        ]
        self.bias = bias
        self.in_features, self.out_features = int8.shape[1] - 2, int8.shape[0]

    def int8_state(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(int8 weights [out, in + 2], per-row scales [out] float64), unpacked from fbgemm."""
        quantized = [torch.ops.quantized.linear_unpack(piece)[0] for piece in self.pieces]
        int8 = torch.cat([q.int_repr() for q in quantized])
        scales = torch.cat([q.q_per_channel_scales() for q in quantized])
        return int8, scales

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x  # [..., in_features]
        shape = x.shape
        rows = x.reshape(-1, shape[-1]).float()
        row_scale = rows.abs().amax(dim=-1, keepdim=True).clamp_(min=1e-30)
        pinned = torch.empty(rows.shape[0], self.in_features + 2)
        torch.div(rows, row_scale, out=pinned[:, : self.in_features])
        pinned[:, self.in_features :] = _PINS  # every call's range: [-1, 1]
        if len(self.pieces) == 1:
            out = _LINEAR_DYNAMIC(pinned, self.pieces[0], True)
        else:
            out = torch.cat([_LINEAR_DYNAMIC(pinned, piece, True) for piece in self.pieces], -1)
        out.mul_(row_scale)
        if self.bias is not None:
            out.add_(self.bias)
        return out.reshape(*shape[:-1], self.out_features)


_LINEAR_DYNAMIC = torch.ops.quantized.linear_dynamic

_PINS = torch.tensor([[1.0, -1.0]])


def _padded_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_rows`` of ``weight`` with the two pin columns (zero weights) appended."""
    padded = torch.cat([weight, torch.zeros(weight.shape[0], 2)], dim=1)  # the +1/-1 columns
    return quantize_rows(padded)


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output row.  weight  # [rows, in] -> (int8 [rows, in], scales
    [rows] float64)"""
    scales = (weight.abs().amax(dim=1) / 127.0).clamp(min=1e-12).double()
    zero_points = torch.zeros(weight.shape[0], dtype=torch.long)
    with warnings.catch_warnings():
        # Deprecated for a future release; torch is pinned to 2.13.0, where it works.
        warnings.simplefilter("ignore", UserWarning)
        quantized = torch.quantize_per_channel(
            weight.contiguous(), scales, zero_points, 0, torch.qint8
        )
    return quantized.int_repr(), quantized.q_per_channel_scales()


def _prepack(int8: torch.Tensor, scales: torch.Tensor):
    """fbgemm's packed form of int8 rows with their scales (zero points 0)."""
    zero_points = torch.zeros(int8.shape[0], dtype=torch.long)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # deprecated later; torch is pinned
        quantized = torch._make_per_channel_quantized_tensor(
            int8.contiguous(), scales, zero_points, 0
        )
    return torch.ops.quantized.linear_prepack(quantized, None)
