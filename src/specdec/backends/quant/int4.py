"""A batch-invariant int4 CPU runtime: 4-bit weights read once for every row of a verify pass.

Why: on these memory-bound 2-core machines bytes per weight decide a step, and the int8
runtime reads 1.54 GB a step of the 1.5B against llama.cpp's Q4_K_M ~0.9 GB. The 4-bit
kernels at hand cannot verify cheaply (docs/notes/runtime-search.md): PyTorch's int4 kernel and
llama.cpp take rows in groups of 4, so a 5-token pass costs 2.4-3.8 steps. specdec's own
kernel (``kernels/int4_linear.cpp``, compiled on first use) unpacks each block of weights
once and applies it to all rows of the pass while it sits in registers.

Format: groups of 32 inputs with a float16 scale and minimum each (w = d * code + m, code
0..15; 5 bits a weight with the scales), activations quantized per row in groups of 32 to
int8. A draft model's layers share a scale and minimum over 128 inputs instead
(``DRAFT_GROUP``: 4.25 bits a weight, 14% fewer bytes a step; its output layer keeps 32),
fitted by least squares; the kernel takes both. A row's output depends on that row alone,
computed in a fixed order by one thread (the kernel's header has the argument): block ==
steps bit for bit at any thread count, and the AVX-512, AVX2 and scalar paths agree bit for
bit too. The rest of the model runs as on the int8 runtime (fused projections, token-by-token
norms and activations, row attention).
"""

from __future__ import annotations

import torch
from torch import nn

from specdec.backends.quant import kernels

GROUP = 32  # inputs per activation scale, per group of codes, per weight scale of a target

# Inputs per weight scale of a draft model's layers (``group`` below; a target's stay at 32):
# the 0.5B draft's step reads 14% fewer bytes (docs/notes/runtime-search.md section 13).
DRAFT_GROUP = 128
# A draft's output layer's: at 128 the 0.5B's greedy picks agreed with the target's text 0.8752
# of the time, at 32 (its layers at 128) 0.8827, as with every scale at 32 (section 13).
OUTPUT_GROUP = GROUP
FIT_ROUNDS = 4  # least-squares refits of a shared scale and minimum (``quantize_groups``)

TILE = 16  # output columns per packed block

BLOCK = 320  # bytes per (tile, group): 256 code bytes, 16 float16 scales, 16 float16 minimums


def quantize_groups(
    weight: torch.Tensor, group: int = GROUP
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """4-bit codes per group of ``group`` inputs (32, or a draft's 128).  weight  # [out,
    in] -> (codes uint8 [out, in], scales float16 [out, in / group], minimums float16 [out,
    in / group]); w ~ scale * code + min. The codes are rounded against the float16 scale and
    minimum that are stored. At 32 the scale and minimum span the group's range; at 128 they
    are then fitted by least squares to the codes (``FIT_ROUNDS`` times, each fit kept where
    it lowers the group's squared error): min and max alone lose more over 128 inputs."""
    if group not in (GROUP, DRAFT_GROUP):
        raise ValueError(f"int4 weights share a scale over {GROUP} or {DRAFT_GROUP} inputs")
    rows, width = weight.shape
    grouped = weight.float().reshape(rows, width // group, group)
    low, high = torch.aminmax(grouped, dim=-1)
    minimum = low.half()
    scale = ((high - minimum.float()) / 15).half()
    codes = _codes(grouped, scale, minimum)
    if group != GROUP:
        codes, scale, minimum = _fitted(grouped, codes, scale, minimum)
    return codes.to(torch.uint8).reshape(rows, width), scale, minimum


def _codes(grouped: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> torch.Tensor:
    """The nearest codes 0..15 to ``grouped``  # [rows, groups, group] given float16
    ``scale`` and ``minimum``  # [rows, groups] (0 where the scale is 0), as float32."""
    safe = scale.float().clamp(min=torch.finfo(torch.float16).tiny).unsqueeze(-1)
    # one temporary, changed in place (a first run quantizes 1.5B weights)
    codes = torch.sub(grouped, minimum.float().unsqueeze(-1)).div_(safe).round_().clamp_(0, 15)
    return codes.masked_fill_(scale.unsqueeze(-1) == 0, 0)


def _fitted(grouped, codes, scale, minimum):
    """``FIT_ROUNDS`` of: the least-squares scale and minimum for the codes (in float16),
    the codes again for them; each group keeps whichever has the lowest squared error (from
    the sums the fit needs: sum (d c + m - w)^2 less sum w^2, the same for every candidate)."""
    n = grouped.shape[-1]
    sum_w = grouped.sum(-1)

    def sums(codes):
        return codes.sum(-1), codes.square().sum(-1), (codes * grouped).sum(-1)

    def error(scale, minimum, sum_c, sum_cc, sum_cw):
        d, m = scale.float(), minimum.float()
        return d * d * sum_cc + 2 * d * m * sum_c + n * m * m - 2 * d * sum_cw - 2 * m * sum_w

    sum_c, sum_cc, sum_cw = sums(codes)
    best = error(scale, minimum, sum_c, sum_cc, sum_cw)
    for _ in range(FIT_ROUNDS):
        spread = n * sum_cc - sum_c * sum_c  # 0 when every code is the same
        fit = (n * sum_cw - sum_c * sum_w) / spread.clamp(min=1e-12)
        new_scale = torch.where(spread > 0, fit, scale.float()).half()
        new_minimum = ((sum_w - new_scale.float() * sum_c) / n).half()
        new_codes = _codes(grouped, new_scale, new_minimum)
        new_sums = sums(new_codes)
        new_error = error(new_scale, new_minimum, *new_sums)
        better = new_error < best
        scale = torch.where(better, new_scale, scale)
        minimum = torch.where(better, new_minimum, minimum)
        codes = torch.where(better.unsqueeze(-1), new_codes, codes)
        sum_c, sum_cc, sum_cw = (
            torch.where(better, a, b)
            for a, b in zip(new_sums, (sum_c, sum_cc, sum_cw), strict=True)
        )
        best = torch.where(better, new_error, best)
    return codes, scale, minimum


def pack(codes: torch.Tensor, scales: torch.Tensor, minimums: torch.Tensor) -> torch.Tensor:
    """The kernel's layout (``kernels/int4_linear.cpp``): uint8 [out / 16, in / group,
    256 * group / 32 + 64], ``group`` (32 or 128) the inputs per scale."""
    rows, width = codes.shape
    tiles, groups, shared = rows // TILE, width // GROUP, width // scales.shape[1]
    per_block = shared // GROUP
    # [tile, column, group, quad, 4] -> [tile, group, quad, column, 4]
    quads = codes.reshape(tiles, TILE, groups, 8, 4).permute(0, 2, 3, 1, 4)
    quads = quads.reshape(tiles, groups, 8, TILE * 4)
    nibbles = quads[:, :, :4] | (quads[:, :, 4:] << 4)  # chunk q: quad q low, quad q + 4 high
    per_tile = (tiles, TILE, groups // per_block)
    d = scales.reshape(per_tile).permute(0, 2, 1).contiguous().view(torch.uint8)
    m = minimums.reshape(per_tile).permute(0, 2, 1).contiguous().view(torch.uint8)
    code_bytes = nibbles.reshape(tiles, groups // per_block, 256 * per_block)
    return torch.cat([code_bytes, d, m], dim=-1).contiguous()


ROWS_AT_ONCE = 8192  # outputs quantized together: the output layer's temporaries stay small


def quantize_and_pack(weight: torch.Tensor, group: int = GROUP) -> torch.Tensor:
    """``pack(*quantize_groups(weight, group))``, ``ROWS_AT_ONCE`` outputs at a time: each
    output row is quantized on its own and packed in tiles of 16 rows, so the pieces are the
    whole's bytes, without the whole's float temporaries (2.8 GB for the 1.5B's output
    layer)."""
    pieces = [
        pack(*quantize_groups(weight[start : start + ROWS_AT_ONCE], group))
        for start in range(0, weight.shape[0], ROWS_AT_ONCE)
    ]
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces)


def scale_group(packed: torch.Tensor) -> int:
    """The inputs per scale of a packed weight (32 or 128), from its block size."""
    return GROUP * ((packed.shape[2] - 64) // 256)


def unpack(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``pack``'s inverse: (codes uint8 [out, in], scales, minimums float16 [out, in /
    group])."""
    tiles, blocks, _ = packed.shape
    per_block = scale_group(packed) // GROUP
    groups = blocks * per_block
    code_bytes = 256 * per_block
    nibbles = packed[:, :, :code_bytes].reshape(tiles, groups, 4, TILE * 4)
    quads = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=2)  # [tile, group, quad, column * 4]
    codes = quads.reshape(tiles, groups, 8, TILE, 4).permute(0, 3, 1, 2, 4)
    codes = codes.reshape(tiles * TILE, groups * GROUP)

    def halves(start: int) -> torch.Tensor:
        raw = packed[:, :, start : start + 2 * TILE].contiguous().view(torch.float16)
        return raw.permute(0, 2, 1).reshape(tiles * TILE, blocks)  # [tile, block, col] -> rows

    return codes.contiguous(), halves(code_bytes), halves(code_bytes + 32)


def dequantize(codes: torch.Tensor, scales: torch.Tensor, minimums: torch.Tensor) -> torch.Tensor:
    """The float32 weight the codes stand for (for tests and quality checks)."""
    rows, width = codes.shape
    group = width // scales.shape[1]
    grouped = codes.float().reshape(rows, width // group, group)
    weight = grouped * scales.float().unsqueeze(-1) + minimums.float().unsqueeze(-1)
    return weight.reshape(rows, width)


def fits(linear: nn.Linear) -> bool:
    """Whether the kernel takes this layer's shape (outputs a multiple of 16, inputs of 32)."""
    return linear.out_features % TILE == 0 and linear.in_features % GROUP == 0


def group_for(linear: nn.Linear, group: int) -> int:
    """``group`` where the layer's inputs are a multiple of it, else ``GROUP``."""
    return group if linear.in_features % group == 0 else GROUP


class RowInt4Linear(nn.Module):
    # How many times any layer's code path was set: a layer stack built for other paths
    # builds its kernel object again (``layer_stack.LayerStack``), and one built for these
    # need not read every product's path on each pass.
    paths_set = 0

    def __init__(self, linear: nn.Linear, group: int = GROUP):
        """``group``: inputs per weight scale, where the layer's inputs are a multiple of
        it (``group_for``)."""
        super().__init__()
        bias = None if linear.bias is None else linear.bias.detach().float().contiguous()
        self._set(quantize_and_pack(linear.weight.detach(), group_for(linear, group)), bias)

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
        self.out_features = packed.shape[0] * TILE
        self.in_features = packed.shape[1] * scale_group(packed)
        self.path = kernels.pinned_path()  # -1: the best path for this CPU; tests pin one

    @property
    def path(self) -> int:
        """The kernel's code path for this layer: -1 the best for this CPU, or one pinned
        (``kernels.PATH_BY_NAME``)."""
        return self._path

    @path.setter
    def path(self, path: int) -> None:
        self._path = path
        RowInt4Linear.paths_set += 1

    @property
    def group(self) -> int:
        """Inputs per weight scale (``GROUP``, or a draft's ``DRAFT_GROUP``)."""
        return scale_group(self.packed)

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
