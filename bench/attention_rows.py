"""The kernel's attention alone (row_ops.cpp ``causal_attention``): 12 query heads over 2 kv
heads, head size 128 (the 1.5B's), 1 and 8 query rows over a cache of 256 and 2,048
positions; medians of 7 batches of 50 calls, in microseconds. With ``--tree``, the 8 rows are
a draft tree (the root, two children, chains under them) instead of a causal block.

python bench/attention_rows.py LABEL [--tree]
(to compare two versions: PYTHONPATH=/path/to/other/src python bench/attention_rows.py old)
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specdec.backends.quant.kernels import kernel

TREE = [-1, 0, 0, 1, 2, 3, 4, 5]  # the root, two children, a chain under each


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("label")
    parser.add_argument("--tree", action="store_true", help="the 8 rows as a draft tree")
    args = parser.parse_args()
    torch.manual_seed(0)
    attention = kernel().causal_attention
    cells = []
    for positions in (256, 2048):
        for rows in (1, 8):
            q = torch.randn(rows, 12, 128)
            keys, values = torch.randn(2, positions, 128), torch.randn(2, positions, 128)
            extra = (TREE,) if args.tree and rows == 8 else ()
            for _ in range(20):
                attention(q, keys, values, 0.088, *extra)
            times = []
            for _ in range(7):
                started = time.perf_counter()
                for _ in range(50):
                    attention(q, keys, values, 0.088, *extra)
                times.append((time.perf_counter() - started) / 50 * 1e6)
            cells.append(f"{positions} positions, {rows} rows: {statistics.median(times):.0f} us")
    print(args.label, "|", "; ".join(cells))


if __name__ == "__main__":
    main()
