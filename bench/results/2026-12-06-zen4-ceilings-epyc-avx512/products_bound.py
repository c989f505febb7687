"""The 1.5B's int4 products of one layer, alone, against the two vector pipes they share on
this CPU: each group of 32 inputs and 16 columns costs a row 8 ``vpdpbusd`` and, in the
float epilogue, a multiply and two fmas, all on the same two pipes (``pipe_rates.cpp``); at
``RATE`` 512-bit operations a second a core (measured there) a pass of ``rows`` rows needs at
least tiles x groups x rows x 11 / (RATE x threads) seconds.

    python products_bound.py [RATE]      (RATE default 3.65e9, the Zen 4 EPYC's)
"""

import statistics
import sys
import time

import torch

from specdec.backends.quant.kernels import kernel
from specdec.loading import load_backend
from specdec.machine import cpu_name
from specdec.models import DEFAULT_TARGET

rate = float(sys.argv[1]) if len(sys.argv) > 1 else 3.65e9
threads = torch.get_num_threads()
layer = load_backend(DEFAULT_TARGET, "int4").model.get_decoder().layers[3]
ops = kernel()
print(f"{cpu_name()}, {threads} threads, {rate / 1e9:.2f} G operations a second a core")
for name, product in [
    ("qkv", layer.self_attn.qkv_proj),
    ("o", layer.self_attn.o_proj),
    ("gate_up", layer.mlp.gate_up_proj),
    ("down", layer.mlp.down_proj),
]:
    packed = product.packed
    tiles, groups = packed.shape[0], packed.shape[1]  # a scale per 32 inputs: a group a block
    k = groups * 32
    for rows in (1, 8, 64):
        x = torch.randn(rows, k)
        ops.int4_linear(x, packed, None, -1)
        times = []
        for _ in range(20):
            began = time.perf_counter()
            ops.int4_linear(x, packed, None, -1)
            times.append(time.perf_counter() - began)
        took = statistics.median(times)
        bound = tiles * groups * rows * 11 / (rate * threads)
        print(
            f"{name} [{tiles * 16} x {k}] {rows:2d} rows: {took * 1e3:6.2f} ms, "
            f"the pipes' bound {bound * 1e3:6.2f} ms ({bound / took:.0%})"
        )
