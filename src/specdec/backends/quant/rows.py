"""Row invariance: the operations of a layer computed for every row of a pass as a one-token
step computes it, bit for bit, whatever the block size and the thread count.

- ``row_invariant_sdpa``: attention for a block runs one query row at a time over its own
  causal prefix, the same call a one-token step makes.
- ``TokenByToken``, ``RotaryTokenByToken``: norms, the MLP's activation and the rotary
  embedding on pieces that meet the same vector code on one thread (``int8``'s docstring
  has the argument).
- ``RowRMSNorm``: a plain RMS norm in the kernel's row operations, one call a pass.
"""

from __future__ import annotations

import threading

import torch
from torch import nn

from specdec.backends.quant import kernels


def row_invariant_sdpa(module, query, key, value, attention_mask, **kwargs):
    """query  # [batch, heads, q, dim]; key/value  # [batch, kv_heads, past + q, dim]."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q_len, kv_len = query.shape[2], key.shape[2]
    rows = []
    for i in range(q_len):
        end = kv_len - (q_len - 1 - i)  # row i sees its own causal prefix, no mask needed
        out, _ = sdpa_attention_forward(
            module, query[:, :, i : i + 1], key[:, :, :end], value[:, :, :end], None, **kwargs
        )
        rows.append(out)
    return torch.cat(rows, dim=1), None  # [batch, q, heads, dim]


# ATen runs an elementwise op or a reduction on one thread below this many elements
# (at::internal::GRAIN_SIZE); its vectorized loops step by at most 64 floats (AVX-512, unrolled).
GRAIN_SIZE = 32_768

WIDEST_STEP = 64


def _one_thread_same_lanes(x: torch.Tensor) -> bool:
    """Whether a whole block computes every token as a one-token call would: one thread
    (under the grain size) and rows that start on a vector step (width a multiple of the
    widest step), so each token's elements meet the same vector code in the same lanes.
    The 1.5B's norms (1536 wide) take this path up to 21 tokens; its SiLU (8960) only up to 3."""
    return x.is_contiguous() and x.numel() < GRAIN_SIZE and x.shape[-1] % WIDEST_STEP == 0


def _tokens_per_call(x: torch.Tensor) -> int:
    """How many tokens of ``x``  # [batch, tokens, ...] one call may take and still compute
    each as a one-token call would (``_one_thread_same_lanes``): as many as fit under the
    grain size when rows are a multiple of the widest step wide, else one."""
    token_numel = x[0, 0].numel()
    if x.shape[-1] % WIDEST_STEP or token_numel >= GRAIN_SIZE:
        return 1
    return (GRAIN_SIZE - 1) // token_numel


class TokenByToken(nn.Module):
    """Runs ``inner`` on pieces of a block that each compute every token exactly as a
    one-token step does (see the module docstring): the whole block when it is small
    enough, else runs of tokens under the grain size (21 for the 1.5B's norms, 3 for its
    SiLU), else one token at a time, the shape a one-token step gives it."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] * x.shape[1] == 1 or _one_thread_same_lanes(x):
            return self.inner(x)
        tokens = x.reshape(1, -1, *x.shape[2:]).contiguous()  # [1, batch * tokens, ...]
        per_call = _tokens_per_call(tokens)
        out = torch.cat(
            [
                self.inner(tokens[:, start : start + per_call])
                for start in range(0, tokens.shape[1], per_call)
            ],
            dim=1,
        )
        return out.reshape(*x.shape[:2], *out.shape[2:])


_GROWING = threading.Lock()  # a rotary table grows under it: a server's threads may ask at once


class RotaryTokenByToken(nn.Module):
    """The rotary embedding's cos/sin, one position at a time (its cos and sin are
    transcendental too).  returns (cos, sin), each  # [batch, tokens, head_dim]

    Where the embedding does not change with the text (not a dynamic or LongRoPE scaling),
    each position's cos and sin are computed once, by that same one-position call, and
    kept in a table read by position: the same bits, without the ~20 transformers
    operations a position costs on every pass (a tenth of a millisecond of each draft
    step after the weights' reads have emptied the caches)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        rope_type = getattr(inner, "rope_type", None)
        self._static = isinstance(rope_type, str) and not (
            "dynamic" in rope_type or rope_type == "longrope"
        )
        # dtype -> (cos, sin  # [capacity, head_dim] each, positions computed)
        self._tables: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor, int]] = {}

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor):
        if self._static and position_ids.shape[0] == 1 and position_ids.numel():
            cos, sin = self._table(x, int(position_ids.max()) + 1)
            return cos[position_ids], sin[position_ids]
        return self._computed(x, position_ids)

    def _computed(self, x: torch.Tensor, position_ids: torch.Tensor):
        if position_ids.shape[-1] == 1:
            return self.inner(x, position_ids)
        rows = [self.inner(x, position_ids[:, i : i + 1]) for i in range(position_ids.shape[-1])]
        return torch.cat([cos for cos, _ in rows], dim=1), torch.cat(
            [sin for _, sin in rows], dim=1
        )

    def _table(self, x: torch.Tensor, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The table of ``x``'s dtype with at least ``positions`` positions computed (up to
        the next multiple of ``TABLE_STEP``), its storage doubling as it fills."""
        table = self._tables.get(x.dtype)
        if table is None or table[2] < positions:
            with _GROWING:
                table = self._grown(x, positions)
        return table[0], table[1]

    TABLE_STEP = 64

    def _grown(self, x: torch.Tensor, positions: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        table = self._tables.get(x.dtype)
        filled = 0 if table is None else table[2]
        if filled >= positions:
            return table  # type: ignore[return-value]  # grown by another thread meanwhile
        wanted = -(-positions // self.TABLE_STEP) * self.TABLE_STEP
        cos, sin = self._computed(x[:1, :1], torch.arange(filled, wanted).unsqueeze(0))
        if table is None or table[0].shape[0] < wanted:
            capacity = max(wanted, 2 * filled)
            grown = [cos.new_empty(capacity, cos.shape[-1]) for _ in range(2)]
            if table is not None:
                grown[0][:filled], grown[1][:filled] = table[0][:filled], table[1][:filled]
            table = (grown[0], grown[1], filled)
        table[0][filled:wanted], table[1][filled:wanted] = cos[0], sin[0]
        table = (table[0], table[1], wanted)
        self._tables[x.dtype] = table
        return table


# Norms whose forward is ``weight * (x / sqrt(mean(x^2) + eps))`` in float32 (Gemma's adds 1
# to its weight: not here).
PLAIN_RMS_NORMS = frozenset({"LlamaRMSNorm", "Qwen2RMSNorm", "MistralRMSNorm", "Qwen3RMSNorm"})


class RowRMSNorm(nn.Module):
    """An RMS norm computed row by row by the kernel (``kernels/row_ops.cpp``): one call for
    all rows of a pass, each row alone in a fixed order, so blocks equal steps."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        # A buffer under the norm's own name: the runtime cache saves it as the plain norm's.
        self.register_buffer("weight", norm.get_parameter("weight").detach().float().contiguous())
        self.eps = float(vars(norm)["variance_epsilon"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).float().contiguous()
        return kernels.kernel().rms_norm(rows, self.weight, self.eps).reshape(x.shape)
