"""Elementwise work on a [1,022 x 32,768] float32 tensor (the heads' distillation logits, 134 MB)
in fresh and in reused memory: glibc's default against ``specdec.allocator.keep_freed_memory``.

python bench/results/2026-12-05-malloc-xeon-amx/fresh_memory.py   # fresh-memory.txt

Each setting runs in a process of its own (malloc's thresholds are per process); best of 5,
2 threads, milliseconds.
"""

from __future__ import annotations

import subprocess
import sys
import time

ROWS, VOCAB = 1022, 32768


def child(keep: bool) -> None:
    import torch

    from specdec.allocator import keep_freed_memory
    from specdec.heads.train import distill_loss

    if keep:
        assert keep_freed_memory()
    torch.manual_seed(0)
    x = torch.randn(ROWS, VOCAB)
    out = torch.empty_like(x)
    teacher = (torch.randn(ROWS, VOCAB) * 3).to(torch.bfloat16)
    student = (x * 3).to(torch.bfloat16)

    def loss():
        s = student.clone().requires_grad_()
        distill_loss(s, teacher).backward()

    work = {
        "clone": lambda: x.clone(),
        "copy into a tensor held": lambda: out.copy_(x),
        "exp": lambda: x.exp(),
        "softmax": lambda: torch.softmax(x, -1),
        "distill_loss + backward (bfloat16 logits)": loss,
    }
    for name, fn in work.items():
        best = float("inf")
        for _ in range(5):
            started = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - started)
        print(f"{name}\t{1000 * best:.1f}")


def main() -> None:
    if len(sys.argv) > 1:
        return child(sys.argv[1] == "keep")
    rows = {}
    for mode in ("default", "keep"):
        out = subprocess.run(
            [sys.executable, __file__, mode], capture_output=True, text=True, check=True
        ).stdout
        for line in out.splitlines():
            name, ms = line.split("\t")
            rows.setdefault(name, {})[mode] = ms
    print("| work | glibc default (ms) | keep_freed_memory (ms) |\n|---|---|---|")
    for name, cells in rows.items():
        print(f"| {name} | {cells['default']} | {cells['keep']} |")


if __name__ == "__main__":
    main()
