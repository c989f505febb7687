"""A batch-invariant int4 CPU runtime: 4-bit weights read once for every row of a verify pass.

Why: on these memory-bound 2-core machines bytes per weight decide a step, and the int8
runtime reads 1.54 GB a step of the 1.5B against llama.cpp's Q4_K_M ~0.9 GB. The 4-bit
kernels at hand cannot verify cheaply (docs/notes/runtime-search.md): PyTorch's int4 kernel and
llama.cpp take rows in groups of 4, so a 5-token pass costs 2.4-3.8 steps. specdec's own
kernel (``kernels/int4_linear.cpp``, compiled on first use) unpacks each block of weights
once and applies it to all rows of the pass while it sits in registers.

Format: groups of 32 inputs with a float16 scale and minimum each (w = d * code + m, code
0..15; 5 bits a weight with the scales), activations quantized per row in groups of 32 to
int8. A row's output depends on that row alone, computed in a fixed order by one thread
(the kernel's header has the argument): block == steps bit for bit at any thread count,
and the AVX-512, AVX2 and scalar paths agree bit for bit too. The rest of the model runs as
on the int8 runtime (fused projections, token-by-token norms and activations, row attention).
"""

from __future__ import annotations

import torch
from torch import nn

from specdec.backends.quant import kernels

GROUP = 32  # inputs per scale

TILE = 16  # output columns per packed block

BLOCK = 320  # bytes per (tile, group): 256 code bytes, 16 float16 scales, 16 float16 minimums


def quantize_groups(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """4-bit codes per group of 32 inputs.  weight  # [out, in] -> (codes uint8 [out, in],
    scales float16 [out, in / 32], minimums float16 [out, in / 32]); w ~ scale * code + min.
    The codes are rounded against the float16 scale and minimum that are stored."""
    rows, width = weight.shape
    grouped = weight.float().reshape(rows, width // GROUP, GROUP)
    low, high = torch.aminmax(grouped, dim=-1)
    minimum = low.half()
    scale = ((high - minimum.float()) / 15).half()
    safe = scale.float().clamp(min=torch.finfo(torch.float16).tiny).unsqueeze(-1)
    # one temporary, changed in place (a first run quantizes 1.5B weights)
    codes = torch.sub(grouped, minimum.float().unsqueeze(-1)).div_(safe).round_().clamp_(0, 15)
    codes.masked_fill_(scale.unsqueeze(-1) == 0, 0)
    return codes.to(torch.uint8).reshape(rows, width), scale, minimum


def pack(codes: torch.Tensor, scales: torch.Tensor, minimums: torch.Tensor) -> torch.Tensor:
    """The kernel's layout (``kernels/int4_linear.cpp``): uint8 [out / 16, in / 32, 320]."""
    rows, width = codes.shape
    tiles, groups = rows // TILE, width // GROUP
    # [tile, column, group, quad, 4] -> [tile, group, quad, column, 4]
    quads = codes.reshape(tiles, TILE, groups, 8, 4).permute(0, 2, 3, 1, 4)
    quads = quads.reshape(tiles, groups, 8, TILE * 4)
    nibbles = quads[:, :, :4] | (quads[:, :, 4:] << 4)  # chunk q: quad q low, quad q + 4 high
    per_tile = (tiles, TILE, groups)
    d = scales.reshape(per_tile).permute(0, 2, 1).contiguous().view(torch.uint8)
    m = minimums.reshape(per_tile).permute(0, 2, 1).contiguous().view(torch.uint8)
    return torch.cat([nibbles.reshape(tiles, groups, 256), d, m], dim=-1).contiguous()


ROWS_AT_ONCE = 8192  # outputs quantized together: the output layer's temporaries stay small


def quantize_and_pack(weight: torch.Tensor) -> torch.Tensor:
    """``pack(*quantize_groups(weight))``, ``ROWS_AT_ONCE`` outputs at a time: each output
    row is quantized on its own and packed in tiles of 16 rows, so the pieces are the whole's
    bytes, without the whole's float temporaries (2.8 GB for the 1.5B's output layer)."""
    pieces = [
        pack(*quantize_groups(weight[start : start + ROWS_AT_ONCE]))
        for start in range(0, weight.shape[0], ROWS_AT_ONCE)
    ]
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces)


def unpack(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``pack``'s inverse: (codes uint8 [out, in], scales, minimums float16 [out, in / 32])."""
    tiles, groups, _ = packed.shape
    nibbles = packed[:, :, :256].reshape(tiles, groups, 4, TILE * 4)
    quads = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=2)  # [tile, group, quad, column * 4]
    codes = quads.reshape(tiles, groups, 8, TILE, 4).permute(0, 3, 1, 2, 4)
    codes = codes.reshape(tiles * TILE, groups * GROUP)

    def halves(start: int) -> torch.Tensor:
        raw = packed[:, :, start : start + 2 * TILE].contiguous().view(torch.float16)
        return raw.permute(0, 2, 1).reshape(tiles * TILE, groups)  # [tile, group, col] -> rows

    return codes.contiguous(), halves(256), halves(288)


def dequantize(codes: torch.Tensor, scales: torch.Tensor, minimums: torch.Tensor) -> torch.Tensor:
    """The float32 weight the codes stand for (for tests and quality checks)."""
    rows, width = codes.shape
    grouped = codes.float().reshape(rows, width // GROUP, GROUP)
    weight = grouped * scales.float().unsqueeze(-1) + minimums.float().unsqueeze(-1)
    return weight.reshape(rows, width)


def fits(linear: nn.Linear) -> bool:
    """Whether the kernel takes this layer's shape (outputs a multiple of 16, inputs of 32)."""
    return linear.out_features % TILE == 0 and linear.in_features % GROUP == 0


class RowInt4Linear(nn.Module):
    def __init__(self, linear: nn.Linear):
        super().__init__()
        bias = None if linear.bias is None else linear.bias.detach().float().contiguous()
        self._set(quantize_and_pack(linear.weight.detach()), bias)

    @classmethod
    def from_row_pieces(cls, pieces, bias: torch.Tensor | None) -> RowInt4Linear:
        """From the float weight given as consecutive pieces of output rows (each
        [rows, in], rows a multiple of 16 but the last): ``RowInt4Linear`` of the whole
        weight, byte for byte (``quantize_and_pack``), without the whole in memory."""
        return cls.from_packed(torch.cat([quantize_and_pack(p) for p in pieces]), bias)

    @classmethod
    def from_packed(cls, packed: torch.Tensor, bias: torch.Tensor | None) -> RowInt4Linear:
        """From ``packed`` (the on-disk runtime cache's tensor): no float weights."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer._set(packed, bias)
        return layer

    def _set(self, packed: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.packed, self.bias = packed, bias
        self.out_features, self.in_features = packed.shape[0] * TILE, packed.shape[1] * GROUP
        self.path = kernels.pinned_path()  # -1: the best path for this CPU; tests pin one

    def rows(self, ids: torch.Tensor) -> RowInt4Linear:
        """The layer restricted to output rows ``ids`` (the same numbers for those outputs),
        padded with copies of the last to a multiple of 16 outputs: read the first
        ``len(ids)`` columns of its output."""
        padded = torch.cat([ids, ids[-1:].expand((-len(ids)) % TILE)])
        codes, scales, minimums = unpack(self.packed)
        bias = None if self.bias is None else self.bias[padded].contiguous()
        return RowInt4Linear.from_packed(
            pack(codes[padded], scales[padded], minimums[padded]), bias
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x  # [..., in_features]
        rows = x.reshape(-1, x.shape[-1]).float()
        out = kernels.kernel().int4_linear(rows, self.packed, self.bias, self.path)
        return out.reshape(*x.shape[:-1], self.out_features)
