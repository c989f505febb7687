"""The int8 runtime with the int4 kernel's row operations against its torch forms.

python bench/int8_row_kernels.py [--repeats 6] [--model NAME] [--sequences 32]

Where the int4 kernel builds, the int8 runtime runs its norms, SiLU-gated product, rotary
mix and attention in the kernel's row operations, with KV caches written in place
(``int8.finish_int8_model``); where it does not, in torch's token-by-token forms. This loads
the model both ways in one process and reports, interleaved over ``--repeats`` rounds: the
median one-token step after a 64-token prompt and v(n); one pass of ``--sequences``
sequences a token each (continuous batching in ``serve``, the replies of ``heads data
--chat``), each sequence 40 tokens in; a 512-token prefill with features kept (a chunk of
``heads data``; only with the row operations: without them the model has no layer stack and
takes turns); whether a 9-token block equals its steps bit for bit;
and each form's negative log-likelihood on 1,000 held-out tokens (the row operations round
differently from torch's: a different, equally exact, int8 target).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from unittest import mock

import torch
from int4_runtime import held_out_ids, print_costs, print_nll

from specdec.backends.batched import BatchedModel, supports
from specdec.backends.quant import convert, kernels
from specdec.loading import load_backend
from specdec.machine import cpu_name


def batched_pass_ms(model, ids: list[int], sequences: int, repeats: int) -> list[float]:
    """Times of passes of ``sequences`` sequences a token each, 40 tokens into each."""
    batched = BatchedModel(model, share_prefixes=False)  # on the layer stack
    seqs = [batched.sequence() for _ in range(sequences)]
    for i, seq in enumerate(seqs):
        batched.forward_many([(seq, ids[i * 5 : i * 5 + 40], True)])
    times = []
    for r in range(repeats):
        work = [(seq, [ids[400 + r + i]], True) for i, seq in enumerate(seqs)]
        started = time.perf_counter()
        batched.forward_many(work)
        times.append(time.perf_counter() - started)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--sequences", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    print(f"CPU: {cpu_name()}; python bench/int8_row_kernels.py {' '.join(sys.argv[1:])}")
    rows = load_backend(args.model, "int8")
    with mock.patch.object(kernels, "kernel_or_none", return_value=None):  # as without a compiler
        forms = load_backend(args.model, "int8")
    assert convert.uses_row_kernels(rows.model) and not convert.uses_row_kernels(forms.model)
    backends = {"int8, torch forms": forms, "int8, row kernels": rows}
    ids = held_out_ids(rows.tokenizer)
    for name, backend in backends.items():
        backend.truncate(0)
        backend.forward(ids[:64])
        block = backend.forward(ids[64:73])
        backend.truncate(64)
        steps = torch.cat([backend.forward([token]) for token in ids[64:73]])
        print(f"{name}: 9-token block == 9 steps, bit for bit: {torch.equal(block, steps)}")
    print_costs(backends, ids, args.repeats, (2, 3, 5, 9))
    prefill: dict[str, list[float]] = {name: [] for name in backends}
    for _ in range(max(1, args.repeats // 2)):
        for name, backend in backends.items():  # as `heads data` runs a chunk
            backend.keep_hidden_states()
            backend.truncate(0)
            started = time.perf_counter()
            backend.forward(ids[:512], last_only=True)
            prefill[name].append(time.perf_counter() - started)
    for name, seconds in prefill.items():
        print(f"{name}: a 512-token chunk of heads data: {statistics.median(seconds):.2f} s")
    # Without the kernel there is no layer stack: such a model's sequences take turns.
    stacked = {name: b for name, b in backends.items() if supports(b.model)}
    times: dict[str, list[float]] = {name: [] for name in stacked}
    for _ in range(max(1, args.repeats // 2)):
        for name, backend in stacked.items():
            times[name] += batched_pass_ms(backend.model, ids, args.sequences, 4)
    for name, seconds in times.items():
        print(
            f"{name}: a pass of {args.sequences} sequences, a token each: "
            f"{statistics.median(seconds) * 1e3:.1f} ms (median of {len(seconds)})"
        )
    print_nll(backends, ids)
    return 0


if __name__ == "__main__":
    sys.exit(main())
