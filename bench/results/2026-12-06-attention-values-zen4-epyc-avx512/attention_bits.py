"""The attention kernel's outputs over many shapes (query heads, kv heads, head size;
positions, rows; causal blocks and a draft tree), saved to a file: run under each source tree
(PYTHONPATH=OLD/src for the old) and compare the two files with torch.equal.

    python attention_bits.py OUT.pt
"""

import sys

import torch

from specdec.backends.quant.kernels import kernel

k = kernel()
torch.manual_seed(0)
outs = []
for heads, kv, d in [
    (12, 2, 128),
    (14, 2, 64),
    (4, 2, 16),
    (8, 1, 80),
    (6, 6, 32),
    (32, 8, 128),
    (28, 4, 128),
    (7, 1, 24),
    (18, 2, 40),
]:
    for positions, rows in [(1, 1), (9, 3), (40, 8), (300, 5), (2048, 2)]:
        q = torch.randn(rows, heads, d)
        keys, values = torch.randn(kv, positions, d), torch.randn(kv, positions, d)
        outs.append(k.causal_attention(q, keys, values, d**-0.5, []))
        if rows == 8:
            outs.append(k.causal_attention(q, keys, values, d**-0.5, [-1, 0, 0, 1, 2, 3, 4, 5]))
torch.save(outs, sys.argv[1])
print(len(outs))
