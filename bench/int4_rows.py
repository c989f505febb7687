"""int4 against int8 for passes of many rows, and the int4 kernel's cost per extra row.

python bench/int4_rows.py [--repeats 4] [--model NAME] [--path best|amx|avx512|avx2|scalar]
python bench/int4_rows.py --compare-paths amx,avx512 [--repeats 4]

1. The whole model: a pass of 1, 4, 8, 16 and 32 new tokens after 128 cached ones, on the
   int4 and the int8 runtime, interleaved over ``--repeats`` rounds, medians (what decides
   which runtime suits a server's batches; docs/notes/runtime-search.md section 9).
2. The int4 linears alone (the output layer left out): one call per layer for 1..16 rows of
   random activations, medians over 6 rounds (the cost of an extra row of a verify pass).

``--path avx2`` runs the int4 kernel's AVX2 code on an AVX-512 CPU (the paths give the same
bits): what a CPU without AVX-512 would run, at this CPU's clock and memory speed.

``--compare-paths amx,avx512``: the int4 runtime alone, one loaded model, its kernel paths
interleaved in every round (passes of 1..64 rows, then the linears alone), every pass's
logits checked equal across the paths.
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
COMPARE_PASS_ROWS = (1, 8, 9, 13, 16, 24, 32, 48, 64)
COMPARE_KERNEL_ROWS = (8, 12, 13, 16, 24, 32, 48, 64)


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


def kernel_ms(model, path: int = -1, row_counts=KERNEL_ROWS) -> dict[int, float]:
    ops = kernels.kernel()
    head = model.get_output_embeddings()
    layers = [m for m in model.modules() if isinstance(m, int4.RowInt4Linear) and m is not head]
    samples: dict[int, list[float]] = {}
    for _ in range(6):
        for rows in row_counts:
            x = {layer.in_features: torch.randn(rows, layer.in_features) for layer in layers}
            started = time.perf_counter()
            for layer in layers:
                ops.int4_linear(x[layer.in_features], layer.packed, layer.bias, path)
            samples.setdefault(rows, []).append(time.perf_counter() - started)
    return {rows: 1e3 * statistics.median(values) for rows, values in samples.items()}


def set_path(model, path: int) -> None:
    for module in model.modules():
        if isinstance(module, int4.RowInt4Linear):
            module.path = path


def compare_paths(model_name: str, names: list[str], repeats: int) -> None:
    """Each path's passes and linears, interleaved round by round on one int4 model."""
    backend = load_backend(model_name, "int4")
    paths = {name: kernels.PATH_BY_NAME[name] for name in names}
    ids = list(range(1000, 1400))
    passes: dict[tuple[str, int], list[float]] = {}
    for _ in range(repeats):
        for rows in COMPARE_PASS_ROWS:
            logits = {}
            for name, path in paths.items():
                set_path(backend.model, path)
                backend.truncate(0)
                backend.forward(ids[:128], last_only=True)
                started = time.perf_counter()
                logits[name] = backend.forward(ids[128 : 128 + rows])
                passes.setdefault((name, rows), []).append(time.perf_counter() - started)
            first = next(iter(logits.values()))
            assert all(torch.equal(first, other) for other in logits.values()), rows
    print(f"CPU: {cpu_name()}; python bench/int4_rows.py --compare-paths {','.join(names)}")
    print("whole int4 model, a pass of n rows after 128 cached (median ms; logits equal):")
    for rows in COMPARE_PASS_ROWS:
        ms = {name: 1e3 * statistics.median(passes[(name, rows)]) for name in paths}
        base = ms[names[-1]]
        cells = ", ".join(f"{name} {value:.1f}" for name, value in ms.items())
        print(f"  {rows:3d} rows: {cells}; {names[0]}/{names[-1]} {ms[names[0]] / base:.2f}")
    linears = {
        name: kernel_ms(backend.model, path, COMPARE_KERNEL_ROWS) for name, path in paths.items()
    }
    print("int4 linears without the output layer (median ms):")
    for rows in COMPARE_KERNEL_ROWS:
        cells = ", ".join(f"{name} {linears[name][rows]:.1f}" for name in paths)
        ratio = linears[names[0]][rows] / linears[names[-1]][rows]
        print(f"  {rows:3d} rows: {cells}; {names[0]}/{names[-1]} {ratio:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--path", default="best", choices=["best", *kernels.PATH_BY_NAME])
    parser.add_argument("--compare-paths", help="comma-separated paths, e.g. amx,avx512")
    args = parser.parse_args()
    if args.compare_paths:
        names = [name.strip() for name in args.compare_paths.split(",")]
        unknown = [name for name in names if name not in kernels.PATH_BY_NAME]
        if unknown or len(names) < 2:
            parser.error(f"--compare-paths: two or more of {', '.join(kernels.PATH_BY_NAME)}")
        compare_paths(args.model, names, args.repeats)
        return
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
