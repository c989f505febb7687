"""Where EAGLE's layer starts: random weights, or the target's own last decoder layer.

python bench/eagle_init.py [--steps 500] [--arms random,target,target-layer] [--data DIR]
    [--max-k 4] [--positions 48] [--seed 0] [--out results.json]

Trains one EAGLE head per arm on the same data for the same number of steps (``heads
train``'s loop with ``max_steps``: the same batches, in the same order, whatever the
machine's load), with the defaults ``heads train`` takes here (trimmed vocabulary,
distillation stride and precision by the CPU), then measures each as ``heads eval`` does:
greedy chain acceptance per draft position on the held-out chunks, by source (code, chat).

- ``random``: transformers' random init (``heads train --init random``).
- ``target``: ``nets.start_from_target`` (``--init target``, the default): attention,
  norms and the MLP channels of the largest weight norms copied from the target's last
  layer, its final norm copied, ``fc`` the feature's identity (the embedding's half zero).
- ``target-layer``: as ``target``, but ``fc`` keeps its random init.

The target runs on the runtime ``specdec generate`` chooses here (the features drafting
reads); the data are the cache's (``specdec heads data``) unless ``--data``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time

import torch

from specdec.backends.runtime_choice import ISA_VARIABLES
from specdec.heads import data, store
from specdec.heads.evaluate import Agreement, agreement
from specdec.heads.fingerprint import target_fingerprint
from specdec.heads.load import drafting
from specdec.heads.nets import build, start_from_target
from specdec.heads.train import (
    DEFAULT_DISTILL_EVERY,
    DEFAULT_VOCAB_SIZE,
    fresh_config,
    output_rows,
    target_layer,
    train,
    training_precision,
)
from specdec.machine import cpu_name
from specdec.theory import expected_tokens_per_round_by_position

ARMS = ("random", "target", "target-layer")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=500, help="training steps per arm")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated of {ARMS}")
    parser.add_argument("--data", help="data directory (default: the heads cache's)")
    parser.add_argument("--max-k", type=int, default=4)
    parser.add_argument("--positions", type=int, default=48, help="per held-out chunk")
    parser.add_argument(
        "--seed", type=int, default=0, help="the heads' random weights and input noise (0)"
    )
    parser.add_argument("--out", help="write the results here as JSON")
    args = parser.parse_args()
    arms = args.arms.split(",")
    if unknown := set(arms) - set(ARMS):
        parser.error(f"unknown arms {sorted(unknown)}: {', '.join(ARMS)}")

    from specdec.loading import load_backend, model_directory
    from specdec.models import DEFAULT_TARGET
    from specdec.runtime import choose_target_runtime

    runtime = choose_target_runtime("auto", DEFAULT_TARGET, None, None)
    target = load_backend(DEFAULT_TARGET, runtime)
    fingerprint = target_fingerprint(target.model)
    entry = store.entry_dir(None, fingerprint, DEFAULT_TARGET)
    data_dir = args.data or entry / "data"
    train_set, held, manifest = data.load(data_dir, fingerprint)
    precision = training_precision("auto")
    config = fresh_config(
        "eagle", target, fingerprint, train_set.tokens, DEFAULT_VOCAB_SIZE[precision]
    )
    output = output_rows(target, config.token_ids)
    embed = target.model.get_input_embeddings()
    layer, norm = target_layer(model_directory(DEFAULT_TARGET))
    results = {
        "cpu": cpu_name(),
        "held": {k: os.environ[k] for k in ISA_VARIABLES if k in os.environ},
        "target_runtime": runtime,
        "precision": precision,
        "vocab_count": config.vocab_count,
        "distill_every": DEFAULT_DISTILL_EVERY[precision],
        "data_tokens": int(train_set.tokens.numel()),
        "held_out_chunks": int(held.tokens.shape[0]),
        "steps": args.steps,
        "seed": args.seed,
        "arms": {},
    }
    print(json.dumps({k: v for k, v in results.items() if k != "arms"}), flush=True)
    for arm in arms:
        torch.manual_seed(args.seed)
        net = build(config)
        if arm != "random":
            fc = copy.deepcopy(net.fc.state_dict())
            start_from_target(net, layer, norm)
            if arm == "target-layer":
                net.fc.load_state_dict(fc)  # the random fc it was built with
        began = time.monotonic()
        record = train(
            config,
            net,
            output,
            train_set,
            minutes=1e6,
            embed=embed,
            max_steps=args.steps,
            precision=precision,
            distill_every=DEFAULT_DISTILL_EVERY[precision],
        )
        minutes = (time.monotonic() - began) / 60
        heads = drafting(config, copy.deepcopy(net), target.model)
        by_source = {}
        for source in sorted(set(held.sources)):
            agree = agreement(heads.drafter, target, held.only(source), args.max_k, args.positions)
            by_source[source] = _summary(agree, args.max_k)
        results["arms"][arm] = {
            "train_minutes": round(minutes, 2),
            "losses": record["losses"],
            "by_source": by_source,
        }
        print(json.dumps({arm: results["arms"][arm]}), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


def _summary(agree: Agreement, max_k: int) -> dict:
    return {
        "acceptance_by_position": [round(a, 3) for a in agree.acceptance],
        "trials_by_position": agree.trials,
        "expected_tokens_per_round": round(
            expected_tokens_per_round_by_position(agree.acceptance, max_k), 3
        ),
    }


if __name__ == "__main__":
    main()
