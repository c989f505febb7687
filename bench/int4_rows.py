"""int4 against int8 for passes of many rows, and the int4 kernel's cost per extra row.

python bench/int4_rows.py [--repeats 4] [--model NAME] [--path best|avx512|avx2|scalar]

1. The whole model: a pass of 1, 4, 8, 16 and 32 new tokens after 128 cached ones, on the
   int4 and the int8 runtime, interleaved over ``--repeats`` rounds, medians (what decides
   which runtime suits a server's batches; docs/runtime-search.md section 9).
2. The int4 linears alone (the output layer left out): one call per layer for 1..16 rows of
   random activations, medians over 6 rounds (the cost of an extra row of a verify pass).

``--path avx2`` runs the int4 kernel's AVX2 code on an AVX-512 CPU (the paths give the same
bits): what a CPU without AVX-512 would run, at this CPU's clock and memory speed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from specdec.backends.quant import int4, kernels
from specdec.loading import load_backend
from specdec.machine import cpu_name

PASS_ROWS = (1, 4, 8, 16, 32)
KERNEL_ROWS = (1, 2, 4, 6, 8, 9, 12, 16)


def pass_ms(backends: dict, repeats: int) -> dict[tuple[str, int], float]:
    ids = list(range(1000, 1300))
    samples: dict[tuple[str, int], list[float]] = {}
    for _ in range(repeats):
        for name, backend in backends.items():
            for rows in PASS_ROWS:
                backend.truncate(0)
                backend.forward(ids[:128], last_only=True)
                started = time.perf_counter()
                backend.forward(ids[128 : 128 + rows])
                samples.setdefault((name, rows), []).append(time.perf_counter() - started)
    return {key: 1e3 * statistics.median(values) for key, values in samples.items()}


def kernel_ms(model, path: int = -1) -> dict[int, float]:
    ops = kernels.kernel()
    head = model.get_output_embeddings()
    layers = [m for m in model.modules() if isinstance(m, int4.RowInt4Linear) and m is not head]
    samples: dict[int, list[float]] = {}
    for _ in range(6):
        for rows in KERNEL_ROWS:
            x = {layer.in_features: torch.randn(rows, layer.in_features) for layer in layers}
            started = time.perf_counter()
            for layer in layers:
                ops.int4_linear(x[layer.in_features], layer.packed, layer.bias, path)
            samples.setdefault(rows, []).append(time.perf_counter() - started)
    return {rows: 1e3 * statistics.median(values) for rows, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--path", default="best", choices=["best", *kernels.PATH_BY_NAME])
    args = parser.parse_args()
    if args.path != "best":  # read by every int4 layer as it is built
        os.environ[kernels.PATH_VARIABLE] = args.path
    backends = {runtime: load_backend(args.model, runtime) for runtime in ("int4", "int8")}
    print(
        f"CPU: {cpu_name()}; python bench/int4_rows.py --repeats {args.repeats} --path {args.path}"
    )
    passes = pass_ms(backends, args.repeats)
    for rows in PASS_ROWS:
        cells = ", ".join(f"{name} {passes[(name, rows)]:.1f} ms" for name in backends)
        print(f"pass of {rows} rows after 128 cached: {cells}")
    linears = kernel_ms(backends["int4"].model, kernels.pinned_path())
    cells = ", ".join(f"{rows} rows {ms:.1f} ms" for rows, ms in linears.items())
    print(f"int4 linears without the output layer: {cells}")


if __name__ == "__main__":
    main()
