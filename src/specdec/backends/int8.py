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
each, with KV caches written in place (``int4.use_row_kernels``); the forms above remain
where it does not build. ``tests/test_int8.py`` checks block == steps bit for bit at the
1.5B's layer sizes with 1, 2, 3, 4 and 8 threads, both ways.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn
from transformers import PreTrainedModel

ATTENTION = "specdec_row_invariant_sdpa"
# Bumped when the runtime's operations change what a step costs (runtime choices measured
# before are then stale): 2 = the kernel's row operations where it builds.
FORM = 2


# fbgemm's prepack slows down badly on very tall weights (a 152k-row lm_head takes 10 s as
# one piece, under 5 s in pieces), so tall weights are split by output rows.
ROWS_PER_PIECE = 16_384


class RowInt8Linear(nn.Module):
    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight = linear.weight.detach().float()
        out_features, in_features = weight.shape
        padded = torch.cat([weight, torch.zeros(out_features, 2)], dim=1)  # for the +1/-1 columns
        int8, scales = quantize_rows(padded)
        bias = None if linear.bias is None else linear.bias.detach().float()
        self._set(int8, scales, bias)

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


class RotaryTokenByToken(nn.Module):
    """The rotary embedding's cos/sin, one position at a time (its cos and sin are
    transcendental too).  returns (cos, sin), each  # [batch, tokens, head_dim]"""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor):
        if position_ids.shape[-1] == 1:
            return self.inner(x, position_ids)
        rows = [self.inner(x, position_ids[:, i : i + 1]) for i in range(position_ids.shape[-1])]
        return torch.cat([cos for cos, _ in rows], dim=1), torch.cat(
            [sin for _, sin in rows], dim=1
        )


def _wrap_token_by_token(model: nn.Module) -> None:
    """Norms (any module named *RMSNorm / *LayerNorm), activations (``act_fn``) and rotary
    embeddings (``rotary_emb``) run one token at a time."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            kind = type(child).__name__
            if isinstance(child, TokenByToken | RotaryTokenByToken):
                continue
            if kind.endswith(("RMSNorm", "LayerNorm")) or name == "act_fn":
                setattr(module, name, TokenByToken(child))
            elif name == "rotary_emb":
                setattr(module, name, RotaryTokenByToken(child))


def _register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, row_invariant_sdpa)


def make_int8_batch_invariant(model: PreTrainedModel, progress=None) -> PreTrainedModel:
    """Swap every nn.Linear (lm_head included) for RowInt8Linear and use row attention;
    q/k/v and gate/up are fused first (``int8_fused``: one product each, same bits).

    The model must be float32 on the CPU; it is changed in place and returned. Quantizing
    takes ~20 s for a 1.5B model; two threads do it (the torch ops release the GIL).
    ``progress(step, done, total)`` is called as layers finish.
    """
    return swap_linears(model, RowInt8Linear, "quantizing to int8", progress)


def swap_linears(
    model: PreTrainedModel, quantized: Callable[[nn.Linear], nn.Module], step: str, progress=None
) -> PreTrainedModel:
    """Fuse q/k/v and gate/up, replace every nn.Linear by ``quantized(linear)`` on two threads
    (reporting ``progress(step, done, total)``), then ``finish_int8_model``."""
    from specdec.backends.int8_fused import fuse_projections

    fuse_projections(model)
    slots = [
        (module, name, child)
        for module in model.modules()
        for name, child in module.named_children()
        if isinstance(child, nn.Linear)
    ]
    with ThreadPoolExecutor(max_workers=2) as pool:
        layers = pool.map(lambda slot: quantized(slot[2]), slots)
        for done, ((module, name, _), layer) in enumerate(zip(slots, layers, strict=True), start=1):
            setattr(module, name, layer)
            if progress is not None:
                progress(step, done, len(slots))
    finish_int8_model(model)
    return model


def finish_int8_model(model: PreTrainedModel) -> None:
    """What follows the linears' swap: token-by-token norms, activations and rotary
    embedding, and the row-invariant attention; then the kernel's row operations where they
    fit (``int4.use_row_kernels``): always on an int4 model, and on an int8 one wherever the
    kernel builds (the same row-invariance in one call a pass instead of some 1,000 small
    torch calls a step, and KV caches written in place: the 1.5B's int8 step 6-9% shorter, a
    pass of 32 sequences 24-25%, AMD EPYC, docs/runtime-search.md section 8). Without a
    compiler an int8 model keeps the torch forms above."""
    from specdec.backends.int4 import RowInt4Linear, kernel_or_none, use_row_kernels

    _register_attention()
    _wrap_token_by_token(model)
    model.set_attn_implementation(ATTENTION)
    int4_model = any(isinstance(module, RowInt4Linear) for module in model.modules())
    if int4_model or kernel_or_none() is not None:
        use_row_kernels(model)
