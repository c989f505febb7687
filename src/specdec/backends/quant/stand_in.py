"""A model of a given config on the int8 or int4 runtime with made-up weights, for timing.

Why: ``--target-runtime auto`` and ``--draft-runtime auto`` choose between int8 and int4 by
timing a pass of each. A pass on these runtimes costs the same whatever the weights' values
(the kernels' loops and the bytes they read depend on the shapes alone), so the choice does
not need the real weights on both runtimes: a first run would otherwise make and keep a
runtime form that is never used (for the default pair, 3.3 GB of int8 and a minute of
quantizing). A stand-in takes a second to make and nothing on disk.

The weights are constants chosen so that no value overflows or becomes NaN across the layers
(a NaN or a subnormal could change the time an operation takes).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from specdec.backends.quant import convert, fused
from specdec.backends.quant.int4 import GROUP, TILE, RowInt4Linear, fits
from specdec.backends.quant.int8 import RowInt8Linear

_CODES = 0x5A  # two 4-bit codes, 10 and 5
_SCALE, _MINIMUM = 1e-3, -7.5e-3  # weights within [-0.0075, 0.0075]


def stand_in(config: PretrainedConfig, kind: str) -> PreTrainedModel:
    """A model of ``config`` on runtime ``kind`` (int8 or int4) with constant weights, in
    the runtime's own layout, ready for passes."""
    from transformers import AutoModelForCausalLM

    from specdec.backends.quant.store import rebuild_meta_buffers

    convert.linear_quantizer(kind)  # int4: the kernel is built first
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fused.fuse_projections(model)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, _linear(child, kind))
    for name, parameter in list(model.named_parameters()):
        if parameter.is_meta:
            parent, _, attribute = name.rpartition(".")
            module = model.get_submodule(parent)
            setattr(module, attribute, nn.Parameter(_filled(name, parameter), False))
    rebuild_meta_buffers(model, config)
    convert.finish_quantized_model(model)
    return model.eval()


def _linear(linear: nn.Linear, kind: str) -> nn.Module:
    bias = None if linear.bias is None else torch.zeros(linear.out_features)
    if kind == "int4" and fits(linear):
        tiles, groups = linear.out_features // TILE, linear.in_features // GROUP
        packed = torch.full((tiles, groups, 320), _CODES, dtype=torch.uint8)
        halves = torch.tensor([_SCALE] * TILE + [_MINIMUM] * TILE, dtype=torch.float16)
        packed[:, :, 256:] = halves.view(torch.uint8)
        return RowInt4Linear.from_packed(packed, bias)
    int8 = torch.full((linear.out_features, linear.in_features + 2), 3, dtype=torch.int8)
    int8[:, -2:] = 0  # the pin columns are zero in every int8 weight
    scales = torch.full((linear.out_features,), _SCALE, dtype=torch.float64)
    return RowInt8Linear.from_int8(int8, scales, bias)


def _filled(name: str, parameter: nn.Parameter) -> torch.Tensor:
    """Norm weights 1, embeddings and biases small constants."""
    if "norm" in name:
        return torch.ones(parameter.shape)
    return torch.full(parameter.shape, 0.01)
