"""Prefill passes on int4 (a prompt read from an empty cache): ms a pass and a row, by kernel
path, for the 1.5B target and the 0.5B as loaded here (a scale per 32).

python bench/prefill_rows.py [ROWS] [PATHS] [MODELS]
    e.g. python bench/prefill_rows.py 32,64,128 amx,avx512 qwen2.5-coder-1.5b-instruct

A prompt's prefill is one pass of many rows, bound by the kernel's vector work, not by the
weights' reads; plain and speculative decoding both pay it (speculation also prefills its
draft). Medians of 3 rounds, the paths interleaved in each round. To compare two versions of
the kernel, run it from each checkout in turn (``PYTHONPATH=OTHER/src`` and
``SPECDEC_KERNELS`` set to a directory of its own).
"""

from __future__ import annotations

import statistics
import sys
import time

from int4_rows import set_path  # bench/int4_rows.py, beside this script

from specdec.backends.quant import kernels
from specdec.loading import load_backend
from specdec.machine import cpu_name


def main() -> None:
    rows_list = [int(r) for r in (sys.argv[1] if len(sys.argv) > 1 else "32,64,128").split(",")]
    names = (sys.argv[2] if len(sys.argv) > 2 else "amx,avx512").split(",")
    names = [n for n in names if kernels.PATH_BY_NAME[n] <= kernels.best_path()]
    models = (sys.argv[3] if len(sys.argv) > 3 else "qwen2.5-coder-1.5b-instruct").split(",")
    print(f"{cpu_name()}; paths {names}")
    for model_name in models:
        backend = load_backend(model_name, "int4")
        ids = list(range(1000, 1000 + max(rows_list)))
        times: dict[tuple[str, int], list[float]] = {}
        for _ in range(3):
            for rows in rows_list:
                for name in names:
                    set_path(backend.model, kernels.PATH_BY_NAME[name])
                    backend.truncate(0)
                    started = time.perf_counter()
                    backend.forward(ids[:rows], last_only=True)
                    times.setdefault((name, rows), []).append(time.perf_counter() - started)
        for rows in rows_list:
            cells = []
            for name in names:
                ms = 1e3 * statistics.median(times[(name, rows)])
                cells.append(f"{name} {ms:.0f} ms ({ms / rows:.2f} a row)")
            print(f"{model_name}, {rows} rows: " + ", ".join(cells), flush=True)


if __name__ == "__main__":
    main()
