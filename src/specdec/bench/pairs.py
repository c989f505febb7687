"""Paired comparison of two systems in one bench run: each ratio between their runs of the
same prompt in the same pass (a slow spell of a shared machine hits both alike), and the
sign test on how many of those pairs one system won. Pure functions, used by the bench's
summary (speedup over plain) and by ``bench/run_by_run.py`` (any two systems, pooled runs).
"""

from __future__ import annotations

import math
from collections.abc import Mapping


def paired_ratios(first: Mapping[tuple, float], second: Mapping[tuple, float]) -> list[float]:
    """``first[key] / second[key]`` for every key (a prompt and a pass) both measured, in the
    keys' sorted order; a key where ``second`` measured no rate (0) is left out."""
    return [first[key] / second[key] for key in sorted(first) if second.get(key)]


def sign_test(faster: int, slower: int) -> float:
    """Two-sided exact sign test: the chance, were each pair a fair coin, of a split at least
    as lopsided as ``faster`` against ``slower`` (ties left out before)."""
    n = faster + slower
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(max(faster, slower), n + 1)) / 2**n
    return min(1.0, 2.0 * tail)
