"""One training step of the EAGLE head at the default target's sizes, timed.

python bench/heads_train_step.py [--unroll 1,2,3] [--precision auto|bfloat16|float32]
    [--distill-every 1] [--steps 4] [--vocab-count 32832] [--chunks 2] [--length 512]
    [--intermediate-size 4096]

Builds the head from the default target's config (random weights; a step's cost does not
depend on them), a batch shaped like ``heads train``'s (``--chunks`` chunks of ``--length``
tokens, random features) and the trimmed output layer's shape, then times whole steps (loss,
backward, AdamW) for each ``--unroll``, ``--distill-every`` and ``--intermediate-size``
(``heads train``'s options):
the first step of each is a warm-up, the median of the rest is reported with the steps a
minute it implies.

To see what a CPU without AVX-512 would run, restrict this one's kernels before Python
starts (an estimate: same clocks and caches, narrower vectors):
ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
    python bench/heads_train_step.py --precision float32
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from specdec.backends.runtime_choice import ISA_VARIABLES
from specdec.heads.nets import HeadsConfig, build
from specdec.heads.train import eagle_loss, training_precision
from specdec.machine import cpu_name
from specdec.models import DEFAULT_TARGET, cache_root, ensure_converted, lookup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--unroll", default="1,2,3", help="comma-separated (default 1,2,3)")
    parser.add_argument("--precision", default="auto", choices=("auto", "bfloat16", "float32"))
    parser.add_argument("--distill-every", default="1", help="comma-separated (default 1)")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per unroll, +1 warm-up")
    parser.add_argument("--vocab-count", type=int, default=32768 + 64)
    parser.add_argument("--chunks", type=int, default=2)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument(
        "--intermediate-size", default="4096", help="the layer's MLP width, comma-separated"
    )
    args = parser.parse_args()

    from transformers import AutoConfig

    target_dir = ensure_converted(lookup(DEFAULT_TARGET), cache_root())
    target_config = AutoConfig.from_pretrained(target_dir).to_dict()
    hidden = target_config["hidden_size"]
    precision = training_precision(args.precision)
    output = torch.randn(args.vocab_count, hidden) * 0.02
    embed = torch.nn.Embedding(target_config["vocab_size"], hidden)
    tokens = torch.randint(target_config["vocab_size"], (args.chunks, args.length))
    features = torch.randn(args.chunks, args.length, hidden)
    rows = []
    for width, unroll, every in (
        (int(w), int(u), int(e))
        for w in args.intermediate_size.split(",")
        for u in args.unroll.split(",")
        for e in args.distill_every.split(",")
    ):
        config = HeadsConfig(
            kind="eagle",
            fingerprint="bench",
            hidden_size=hidden,
            vocab_size=target_config["vocab_size"],
            token_ids=list(range(args.vocab_count)),
            intermediate_size=width,
            target_config=target_config,
        )
        torch.manual_seed(0)
        net = build(config)
        optimizer = torch.optim.AdamW(net.parameters(), lr=1e-5)
        seconds = []
        for _ in range(args.steps + 1):
            started = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bfloat16"):
                loss = eagle_loss(
                    net, output, tokens, features, embed, unroll=unroll, distill_every=every
                )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            seconds.append(time.perf_counter() - started)
        median = statistics.median(seconds[1:])
        rows.append(
            {
                "intermediate_size": width,
                "unroll": unroll,
                "distill_every": every,
                "step_s": round(median, 3),
                "steps_per_minute": round(60 / median, 1),
                "all_s": [round(s, 3) for s in seconds],
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    summary = {
        **machine(),
        "precision": precision,
        "batch": f"{args.chunks} x {args.length} tokens, {args.vocab_count} output rows",
        "rows": rows,
    }
    print(json.dumps(summary, indent=1))


def machine() -> dict:
    """The CPU, threads and kernels a timing ran on, with any limit put on torch's ISA."""
    return {
        "cpu": cpu_name(),
        "threads": torch.get_num_threads(),
        "kernels": torch.backends.cpu.get_cpu_capability(),
        "isa_limits": {name: os.environ[name] for name in ISA_VARIABLES if name in os.environ},
    }


if __name__ == "__main__":
    main()
