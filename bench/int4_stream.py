"""The int4 kernel on weights read from memory, as a verify pass meets them: ms a product.

python bench/int4_stream.py [--rows 1,4,8,16] [--paths avx512,avx2] [--threads 2] [--repeats 6]
                           [--copies 10]

A model's weights do not stay in cache between its steps (the 1.5B's int4 form is ~1 GB), so
each linear layer of a pass reads its weight from DRAM while it multiplies. This times
``int4_linear`` over a rotation of copies of two of the 1.5B's weights (gate/up 1536 -> 8960,
down 8960 -> 1536: 8.6 MB each, 10 copies, more than the last-level cache) for passes of
``--rows`` rows on each kernel path, medians over ``--repeats`` rotations. To compare two
versions of the kernel, run it from each checkout in turn (``PYTHONPATH=OTHER/src`` and
``SPECDEC_KERNELS`` set to a directory of its own, so that each builds its own kernel).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specdec.backends.quant import int4, kernels
from specdec.machine import cpu_name

PATHS = {"scalar": 0, "avx2": 1, "avx512": 2, "amx": 3}
SHAPES = {"gate/up": (1536, 8960), "down": (8960, 1536)}  # inputs, outputs
COPIES = 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,4,8,16")
    parser.add_argument("--paths", default="avx512,avx2")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument(
        "--copies",
        type=int,
        default=COPIES,
        help="copies of each weight rotated through: enough to pass the last-level cache "
        f"(default {COPIES}, 86 MB; a Xeon with a few hundred MB of L3 needs 100+)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ops = kernels.kernel()
    best = kernels.best_path()
    paths = [p for p in args.paths.split(",") if PATHS[p] <= best]
    print(f"{cpu_name()}; torch {torch.__version__}; {args.threads} threads; paths {paths}")
    print("| path | weight | " + " | ".join(f"{r} rows" for r in args.rows.split(",")) + " |")
    print("|---|---|" + "---|" * len(args.rows.split(",")))
    for name, (inputs, outputs) in SHAPES.items():
        copies = [
            int4.quantize_and_pack(torch.randn(outputs, inputs) * 0.02) for _ in range(args.copies)
        ]
        for path in paths:
            cells = []
            for rows in (int(r) for r in args.rows.split(",")):
                x = torch.randn(rows, inputs)
                times = []
                for _ in range(args.repeats):
                    for packed in copies:
                        started = time.perf_counter()
                        ops.int4_linear(x, packed, None, PATHS[path])
                        times.append(time.perf_counter() - started)
                cells.append(f"{1e3 * statistics.median(times):.3f} ms")
            print(f"| {path} | {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
