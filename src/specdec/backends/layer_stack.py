"""specdec's one layer loop: an int4 or int8 model's decoder layers in one kernel call a pass
(``kernels/layer_stack.cpp``), each sequence's keys and values in its ``KVBuffer`` per layer.

Why: a Python layer loop makes some 30 calls a layer around the kernel's products and row
operations; measured on the int4 1.5B (AMD EPYC, 2 cores, every kernel held to its AVX2
code), 6.8 of a 37.4 ms step went there, and 5.9 of a 20.9 ms step of the 0.5B draft
(docs/notes/runtime-search.md section 10). ``LayerStack`` runs the same kernel calls in the
same order from C++: transformers' forward on the same model, bit for bit
(``tests/backends/test_layer_stack.py``), without the Python. The int8 runtime's products
(fbgemm's) are called back in Python from it.

It applies where every layer is a plain Llama-family layer on specdec's row operations:
``RowRMSNorm`` norms, fused attention and SiLU MLP on the kernel, every product a
``RowInt4Linear`` or ``RowInt8Linear``. Elsewhere (no compiler for the kernel, a layer it does
not fit) ``LayerStack.of`` gives None and such a model runs transformers' own forward
(``backends/transformers_forward.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from specdec.backends.kv_buffer import KVBuffer
from specdec.backends.quant.fused import FusedAttention, FusedMLP
from specdec.backends.quant.int4 import RowInt4Linear
from specdec.backends.quant.int8 import RowInt8Linear
from specdec.backends.quant.kernels import kernel
from specdec.backends.quant.rows import RowRMSNorm

LAYER_PARTS = {"input_layernorm", "self_attn", "post_attention_layernorm", "mlp"}


@dataclass(frozen=True)
class LayerParts:
    """A Llama-family decoder layer's parts, as the layer loops read them."""

    input_norm: nn.Module
    attention: FusedAttention
    post_attention_norm: nn.Module
    mlp: FusedMLP

    @staticmethod
    def fused(layer: nn.Module) -> bool:
        """Whether ``layer`` is a plain Llama-family layer with fused attention and MLP (what
        ``of`` reads)."""
        children = dict(layer.named_children())
        return (
            set(children) == LAYER_PARTS
            and isinstance(children["self_attn"], FusedAttention)
            and isinstance(children["mlp"], FusedMLP)
        )

    @classmethod
    def of(cls, layer: nn.Module) -> LayerParts:
        attention, mlp = layer.get_submodule("self_attn"), layer.get_submodule("mlp")
        assert isinstance(attention, FusedAttention) and isinstance(mlp, FusedMLP), "fused layers"
        return cls(
            layer.get_submodule("input_layernorm"),
            attention,
            layer.get_submodule("post_attention_layernorm"),
            mlp,
        )


class LayerStack:
    """The decoder layers of one model, as the kernel's ``LayerStack``. ``forward`` runs a
    pass of many sequences' rows, each against its own ``KVBuffer`` per layer."""

    def __init__(self, layers: Sequence[LayerParts]):
        self._layers = list(layers)
        attention: Any = self._layers[0].attention
        self.head_dim = int(attention.head_dim)
        q_size, kv_size, _ = attention.sizes
        self.heads, self.kv_heads = q_size // self.head_dim, kv_size // self.head_dim
        self.scaling = float(attention.scaling)
        self._paths: tuple[int, ...] = ()
        self._paths_seen = -1  # RowInt4Linear.paths_set when the paths were last read
        self._stack: Any = None
        self._product_list = self._products()  # the layers' modules stay; only paths move

    @classmethod
    def of(cls, layers: Sequence[LayerParts]) -> LayerStack | None:
        """A stack for ``layers``, or None where a layer is not one the kernel runs whole."""
        if not layers or not all(_fits(layer) for layer in layers):
            return None
        shapes = {
            (layer.attention.head_dim, tuple(layer.attention.sizes), layer.attention.scaling)
            for layer in layers
        }
        return cls(layers) if len(shapes) == 1 else None

    @property
    def size(self) -> int:
        """Layers in the stack."""
        return len(self._layers)

    def _products(self) -> list[Any]:
        return [
            product
            for layer in self._layers
            for product in (
                layer.attention.qkv_proj,
                layer.attention.o_proj,
                layer.mlp.gate_up_proj,
                layer.mlp.down_proj,
            )
        ]

    def _kernel_stack(self) -> Any:
        """The kernel's object, made again when a product's code path was pinned since (the
        tests and ``--int4-path`` set ``RowInt4Linear.path`` on a loaded model)."""
        if self._stack is not None and self._paths_seen == RowInt4Linear.paths_set:
            return self._stack  # no layer's path was set since the last look
        self._paths_seen = RowInt4Linear.paths_set
        products = self._product_list
        paths = tuple(_path(product) for product in products)
        if self._stack is None or paths != self._paths:
            none = torch.empty(0)
            tensors, eps = [], []
            for layer in self._layers:
                attention, mlp = layer.attention, layer.mlp
                tensors += [
                    layer.input_norm.weight,
                    *_packed(attention.qkv_proj, none),
                    *_packed(attention.o_proj, none),
                    layer.post_attention_norm.weight,
                    *_packed(mlp.gate_up_proj, none),
                    *_packed(mlp.down_proj, none),
                ]
                eps += [layer.input_norm.eps, layer.post_attention_norm.eps]
            calls = [None if _int4(product) else product.forward for product in products]
            self._stack = kernel().LayerStack(
                tensors,
                eps,
                list(paths),
                calls,
                self.heads,
                self.kv_heads,
                self.head_dim,
                self.scaling,
            )
            self._paths = paths
        return self._stack

    def forward(
        self,
        hidden: torch.Tensor,  # [rows, hidden] float32: every sequence's new rows, in order
        position_embeddings: tuple[torch.Tensor, torch.Tensor],  # cos, sin  # [1, rows, dim]
        segments: Sequence[tuple[Sequence[Any], int, int]],  # (its KVBuffers, first, end row)
        parents: Sequence[int] | None = None,  # a draft tree's, one sequence's: per tree row
    ) -> torch.Tensor:
        """The last layer's output  # [rows, hidden]; each sequence's new keys and values
        are then held in its buffers. If the kernel fails, the buffers hold what they held.
        ``parents`` (a pass of one sequence; per tree row, the tree row it hangs under, -1
        for the held prefix; the tree's rows held from earlier passes first, the last
        ``len(parents) - rows`` held positions, then this pass's rows): each row attends to
        the prefix and its own path of rows only (a draft tree, ``specdec.tree``); None:
        every row is causal."""
        cos, sin = (t.reshape(hidden.shape[0], -1).contiguous() for t in position_embeddings)
        like = torch.empty(1, self.kv_heads, 0, self.head_dim)
        keys, values, held = [], [], []
        for caches, start, end in segments:
            length = caches[0].length
            held.append(length)
            for cache in caches:
                assert isinstance(cache, KVBuffer) and cache.length == length, "one length"
                key_buffer, value_buffer = cache.reserve(length + end - start, like)
                keys.append(key_buffer)
                values.append(value_buffer)
        starts = [start for _, start, _ in segments] + [segments[-1][2]]
        out = self._kernel_stack().forward(
            hidden.contiguous(), cos, sin, starts, held, keys, values, list(parents or [])
        )
        for (caches, start, end), length in zip(segments, held, strict=True):
            for cache in caches:
                cache.length = length + end - start
        return out


def _int4(product: Any) -> bool:
    return isinstance(product, RowInt4Linear)


def _path(product: Any) -> int:
    """An int4 product's code path; 0 for a product called back in Python (unread)."""
    return int(product.path) if _int4(product) else 0


def _packed(product: Any, none: torch.Tensor) -> list[torch.Tensor]:
    """An int4 product's tensors for the kernel; two empty ones for an int8 product."""
    if not _int4(product):
        return [none, none]
    return [product.packed, none if product.bias is None else product.bias]


def _fits(layer: LayerParts) -> bool:
    attention, mlp = layer.attention, layer.mlp
    return (
        isinstance(layer.input_norm, RowRMSNorm)
        and isinstance(layer.post_attention_norm, RowRMSNorm)
        and attention.row_kernels
        and mlp.row_kernels
        and all(
            isinstance(product, RowInt4Linear | RowInt8Linear)
            for product in (attention.qkv_proj, attention.o_proj, mlp.gate_up_proj, mlp.down_proj)
        )
        and len(attention.sizes) == 3
        and attention.sizes[1] == attention.sizes[2]
    )


class StackedDecoder:
    """A transformers decoder (its ``layers``, ``rotary_emb`` and final ``norm``) on the
    stack, over ONE sequence of input embeddings with caches of its own: EAGLE's layer on the
    int4 and int8 runtimes (``drafters.heads``), which transformers' forward ran with its per-pass
    setup of masks, cache objects and outputs around one layer. The same kernel calls as
    that forward on such a model."""

    def __init__(self, decoder: nn.Module, stack: LayerStack):
        self.stack, self.rotary_emb = stack, decoder.get_submodule("rotary_emb")
        self.norm = decoder.get_submodule("norm")
        self.caches = [KVBuffer() for _ in range(stack.size)]

    @classmethod
    def of(cls, decoder: nn.Module) -> StackedDecoder | None:
        """None where the decoder's layers are not fused ones the kernel runs whole."""
        layers = getattr(decoder, "layers", None)
        if layers is None or not all(hasattr(decoder, n) for n in ("rotary_emb", "norm")):
            return None
        fused = all(LayerParts.fused(layer) for layer in layers)
        stack = LayerStack.of([LayerParts.of(layer) for layer in layers]) if fused else None
        return None if stack is None else cls(decoder, stack)

    @property
    def length(self) -> int:
        """Positions held in the caches."""
        return self.caches[0].length

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        """embeddings  # [1, n, hidden] at the next n positions -> the final norm's output
        # [1, n, hidden]; their keys and values are then held."""
        n = embeddings.shape[1]
        positions = torch.arange(self.length, self.length + n).unsqueeze(0)
        rotary = self.rotary_emb(embeddings, positions)
        hidden = self.stack.forward(embeddings[0].float(), rotary, [(self.caches, 0, n)])
        return self.norm(hidden.unsqueeze(0))

    def crop(self, n: int) -> None:
        """Hold the first ``n`` positions."""
        for cache in self.caches:
            cache.crop(n)
