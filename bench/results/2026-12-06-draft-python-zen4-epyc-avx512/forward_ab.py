"""One model's forward as the engine calls it, in ONE process: the Python before commit fdea6f3
(rotary cos/sin by a call per position, the trimmed logits index-put, every product's path read
each pass) and after, swapped in blocks of 10 passes in turning order, medians.

    python forward_ab.py draft 1 ROUNDS      # the 0.5B draft's one-token steps
    python forward_ab.py target 6 ROUNDS     # the 1.5B's passes of 6 tokens (a verify pass)
"""

import statistics
import sys
import time

import torch

from specdec.backends.hf import source_of
from specdec.backends.layer_stack import LayerStack, _path
from specdec.backends.quant.rows import RotaryTokenByToken
from specdec.backends.trim import TrimmedHead
from specdec.loading import load_backend
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.runtime import load_draft

which = sys.argv[1]
b = (
    source_of(load_draft(DEFAULT_DRAFT, "int4", batched=True)[0])
    if which == "draft"
    else source_of(load_backend(DEFAULT_TARGET, "int4"))
)
new = {
    "rot": RotaryTokenByToken.forward,
    "trim": TrimmedHead.forward,
    "ks": LayerStack._kernel_stack,
}


def old_trim(self, x):
    scores = self.sub(x)[..., : len(self.token_ids)]
    out = torch.full((*scores.shape[:-1], self.vocab_size), float("-inf"))
    out[..., self.token_ids] = scores.float()
    return out


def old_ks(self):
    tuple(_path(p) for p in self._product_list)
    return new["ks"](self)


old = {"rot": RotaryTokenByToken._computed, "trim": old_trim, "ks": old_ks}


def use(d):
    RotaryTokenByToken.forward, TrimmedHead.forward, LayerStack._kernel_stack = (
        d["rot"],
        d["trim"],
        d["ks"],
    )


seq = b.sequence()
seq.forward(list(range(1000, 1200)), last_only=True)
res = {"old": [], "new": []}
token = 1234
rows = int(sys.argv[2])
for rnd in range(int(sys.argv[3])):
    for side in ("old", "new") if rnd % 2 == 0 else ("new", "old"):
        use(old if side == "old" else new)
        for _i in range(10):
            t = time.perf_counter()
            lg = seq.forward([token] * rows, last_only=rows == 1)
            res[side].append(time.perf_counter() - t)
            token = 1000 + int(lg[-1].argmax()) % 5000
        seq.truncate(200)
o, n = statistics.median(res["old"]), statistics.median(res["new"])
print(f"{which} {rows} rows: old {o * 1e3:.3f} ms, new {n * 1e3:.3f} ms, new/old {n / o:.3f}")
