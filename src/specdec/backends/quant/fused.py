"""Fused projections for the int8 runtime: one int8 product for q, k and v, one for gate and up.

Why: a one-token int8 step of the 1.5B made 197 fbgemm calls, each scaling its activation
row on its own (abs, amax, divide, the pin columns) and each crossing Python and the
dispatcher; measured, a 28-layer model with 128-wide layers (all overhead, no arithmetic to
speak of) stepped in 9 ms on the int8 runtime against 5.7 ms in float32. Fused, a layer
makes 4 calls instead of 7 and scales each activation row once for the projections that
read it.

Exactness: fbgemm computes every output column from the same quantized row with that
column's own weight row and scale, and integer accumulation is exact, so the fused
product's columns are the separate products bit for bit; the modules below do the
transformers modules' arithmetic in the same order (``tests/backends/quant/test_int8.py``
compares logits with and without fusion, bit for bit). Modules of another shape are left
as they are.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch
from torch import nn

from specdec.backends.quant import kernels
from specdec.backends.quant.rows import row_invariant_sdpa

ATTENTION_PARTS = ("q_proj", "k_proj", "v_proj")

MLP_PARTS = ("gate_proj", "up_proj")

Model = TypeVar("Model", bound=nn.Module)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class FusedAttention(nn.Module):
    """A Llama-family self-attention (q/k/v/o projections, rotary, a KV cache) with one
    ``qkv_proj`` for q, k and v. Called as the transformers module is."""

    def __init__(self, original: nn.Module, qkv_proj: nn.Module, sizes: list[int]):
        super().__init__()
        self.qkv_proj, self.sizes = qkv_proj, sizes
        self.o_proj = original.get_submodule("o_proj")
        self.config = original.config
        self.layer_idx, self.head_dim = original.layer_idx, original.head_dim
        self.scaling = original.scaling
        self.num_key_value_groups = original.num_key_value_groups
        self.is_causal, self.attention_dropout = True, 0.0
        self.row_kernels = False  # int4: rotary and attention in the kernel, one call each

    def _attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """Causal attention of query rows  # [1, heads, q, dim] over key/value  # [1, kv_heads,
        past + q, dim], each row over its own prefix  ->  [1, q, heads, dim]."""
        if not self.row_kernels:
            return row_invariant_sdpa(self, query, key, value, None, scaling=self.scaling)[0]
        attend = kernels.kernel().causal_attention  # one sequence at a time: rows [q, heads, dim]
        outs = [
            attend(q.transpose(0, 1), k, v, self.scaling)
            for q, k, v in zip(query, key, value, strict=True)
        ]
        return outs[0].unsqueeze(0) if len(outs) == 1 else torch.stack(outs)  # no copy for one

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        cache=None,
        past_key_values=None,
        **kwargs,
    ) -> tuple[torch.Tensor, None]:
        cache = cache if cache is not None else past_key_values
        query, key, value = self._rotated_qkv(hidden_states, position_embeddings)
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx)
        out = self._attend(query, key, value)
        return self.o_proj(out.reshape(*hidden_states.shape[:-1], -1).contiguous()), None

    def forward_ragged(
        self,
        hidden_states: torch.Tensor,  # [1, rows, hidden]: the new tokens of many sequences
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        segments: list[tuple[Any, int, int]],  # (its layer cache, first row, end row)
    ) -> torch.Tensor:
        """Attention for the rows of many sequences at once, each segment of rows against
        its own sequence's cache (``backends/batched.py``): the same calls, row by row, as
        ``forward`` makes for that sequence alone."""
        query, key, value = self._rotated_qkv(hidden_states, position_embeddings)
        outs = []
        for cache, start, end in segments:
            keys, values = cache.update(key[:, :, start:end], value[:, :, start:end])
            outs.append(self._attend(query[:, :, start:end], keys, values))
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
        return self.o_proj(out.reshape(*hidden_states.shape[:-1], -1).contiguous())

    def _rotated_qkv(
        self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """query, key, value  # [batch, heads, tokens, head_dim], query and key rotated."""
        per_head = (*hidden_states.shape[:-1], -1, self.head_dim)
        if self.row_kernels:  # rows of every sequence at once: [batch * tokens, heads, dim]
            batch, tokens = hidden_states.shape[:2]
            rows = self.qkv_proj(hidden_states).reshape(batch * tokens, -1)
            query, key, value = (
                part.reshape(batch * tokens, -1, self.head_dim).contiguous()
                for part in rows.split(self.sizes, dim=-1)
            )
            cos, sin = (
                t.expand(batch, tokens, -1).reshape(batch * tokens, -1).contiguous()
                for t in position_embeddings
            )
            kernels.kernel().rope_(query, cos, sin)
            kernels.kernel().rope_(key, cos, sin)
            query, key, value = (
                t.reshape(batch, tokens, -1, self.head_dim).transpose(1, 2)
                for t in (query, key, value)
            )
            return query, key, value
        query, key, value = (
            part.reshape(per_head).transpose(1, 2)
            for part in self.qkv_proj(hidden_states).split(self.sizes, dim=-1)
        )
        cos, sin = (t.unsqueeze(1) for t in position_embeddings)
        query = (query * cos) + (rotate_half(query) * sin)
        key = (key * cos) + (rotate_half(key) * sin)
        return query, key, value


class FusedMLP(nn.Module):
    """A gated MLP, ``down(act(gate(x)) * up(x))``, with one ``gate_up_proj``."""

    def __init__(self, original: nn.Module, gate_up_proj: nn.Module, sizes: list[int]):
        super().__init__()
        self.gate_up_proj, self.sizes = gate_up_proj, sizes
        self.down_proj = original.get_submodule("down_proj")
        self.act_fn = original.get_submodule("act_fn")
        self.row_kernels = False  # int4 with a SiLU act_fn: the gated product in one call

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.row_kernels:
            gate_up = self.gate_up_proj(x)
            rows = kernels.kernel().silu_mul(gate_up.reshape(-1, gate_up.shape[-1]))
            return self.down_proj(rows.reshape(*x.shape[:-1], -1))
        gate, up = self.gate_up_proj(x).split(self.sizes, dim=-1)
        return self.down_proj(self.act_fn(gate.contiguous()) * up)


def _parts(module: nn.Module, names: tuple[str, ...], others: set[str]) -> list[nn.Linear] | None:
    """The linear layers ``names`` of ``module`` when it has exactly those children and
    ``others``, all of one input width and all with or all without a bias; else None."""
    children = dict(module.named_children())
    if set(children) != set(names) | others:
        return None
    parts = [child for name in names if isinstance(child := children[name], nn.Linear)]
    if len(parts) != len(names):
        return None
    if len({part.in_features for part in parts}) != 1:
        return None
    if len({part.bias is None for part in parts}) != 1:
        return None
    return parts


def _concatenated(parts: list[nn.Linear]) -> nn.Linear:
    """One linear layer whose output is the parts' outputs side by side."""
    weight = torch.cat([part.weight.detach() for part in parts])
    # made on the meta device: its own weights are replaced at once (initializing them at
    # random cost 5.8 s for the 1.5B's 56 fused products)
    fused = nn.Linear(
        weight.shape[1], weight.shape[0], bias=parts[0].bias is not None, device="meta"
    )
    fused.weight = nn.Parameter(weight, requires_grad=False)
    if parts[0].bias is not None:
        fused.bias = nn.Parameter(torch.cat([part.bias.detach() for part in parts]), False)
    return fused


def fuse_projections(model: Model) -> Model:
    """Replace every Llama-family attention and gated MLP of ``model`` (float linears, or a
    skeleton on the meta device) by its fused form; the caller swaps the fused linears for
    int8 ones. Changed in place and returned."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            attention = _parts(child, ATTENTION_PARTS, {"o_proj"})
            plain = getattr(child, "sliding_window", None) is None
            if attention and plain and hasattr(child, "layer_idx") and hasattr(child, "scaling"):
                sizes = [part.out_features for part in attention]
                setattr(parent, name, FusedAttention(child, _concatenated(attention), sizes))
                continue
            mlp = _parts(child, MLP_PARTS, {"down_proj", "act_fn"})
            if mlp:
                sizes = [part.out_features for part in mlp]
                setattr(parent, name, FusedMLP(child, _concatenated(mlp), sizes))
    return model
