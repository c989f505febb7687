"""specdec's C++ kernels (``backends/kernels/``: the int4 products, the row operations, the
layer stack), compiled on first use into one extension per build and loaded once a process.

The code path a product takes (scalar, AVX2, AVX-512 VNNI, AMX-INT8) is chosen at run time
for this CPU (``best_path``) or pinned (``SPECDEC_INT4_PATH``, ``pinned_path``); a build may
be held to AVX2 (``held_build``). A build that fails is said once and not tried again in the
process.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import torch

from specdec.models import ModelError

KERNEL_FILES = tuple(
    Path(__file__).parents[1] / "kernels" / name  # backends/kernels/
    for name in ("int4_linear.cpp", "row_ops.cpp", "layer_stack.cpp", "lanes.h")
)

SOURCES = tuple(path for path in KERNEL_FILES if path.suffix == ".cpp")

PATHS = {0: "scalar", 1: "AVX2", 2: "AVX-512 VNNI", 3: "AMX-INT8"}

AMX = 3  # the tile path: AMX-INT8 for passes of 32+ rows, AVX-512 VNNI for smaller ones

_kernel = None

_kernel_lock = threading.Lock()

_failed: Exception | None = None  # this process's failed build: not tried again


class KernelUnavailable(ModelError):
    """The int4 kernel could not be compiled or loaded here (no C++ compiler, ...): the CLI
    prints its message as one line."""


def kernel_dir() -> Path:
    """Where the compiled kernel lives: $SPECDEC_KERNELS, else ~/.cache/specdec/kernels. Not
    under --cache-dir or $SPECDEC_CACHE: a kernel belongs to the machine and its builds, not
    to a model cache (a test suite with a fresh model cache still compiles once)."""
    configured = os.environ.get("SPECDEC_KERNELS")
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "specdec" / "kernels"


def kernel():
    """The compiled kernel module, built on first use (about half a minute on 2 cores) into
    ``kernel_dir()``, keyed by the source, torch and Python versions. A build that failed is
    not tried again in the same process (every int8 model load asks, ``kernel_or_none``)."""
    global _kernel, _failed
    if _kernel is not None:  # every linear layer of every step asks: no lock once loaded
        return _kernel
    with _kernel_lock:
        if _kernel is None:
            if _failed is not None:
                raise KernelUnavailable(str(_failed))
            try:
                _kernel = _build(held_build())
            except KernelUnavailable as error:
                _failed = error
                raise
        return _kernel


def kernel_or_none():
    """The kernel where it builds here (compiled now if it is not yet: said in a line on
    stderr), else None, the failure said in a line once. For what runs with or without it
    (the int8 runtime's row operations)."""
    fresh = _failed is None
    if fresh and not kernel_ready():
        sys.stderr.write(
            "specdec: compiling specdec's int4 kernel (once, about half a minute; the int8 runtime "
            "runs its row operations too)\n"
        )
    try:
        return kernel()
    except KernelUnavailable as error:
        if fresh:
            sys.stderr.write(f"specdec: the int8 runtime runs torch's forms here: {error}\n")
        return None


def kernel_ready() -> bool:
    """Whether the kernel is loaded in this process or built in the cache already (so that
    loading it takes a moment, not a compile)."""
    if _kernel is not None:
        return True
    return any((kernel_dir() / (kernel_name() + held_build())).glob("*.so"))


@functools.cache
def kernel_name() -> str:
    """The kernel's module name: keyed by its source, torch's and Python's versions."""
    source = b"".join(path.read_bytes() for path in KERNEL_FILES)
    key = hashlib.sha256(source + torch.__version__.encode() + sys.version.encode())
    return f"specdec_int4_{key.hexdigest()[:16]}"


# Builds of the kernel, by the suffix of their names: the usual one compiles the vectorized
# loops of the row operations and the activation quantizer as AVX-512, AVX2 and baseline
# clones, one chosen by the CPU when the library loads; the others leave out the wider ones.
BUILDS = {"": [], "_avx2": ["-DSPECDEC_UP_TO_AVX2"], "_baseline": ["-DSPECDEC_BASELINE_ONLY"]}


def held_build() -> str:
    """The build this process loads: the usual one, or where ``$SPECDEC_INT4_PATH`` pins the
    int4 product to its AVX2 (scalar) code, the build whose row operations stop at AVX2
    (baseline code) too, so that the one variable holds all of specdec's kernels (the clones
    agree bit for bit; only the time differs)."""
    try:
        path = pinned_path()
    except ValueError:  # refused with its message where a layer is made; the usual build here
        return ""
    return {1: "_avx2", 0: "_baseline"}.get(path, "")


def built(build: str = ""):
    """The kernel's build ``build`` (a key of ``BUILDS``), compiled on first use: ``kernel()``
    where it is the build this process runs, else loaded beside it (for tests)."""
    return kernel() if build == held_build() else _other_build(build)


@functools.cache
def _other_build(build: str):
    return _build(build)


def _build(build: str = ""):
    from torch.utils import cpp_extension

    name = kernel_name() + build
    directory = kernel_dir() / name
    directory.mkdir(parents=True, exist_ok=True)
    try:
        with _only_builder(directory):
            return cpp_extension.load(
                name=name,
                sources=[str(path) for path in SOURCES],
                build_directory=str(directory),
                extra_cflags=["-O3", "-ffp-contract=off", "-fopenmp", *BUILDS[build]],
                extra_ldflags=["-fopenmp"],
                verbose=bool(os.environ.get("SPECDEC_VERBOSE_BUILD")),
            )
    except (OSError, RuntimeError, ImportError) as error:
        raise KernelUnavailable(
            f"the int4 kernel did not build ({str(error).strip().splitlines()[-1]}); it needs a "
            "C++ compiler (g++) and ninja: use --target-runtime int8 instead"
        ) from error


@contextlib.contextmanager
def _only_builder(directory: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``directory`` while torch loads (and if need be compiles)
    the kernel there. torch serializes builds with a plain file named ``lock`` that it
    deletes when done; a process killed in between (even while only loading a built kernel,
    which takes the same lock) leaves it behind, and every later load then waits for it
    forever. The kernel lock here is an OS lock, released when its holder dies, so whoever
    holds it knows no live process is inside a build of this directory and removes a
    leftover ``lock``."""
    import fcntl

    with (directory / "specdec.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes or its holder dies
        (directory / "lock").unlink(missing_ok=True)
        yield


def best_path() -> int:
    """The kernel's code path on this CPU: 3 AMX-INT8, 2 AVX-512 VNNI, 1 AVX2, 0 scalar."""
    return int(kernel().best_path())


PATH_BY_NAME = {"amx": 3, "avx512": 2, "avx2": 1, "scalar": 0}  # PATHS, by the names users give

PATH_VARIABLE = "SPECDEC_INT4_PATH"


def pinned_path() -> int:
    """The code path new layers run: ``$SPECDEC_INT4_PATH`` (amx, avx512, avx2, scalar) pins one,
    to measure here what a CPU without AVX-512 would do (the paths agree bit for bit; the row
    operations follow, ``held_build``); else -1, the best for this CPU. A path this CPU lacks
    is refused when the layer first runs."""
    name = os.environ.get(PATH_VARIABLE, "").strip().lower()
    if not name:
        return -1
    if name not in PATH_BY_NAME:
        raise ValueError(f"{PATH_VARIABLE}={name!r}: expected one of {', '.join(PATH_BY_NAME)}")
    return PATH_BY_NAME[name]
