"""Keeping freed memory in the process, for work on tensors of tens of megabytes at a time.

glibc's malloc serves every block over its mmap threshold (at most 32 MiB, raised as blocks
are freed) with fresh pages from the kernel, and gives them back when the block is freed, so
each new tensor that large page-faults on every 4 KiB of it. Training the heads makes several
[1,022 x 32,768] float32 tensors a step (134 MB: the distillation's logits, their softmaxes and
gradients): on the AMX Xeon (family 6 model 167, 2 threads) a copy of one took 30-34 ms in
fresh memory and 10-11 ms in reused memory, and the distillation loss with its backward 0.295
-> 0.109 s (bench/results/2026-12-05-malloc-xeon-amx). Decoding's tensors are a few megabytes
(a verify pass's logits), which malloc's own threshold already keeps, and it measured level.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

M_TRIM_THRESHOLD = -1  # mallopt's parameters (malloc.h)
M_MMAP_THRESHOLD = -3
KEEP_BELOW = 1 << 30  # blocks under 1 GiB come from the heap and stay there once freed


def on_glibc() -> bool:
    """Whether this process allocates through glibc's malloc (Linux with glibc)."""
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def keep_freed_memory(limit: int = KEEP_BELOW) -> bool:
    """Serve blocks under ``limit`` bytes from malloc's heap and keep up to ``limit`` bytes
    of freed memory there (glibc only: elsewhere nothing changes). True where it was set.
    The process's resident memory then stays near its peak instead of falling between
    steps: right for a training run, which makes tensors of the same sizes every step."""
    if not on_glibc():
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    mallopt = ctypes.CDLL(name).mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, limit)) and bool(mallopt(M_TRIM_THRESHOLD, limit))
