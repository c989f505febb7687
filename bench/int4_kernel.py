"""PyTorch's int4 weight-only CPU kernel as a target runtime, against int8 and llama.cpp.

python bench/int4_kernel.py [--group 128] [--repeats 6]

The default 1.5B target with every linear layer but the output layer swapped for
``aten._weight_int4pack_mm_for_cpu`` (asymmetric 4-bit groups, bf16 activations; the
output layer stays int8). Reported: whether a block's rows equal single rows bit for bit,
the 1-token step (64-token context, median over interleaved repeats) of int4, the int8
runtime and llama.cpp's Q4_K_M, v(n) = n-token pass / step for int4 and int8, and the
negative log-likelihood of int4 and int8 on a held-out standard-library file.
This is the measurement behind docs/notes/runtime-search.md section 3; nothing ships from it.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from int4_runtime import held_out_ids, print_costs, print_nll  # bench/, beside this script
from torch import nn

from specdec.backends.hf import HFModel
from specdec.backends.quant.convert import finish_quantized_model as finish_int8_model
from specdec.backends.quant.int8 import RowInt8Linear
from specdec.loading import load_backend
from specdec.machine import cpu_name

TARGET = "qwen2.5-coder-1.5b-instruct"


class Int4Linear(nn.Module):
    """Asymmetric 4-bit groups along the input, bf16 activations, through PyTorch's kernel."""

    def __init__(self, linear: nn.Linear, group: int):
        super().__init__()
        weight = linear.weight.detach().float()
        rows, width = weight.shape
        grouped = weight.reshape(rows, width // group, group)
        low, high = grouped.amin(-1, keepdim=True), grouped.amax(-1, keepdim=True)
        scale = ((high - low) / 15).clamp(min=1e-6)
        quantized = ((grouped - low) / scale).round().clamp(0, 15).to(torch.int32)
        zero = low + scale * 8  # the kernel computes (q - 8) * scale + zero
        scales_and_zeros = torch.stack([scale.squeeze(-1), zero.squeeze(-1)], -1)
        self.scales_and_zeros = scales_and_zeros.transpose(0, 1).contiguous().bfloat16()
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            quantized.reshape(rows, width), 1
        )
        self.group, self.out_features = group, rows
        self.bias = None if linear.bias is None else linear.bias.detach().float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).bfloat16()
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(
            rows, self.packed, self.group, self.scales_and_zeros
        ).float()
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)


def int4_target(group: int) -> HFModel:
    from transformers import AutoModelForCausalLM

    from specdec.models import cache_root, ensure_converted, lookup

    directory = ensure_converted(lookup(TARGET), cache_root(None))
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                swapped = RowInt8Linear(child) if name == "lm_head" else Int4Linear(child, group)
                setattr(module, name, swapped)
    finish_int8_model(model)  # row attention, token-by-token norms: as the int8 runtime
    return HFModel(model)


def rows_invariant(group: int) -> bool:
    layer = Int4Linear(nn.Linear(1536, 8960), group)
    block = torch.randn(9, 1536)
    single = torch.cat([layer(block[i : i + 1]) for i in range(9)])
    return torch.equal(layer(block), single)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--group", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    print(f"CPU: {cpu_name()}; python bench/int4_kernel.py {' '.join(sys.argv[1:])}")
    print("int4 block rows == single rows, bit for bit:", rows_invariant(args.group))
    backends = {
        "int4": int4_target(args.group),
        "int8": load_backend(TARGET, "int8"),
        "llama.cpp q4_k_m": load_backend(TARGET, runtime="llamacpp"),
    }
    ids = held_out_ids(backends["int8"].tokenizer)
    print_costs(backends, ids, args.repeats, (2, 3, 4, 5, 8, 9), skip_passes={"llama.cpp q4_k_m"})
    print_nll({name: backends[name] for name in ("int4", "int8")}, ids)
    return 0


if __name__ == "__main__":
    sys.exit(main())
