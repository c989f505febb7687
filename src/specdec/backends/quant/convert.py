"""A float32 transformers model put on the int8 or int4 runtime, in place: its linears
quantized (q/k/v and gate/up fused first), its norms, activations, rotary embedding and
attention made row-invariant, and the kernel's row operations used where they fit.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from torch import nn
from transformers import PreTrainedModel

from specdec.backends.quant import fused, kernels
from specdec.backends.quant.fused import FusedAttention, FusedMLP
from specdec.backends.quant.int4 import OUTPUT_GROUP, RowInt4Linear, fits
from specdec.backends.quant.int8 import RowInt8Linear
from specdec.backends.quant.rows import (
    PLAIN_RMS_NORMS,
    RotaryTokenByToken,
    RowRMSNorm,
    TokenByToken,
    row_invariant_sdpa,
)

ATTENTION = "specdec_row_invariant_sdpa"


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
    q/k/v and gate/up are fused first (``fused``: one product each, same bits).

    The model must be float32 on the CPU; it is changed in place and returned. Quantizing
    takes ~20 s for a 1.5B model; two threads do it (the torch ops release the GIL).
    ``progress(step, done, total)`` is called as layers finish.
    """
    return swap_linears(model, linear_quantizer("int8"), "quantizing to int8", progress)


def make_int4_batch_invariant(
    model: PreTrainedModel, progress=None, group: int = 32
) -> PreTrainedModel:
    """Swap every nn.Linear the kernel fits for RowInt4Linear (others for RowInt8Linear),
    fuse q/k/v and gate/up first, and run the rest as the int8 runtime does. The model must
    be float32 on the CPU; it is changed in place and returned. ``group``: inputs per weight
    scale of its layers (a draft's 128, ``int4.DRAFT_GROUP``; the output layer keeps 32)."""
    quantized = linear_quantizer("int4", group, output=model.get_output_embeddings())
    return swap_linears(model, quantized, "quantizing to int4", progress)


def linear_quantizer(
    kind: str, int4_group: int = 32, output: nn.Module | None = None
) -> Callable[[nn.Linear], nn.Module]:
    """What a float linear becomes on runtime ``kind``: int8 rows, or int4 blocks where the
    kernel takes its shape (int8 rows otherwise), ``int4_group`` inputs a weight scale but
    for ``output`` (the output layer: 32, ``int4.OUTPUT_GROUP``). int4 builds the kernel
    first: a machine without a compiler fails before any work."""
    if kind == "int8":
        return RowInt8Linear
    if kind != "int4":
        raise ValueError(f"runtime form must be int8 or int4, got {kind!r}")
    kernels.kernel()

    def quantized(linear: nn.Linear) -> nn.Module:
        if not fits(linear):
            return RowInt8Linear(linear)
        return RowInt4Linear(linear, OUTPUT_GROUP if linear is output else int4_group)

    return quantized


def swap_linears(
    model: PreTrainedModel, quantized: Callable[[nn.Linear], nn.Module], step: str, progress=None
) -> PreTrainedModel:
    """``quantize_linears`` over the whole model, then ``finish_quantized_model``."""
    quantize_linears(model, quantized, step, progress)
    finish_quantized_model(model)
    return model


def quantize_linears(
    module: nn.Module,
    quantized: Callable[[nn.Linear], nn.Module],
    step: str = "",
    progress=None,
) -> None:
    """Fuse q/k/v and gate/up within ``module`` (a model, or one decoder layer of it), then
    replace every nn.Linear in it by ``quantized(linear)`` on two threads, reporting
    ``progress(step, done, total)``. The float weights are dropped as each is replaced."""
    fused.fuse_projections(module)
    slots = [
        (parent, name, child)
        for parent in module.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear)
    ]
    with ThreadPoolExecutor(max_workers=2) as pool:
        layers = pool.map(lambda slot: quantized(slot[2]), slots)
        for done, ((parent, name, _), layer) in enumerate(zip(slots, layers, strict=True), 1):
            setattr(parent, name, layer)
            if progress is not None:
                progress(step, done, len(slots))


def finish_quantized_model(model: PreTrainedModel) -> None:
    """What follows the linears' swap: token-by-token norms, activations and rotary
    embedding, and the row-invariant attention; then the kernel's row operations where they
    fit (``use_row_kernels``): always on an int4 model, and on an int8 one wherever the
    kernel builds (the same row-invariance in one call a pass instead of some 1,000 small
    torch calls a step, and KV caches written in place: the 1.5B's int8 step 6-9% shorter, a
    pass of 32 sequences 24-25%, AMD EPYC, docs/notes/runtime-search.md section 8). Without a
    compiler an int8 model keeps the torch forms above."""
    _register_attention()
    _wrap_token_by_token(model)
    model.set_attn_implementation(ATTENTION)
    int4_model = any(isinstance(module, RowInt4Linear) for module in model.modules())
    if int4_model or kernels.kernel_or_none() is not None:
        use_row_kernels(model)


def use_row_kernels(model: nn.Module) -> nn.Module:
    """Run an int4 or int8 model's norms, SiLU-gated products, rotary mix and attention in the
    kernel's row operations (one call per pass each, instead of some 1,000 small torch
    calls a step): plain RMS norms become ``RowRMSNorm``, fused attention and SiLU MLPs get
    the kernel. Call after ``finish_quantized_model``; other modules keep the int8 runtime's
    token-by-token forms. Changed in place and returned."""

    kernels.kernel()  # built (or refused) before any pass needs it
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            inner = child.inner if isinstance(child, TokenByToken) else child
            if type(inner).__name__ in PLAIN_RMS_NORMS and hasattr(inner, "variance_epsilon"):
                setattr(module, name, RowRMSNorm(inner))
        if isinstance(module, FusedAttention | FusedMLP) and _fits(module):
            module.row_kernels = True
    return model


def uses_row_kernels(model: nn.Module) -> bool:
    """Whether ``use_row_kernels`` gave ``model``'s attention the kernel."""
    return any(
        isinstance(module, FusedAttention) and module.row_kernels for module in model.modules()
    )


def _fits(module) -> bool:
    """Attention always; an MLP when its activation is SiLU and gate and up are one size."""
    if isinstance(module, FusedAttention):
        return True
    return _is_silu(module.act_fn) and _halves(module.sizes)


def _is_silu(act_fn: nn.Module) -> bool:
    inner = act_fn.inner if isinstance(act_fn, TokenByToken) else act_fn
    return isinstance(inner, nn.SiLU) or type(inner).__name__ in {"SiLUActivation", "SiLU"}


def _halves(sizes: list[int]) -> bool:
    return len(sizes) == 2 and sizes[0] == sizes[1]
