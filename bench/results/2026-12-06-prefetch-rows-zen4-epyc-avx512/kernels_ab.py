"""Two (or more) source trees' int4 kernels in ONE process, interleaved, every output checked
equal across them: the machine's swings fall on all of them alike.

    python kernels_ab.py linears ROUNDS OLD_SRC NEW_SRC [...]   # the 1.5B's int4 linears alone
    python kernels_ab.py passes ROUNDS OLD_SRC NEW_SRC [...]    # whole int4 passes, 128 cached

A tree is a directory holding ``specdec/backends/kernels/*.cpp`` (e.g. ``git archive COMMIT
src | tar x -C DIR`` gives DIR/src). ``linears``: the 1.5B's int4 linears without the output
layer, random rows, each kernel's best path (``KPATH=1`` holds them to AVX2). ``passes``: a
model (``MODEL``, default the 1.5B) loaded once, each kernel's layer stack over its weights,
a pass of n tokens after 128 cached; v = its time over the same kernel's one-row pass. The
order of the kernels turns from one measurement to the next (whichever ran first measured
slower at times). Builds go to the temporary directory."""

import gc
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from torch.utils import cpp_extension

from specdec.backends.layer_stack import LayerStack
from specdec.backends.quant import int4, kernels
from specdec.loading import load_backend
from specdec.machine import cpu_name

mode, rounds, trees = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
names = [f"{index}:{Path(tree).resolve().parent.name}" for index, tree in enumerate(trees)]
mods = {}
for name, tree in zip(names, trees, strict=True):
    build = Path(tempfile.gettempdir()) / f"kernels_ab_{name.replace(':', '_')}"
    build.mkdir(exist_ok=True)
    sources = sorted((Path(tree) / "specdec/backends/kernels").glob("*.cpp"))
    mods[name] = cpp_extension.load(
        name=f"kernels_ab_{name.split(':')[0]}",
        sources=[str(path) for path in sources],
        build_directory=str(build),
        extra_cflags=["-O3", "-ffp-contract=off", "-fopenmp"],
        extra_ldflags=["-fopenmp"],
    )
print(f"CPU: {cpu_name()}; {mode}, {rounds} rounds; " + ", ".join(names), flush=True)
samples: dict[tuple[str, int], list[float]] = {}


def rotated(turn: int) -> list[str]:
    """The kernels in a turning order: whichever runs first in a round is not always one."""
    start = turn % len(names)
    return names[start:] + names[:start]


def report(rows_list, v=False):
    one = {name: statistics.median(samples[(name, rows_list[0])]) for name in names}
    for rows in rows_list:
        ms = {name: 1e3 * statistics.median(samples[(name, rows)]) for name in names}
        cells = "  ".join(
            f"{name} {ms[name]:.1f} ms" + (f" (v {ms[name] / 1e3 / one[name]:.2f})" if v else "")
            for name in names
        )
        ratios = " ".join(f"{ms[name] / ms[names[0]]:.3f}" for name in names[1:])
        print(f"{rows:2d} rows: {cells}  over the first: {ratios}", flush=True)


if mode == "linears":
    path = int(os.environ.get("KPATH", "-1"))
    model = load_backend("qwen2.5-coder-1.5b-instruct", "int4").model
    head = model.get_output_embeddings()
    layers = [m for m in model.modules() if isinstance(m, int4.RowInt4Linear) and m is not head]
    rows_list = (1, 2, 3, 4, 5, 6, 8, 12, 16)
    for round_ in range(rounds):
        for rows in rows_list:
            x = {layer.in_features: torch.randn(rows, layer.in_features) for layer in layers}
            outs = {}
            for name in rotated(round_ + rows):
                began = time.perf_counter()
                outs[name] = [
                    mods[name].int4_linear(
                        x[layer.in_features],
                        layer.packed,
                        layer.bias,
                        path if path >= 0 else layer.path,
                    )
                    for layer in layers
                ]
                samples.setdefault((name, rows), []).append(time.perf_counter() - began)
            first = outs[names[0]]
            assert all(
                torch.equal(a, b) for out in outs.values() for a, b in zip(first, out, strict=True)
            )
    report(rows_list)
else:
    # One model, its weights shared: each kernel gets its own layer stack object over them,
    # swapped in before each pass (two loaded models differed by 3-12% with the same kernel).
    backend = load_backend(os.environ.get("MODEL", "qwen2.5-coder-1.5b-instruct"), "int4")
    warnings.filterwarnings("ignore", category=FutureWarning)  # gc meets deprecated names
    stacks = [obj for obj in gc.get_objects() if isinstance(obj, LayerStack)]
    assert len(stacks) == 1, len(stacks)
    (stack,) = stacks
    made = {}
    for name in names:
        kernels._kernel = mods[name]
        stack._stack = None
        made[name] = stack._kernel_stack()
    rows_list = (1, 2, 3, 4, 5, 6, 8, 16)
    ids = list(range(1000, 1300))
    for round_ in range(rounds):
        for rows in rows_list:
            logits = {}
            for name in rotated(round_ + rows):
                kernels._kernel = mods[name]  # the output layer asks for the kernel per call
                stack._stack = made[name]
                backend.truncate(0)
                backend.forward(ids[:128], last_only=True)
                began = time.perf_counter()
                logits[name] = backend.forward(ids[128 : 128 + rows])
                samples.setdefault((name, rows), []).append(time.perf_counter() - began)
            first = logits[names[0]]
            assert all(torch.equal(first, other) for other in logits.values())
    report(rows_list, v=True)
