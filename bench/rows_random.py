"""The int4 runtime's cost curve v(n) at the 1.5B's real sizes with random weights: for a CPU
that cannot fetch the real weights (a machine with no registry), where the kernels' work is
the same whatever the weights' values.

python bench/rows_random.py [--layers 28] [--vocab 151936] [--threads 2,16] [--paths best]
                            [--max-n 16] [--context 128] [--repeats 5]

A random Qwen2 with the 1.5B's layer sizes (``doctor.real_size_model``), quantized as
``make_int4_batch_invariant`` does, run through ``HFModel`` (the layer stack the int4 runtime
runs). For each thread count and kernel path: the median ms of an n-token pass after
``--context`` cached tokens (``tune.time_passes``: warm, interleaved rounds) and v(n) = that
over the 1-token step, as ``specdec cost`` prints it. Every path's logits are checked equal
on one pass of ``--max-n`` rows before timing.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from specdec.backends.hf import HFModel
from specdec.backends.quant import kernels
from specdec.backends.quant.convert import make_int4_batch_invariant
from specdec.backends.quant.int4 import RowInt4Linear
from specdec.doctor import real_size_model
from specdec.machine import cpu_name
from specdec.tune import time_passes


def set_path(model, path: int) -> None:
    for module in model.modules():
        if isinstance(module, RowInt4Linear):
            module.path = path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--threads", default=f"2,{os.cpu_count()}")
    parser.add_argument("--paths", default="best", help="comma-separated: best, amx, avx512 ...")
    parser.add_argument("--max-n", type=int, default=16)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    paths = {
        name: -1 if name == "best" else kernels.PATH_BY_NAME[name] for name in args.paths.split(",")
    }
    threads = [int(t) for t in args.threads.split(",")]

    started = time.perf_counter()
    torch.set_num_threads(max(threads))
    model = make_int4_batch_invariant(real_size_model(args.layers, args.vocab))
    backend = HFModel(model)
    print(
        f"CPU: {cpu_name()}, {os.cpu_count()} CPUs; best int4 path {kernels.best_path()}; "
        f"random {args.layers}-layer model, vocabulary {args.vocab}, built in "
        f"{time.perf_counter() - started:.0f} s"
    )
    context = [1000 + i % 1000 for i in range(args.context)]
    block = context[-args.max_n :]
    logits = {}
    for name, path in paths.items():
        set_path(model, path)
        backend.truncate(0)
        backend.forward(context, last_only=True)
        logits[name] = backend.forward(block)
    first = next(iter(logits.values()))
    same = all(torch.equal(first, other) for other in logits.values())
    print(f"logits of a {args.max_n}-row pass equal across paths {list(paths)}: {same}")

    sizes = list(range(1, args.max_n + 1))
    for count in threads:
        torch.set_num_threads(count)
        for name, path in paths.items():
            set_path(model, path)
            ms = {n: 1e3 * s for n, s in time_passes(backend, context, sizes, args.repeats).items()}
            curve = " ".join(f"{n}:{ms[n]:.1f}/{ms[n] / ms[1]:.2f}" for n in sizes)
            print(f"{count} threads, path {name}: n:ms/v(n) {curve}", flush=True)


if __name__ == "__main__":
    main()
