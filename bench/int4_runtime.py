"""specdec's int4 runtime against the int8 runtime and llama.cpp: step, verify-pass cost, quality.

python bench/int4_runtime.py [--repeats 6] [--lm-head int4|int8] [--model NAME]

Each runtime decodes 8 one-token steps after a 64-token prompt and then scores blocks of
2..9 tokens from the same position, interleaved over ``--repeats`` rounds in one process.
Reported: the median step, v(n) = n-token pass / step, whether the int4 runtime's block
passes equal its steps bit for bit (logits of a 9-token block against 9 steps), and the
negative log-likelihood of each runtime on 1,000 held-out tokens (the standard library's
json/decoder.py). ``--lm-head int8`` keeps the output layer in int8 (for the comparison
behind the default). This is the measurement behind docs/notes/runtime-search.md section 5.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from specdec.loading import load_backend
from specdec.machine import cpu_name

SIZES = (2, 3, 4, 5, 6, 8, 9)


def held_out_ids(tokenizer) -> list[int]:
    """The standard library's json/decoder.py, tokenized: text no model here was tuned on."""
    text = Path(os.__file__).with_name("json").joinpath("decoder.py").read_text()
    return tokenizer(text)["input_ids"]


def print_costs(backends: dict, ids: list[int], repeats: int, sizes, skip_passes=()) -> None:
    """Each backend's median one-token step after a 64-token prompt (8 steps a round) and
    v(n) for the ``sizes``, interleaved over ``repeats`` rounds; no passes for
    ``skip_passes``."""
    steps: dict[str, list[float]] = {name: [] for name in backends}
    passes: dict[tuple[str, int], list[float]] = {}
    for _ in range(repeats):
        for name, backend in backends.items():
            backend.truncate(0)
            backend.forward(ids[:64], last_only=True)
            for i in range(8):
                started = time.perf_counter()
                backend.forward([ids[64 + i]], last_only=True)
                steps[name].append(time.perf_counter() - started)
            for size in () if name in skip_passes else sizes:
                backend.truncate(64)
                started = time.perf_counter()
                backend.forward(ids[64 : 64 + size])
                passes.setdefault((name, size), []).append(time.perf_counter() - started)
    for name in backends:
        step = statistics.median(steps[name])
        curve = [
            f"v({size}) {statistics.median(passes[(name, size)]) / step:.2f}"
            for size in sizes
            if (name, size) in passes
        ]
        print(f"{name}: step {step * 1e3:.1f} ms", *curve)


def print_nll(backends: dict, ids: list[int]) -> None:
    """Each backend's negative log-likelihood of ``ids[1:1001]`` after ``ids[:1000]``."""
    target = torch.tensor(ids[1:1001])
    for name, backend in backends.items():
        backend.truncate(0)
        logits = backend.forward(ids[:1000]).float()
        nll = torch.nn.functional.cross_entropy(logits, target).item()
        print(f"{name}: negative log-likelihood on json/decoder.py (1000 tokens): {nll:.4f}")


def int4_with_int8_head(model_name: str):
    """The int4 runtime with its output layer in int8 instead (not cached)."""
    from transformers import AutoModelForCausalLM

    from specdec.backends.hf import HFModel
    from specdec.backends.quant import convert
    from specdec.backends.quant.int8 import RowInt8Linear
    from specdec.models import cache_root, ensure_converted, lookup

    directory = ensure_converted(lookup(model_name), cache_root(None))
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    head = model.get_output_embeddings()
    model.lm_head = RowInt8Linear(head)
    convert.make_int4_batch_invariant(model)
    return HFModel(model)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--lm-head", choices=["int4", "int8"], default="int4")
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--no-llamacpp", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    print(f"CPU: {cpu_name()}; python bench/int4_runtime.py {' '.join(sys.argv[1:])}")
    started = time.perf_counter()
    int4_backend = (
        load_backend(args.model, "int4")
        if args.lm_head == "int4"
        else int4_with_int8_head(args.model)
    )
    print(f"int4 loaded in {time.perf_counter() - started:.1f} s")
    backends = {"int4": int4_backend, "int8": load_backend(args.model, "int8")}
    if not args.no_llamacpp:
        backends["llama.cpp q4_k_m"] = load_backend(args.model, runtime="llamacpp")
    ids = held_out_ids(backends["int8"].tokenizer)

    int4_backend.truncate(0)
    int4_backend.forward(ids[:64])
    block = int4_backend.forward(ids[64:73])
    int4_backend.truncate(64)
    steps_logits = torch.cat([int4_backend.forward([token]) for token in ids[64:73]])
    print("int4 9-token block == 9 steps, bit for bit:", torch.equal(block, steps_logits))

    print_costs(backends, ids, args.repeats, SIZES)
    print_nll(backends, ids)
    return 0


if __name__ == "__main__":
    sys.exit(main())
