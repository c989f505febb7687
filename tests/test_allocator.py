"""keep_freed_memory: freed blocks of tens of megabytes stay in the process (glibc), in a
child process so that this one's allocator is left as it was."""

from __future__ import annotations

import subprocess
import sys

import pytest

from specdec import allocator

# A child that frees a 256 MB block it wrote and prints its resident pages before and after.
CHILD = """
import ctypes, ctypes.util, os, sys
from specdec.allocator import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size = 256 << 20
block = libc.malloc(size)
ctypes.memset(block, 1, size)
def resident():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
held = resident()
libc.free(block)
print(held, resident())
"""

glibc = pytest.mark.skipif(not allocator.on_glibc(), reason="glibc's malloc")


def _resident(mode: str) -> tuple[int, int]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True
    ).stdout
    held, after = (int(value) for value in out.split())
    return held, after


@glibc
def test_a_freed_block_stays_in_the_process():
    held, after = _resident("default")
    assert held - after > 200 << 20  # glibc's default gives the block back to the kernel
    held, after = _resident("keep")
    assert held - after < 16 << 20  # kept: the next large tensor reuses its pages


def test_elsewhere_nothing_changes(monkeypatch):
    monkeypatch.setattr(allocator.platform, "libc_ver", lambda: ("", ""))
    assert allocator.keep_freed_memory() is False
