"""The 0.5B draft's one-token forward as the engine drafts it (int4, the shipped vocabulary), its
Python and torch parts timed one by one (``BatchedModel._forward`` written out here with
clocks): medians over 300 steps after 64 tokens.

    python draft_step_parts.py
"""

import collections
import statistics
import time

import torch

from specdec.backends import batched as B
from specdec.backends.hf import source_of
from specdec.models import DEFAULT_DRAFT
from specdec.runtime import load_draft

pc = time.perf_counter
acc = collections.defaultdict(list)


@torch.inference_mode()
def _forward(self, work, parents):
    t0 = pc()
    ids = [t for _, tokens, _ in work for t in tokens]
    positions = [
        p
        for seq, tokens, _ in work
        for p in range(len(seq.cached_token_ids), len(seq.cached_token_ids) + len(tokens))
    ]
    starts = [0]
    for _, tokens, _ in work:
        starts.append(starts[-1] + len(tokens))
    t1 = pc()
    hidden = self.embed_tokens(torch.tensor([ids], dtype=torch.long))
    t2 = pc()
    rotary = self.rotary_emb(hidden, torch.tensor([positions], dtype=torch.long))
    t3 = pc()
    segments = [(seq.layers, starts[i], starts[i + 1]) for i, (seq, _, _) in enumerate(work)]
    h = self.stack.forward(hidden[0], rotary, segments, parents)
    t4 = pc()
    hidden = self.norm(h.unsqueeze(0))
    t5 = pc()
    rows = [
        row
        for i, (_, _, last_only) in enumerate(work)
        if last_only is not None
        for row in ([starts[i + 1] - 1] if last_only else range(starts[i], starts[i + 1]))
    ]
    lm_head = self.model.get_output_embeddings()
    sub = getattr(lm_head, "sub", None)
    x = hidden[:, rows]
    t6 = pc()
    sub(x)
    t7 = pc()
    logits = lm_head(x)[0, :, : self.vocab_size].float()
    t8 = pc()
    out, at = [], 0
    for i, (seq, tokens, last_only) in enumerate(work):
        count = 0 if last_only is None else 1 if last_only else len(tokens)
        out.append(logits[at : at + count])
        at += count
        seq._commit(tokens, hidden[0, starts[i] : starts[i + 1]].float())
    t9 = pc()
    for name, a, b in (
        ("lists", t0, t1),
        ("embed", t1, t2),
        ("rotary", t2, t3),
        ("stack", t3, t4),
        ("norm", t4, t5),
        ("rows", t5, t6),
        ("sub", t6, t7),
        ("trimmed head (sub again + scatter)", t7, t8),
        ("commit", t8, t9),
    ):
        acc[name].append(b - a)
    return out


B.BatchedModel._forward = _forward
loaded, _ = load_draft(DEFAULT_DRAFT, "int4", batched=True)
b = source_of(loaded)
ks = b.stack._kernel_stack()


class K:
    def forward(s, *a):
        t = pc()
        r = ks.forward(*a)
        acc["  kernel (in stack)"].append(pc() - t)
        return r


kk = K()
orig_ks = b.stack._kernel_stack


def g2():
    t = pc()
    orig_ks()
    acc["  _kernel_stack check"].append(pc() - t)
    return kk


b.stack._kernel_stack = g2
seq = b.sequence()
seq.forward(list(range(1000, 1064)), last_only=True)

token = 1234
for _i in range(300):
    lg = seq.forward([token], last_only=True)
    token = int(lg[-1].argmax())
    if len(seq.cached_token_ids) > 400:
        seq.truncate(64)
for k, v in acc.items():
    print(f"{k}: {statistics.median(v) * 1e6:.0f} us")
