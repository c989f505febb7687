"""EAGLE's layer on features of three target layers (EAGLE-3's fusion) against the last
layer's alone (EAGLE-1's, what `specdec heads` trains), at the same budget (issue 47, item 1).

python bench/eagle_fused.py [--code-chunks 96] [--chat-replies 192] [--steps 500]
    [--unroll 1] [--layers 2,14] [--arms last,fused] [--data FILE] [--seed 0]

Data, made once and kept in ``--data`` (a torch file): chunks of 512 tokens of the standard
library's code (the corpus ``heads data`` reads) and of the target's own chat replies to the
built-in prompts of ``heads data --chat`` (``heads/chat_prompts.py``: none on a benchmark
topic; temperature 0.7, up to 192 tokens, written 24 at a time), every 6th chunk of each held
out. For every position it keeps the target's final-norm feature f_i (what EAGLE-1 reads and
predicts) and the outputs of decoder layers ``--layers`` (1-based; defaults: an early one and
the middle one of the 1.5B's 28), from transformers' forward over the int4 target, whose
final feature is the kernel's bit for bit.

Two arms, each from the target's last layer (``nets.start_from_target``), the same batches
in the same order, the same ``--steps`` (bfloat16 where native, 2 chunks a step, the
learning-rate schedule of ``heads train``), EAGLE-1's loss (the next feature's smooth L1 and
0.1 x the distillation of the output layer's distribution over the 32,768 most frequent
training tokens):

- ``last``: pair i is (f_i, embedding of t_{i+1}), as ``heads train`` today;
- ``fused``: pair i is (fuse([h_a, h_b, f_i]), embedding of t_{i+1}), ``fuse`` a linear layer
  from three features to one that starts as f_i's identity (so the arm starts where
  ``last`` does) and learns what the earlier layers add. Later drafts feed the layer's own
  predicted feature as ``last`` does.

Then, on the held-out chunks, the greedy acceptance of drafts 1..3 as ``specdec heads eval``
measures it (``evaluate.agreement``: the EAGLE drafter at 48 random positions a chunk,
accepted while each draft is the target's argmax there), code and chat apart.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch import nn

from specdec.backends.trim import TrimmedHead, float_rows
from specdec.drafters.heads import EagleDrafter
from specdec.heads import data
from specdec.heads.chat_prompts import builtin_prompts
from specdec.heads.evaluate import agreement
from specdec.heads.nets import EagleHead, start_from_target
from specdec.heads.train import (
    DISTILL_WEIGHT,
    LATER_DISTILL_EVERY,
    WARMUP_STEPS,
    _feature_loss,
    target_layer,
    training_precision,
    trimmed_vocabulary,
    unrolled,
)
from specdec.loading import load_backend, model_directory
from specdec.machine import cpu_name

TARGET = "qwen2.5-coder-1.5b-instruct"
LENGTH = 512
HELD_EVERY = 6


class FusedEagle(EagleHead):
    """EAGLE's layer whose real pairs read three features (``parts`` x hidden wide) through
    ``fuse``; a predicted feature (hidden wide) goes in as it is."""

    def __init__(self, target_config: dict, intermediate_size: int, parts: int):
        super().__init__(target_config, intermediate_size)
        hidden = self.fc.out_features
        self.fuse = nn.Linear(parts * hidden, hidden)
        with torch.no_grad():  # the last part's identity: the arm starts as EAGLE-1's
            self.fuse.weight.zero_()
            self.fuse.weight[:, -hidden:] = torch.eye(hidden)
            self.fuse.bias.zero_()

    def join(self, features: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        if features.shape[-1] != self.fc.out_features:
            features = self.fuse(features)
        return super().join(features, embeddings)


def collect(target, code_chunks: int, chat_replies: int, layers: list[int], path: Path) -> dict:
    """The data (see the module docstring), made once into ``path``."""
    if path.is_file():
        return torch.load(path, weights_only=True)
    tokenizer = target.tokenizer
    files = data.corpus_files([data.default_corpus()], data.CORPUS_SUFFIXES)
    code = []
    for ids in data.chunks(files, tokenizer, LENGTH):
        code.append(ids)
        if len(code) == code_chunks:
            break
    started = time.monotonic()
    saved = path.with_suffix(".replies.jsonl")
    documents = data.replies(target, builtin_prompts()[:chat_replies], 192, saved, batch=24)
    chat = [ids for ids, _ in data.stream_chunks(documents, LENGTH)]
    print(f"chat replies: {len(chat)} chunks in {time.monotonic() - started:.0f} s", flush=True)
    tokens, features, sources = [], [], []
    for source, chunks in (("code", code), ("chat", chat)):
        for ids in chunks:
            with torch.inference_mode():
                out = target.model.model(
                    input_ids=torch.tensor([ids]), output_hidden_states=True, use_cache=False
                )
            kept = [out.hidden_states[layer][0] for layer in layers] + [out.last_hidden_state[0]]
            tokens.append(torch.tensor(ids))
            features.append(torch.cat(kept, dim=-1).to(torch.float16))
            sources.append(source)
    made = {"tokens": torch.stack(tokens), "features": torch.stack(features)}
    made |= {"sources": sources, "layers": layers}
    torch.save(made, path)
    print(f"data: {len(tokens)} chunks in {time.monotonic() - started:.0f} s", flush=True)
    return made


def train_arm(
    net, output, embed, train_set: data.Shard, width: int, steps: int, seed: int, unroll: int
):
    """``steps`` steps of EAGLE-1's loss on the last ``width`` of each feature (the last
    hidden of them the final one, the regression's and distillation's target), with
    ``unroll`` > 1 over the drafter's later steps too (``train.unrolled``, weighed as
    ``train.eagle_loss`` weighs them: the predicted feature goes in as it is)."""
    hidden = output.shape[1]
    optimizer = torch.optim.AdamW(net.parameters(), lr=5e-4, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)  # the batches: the same for both arms
    noisy = torch.Generator().manual_seed(seed + 1)
    bf16 = training_precision("auto") == "bfloat16"
    losses = []
    net.train()
    for step in range(steps):
        scale = min(1.0, (step + 1) / WARMUP_STEPS) * (1.0 - 0.9 * step / steps)
        for group in optimizer.param_groups:
            group["lr"] = 5e-4 * scale
        pick = torch.randint(train_set.tokens.shape[0], (2,), generator=generator)
        tokens = train_set.tokens[pick]
        features = train_set.features[pick].float()
        inputs = features[:, :-1, -width:]
        noise = (torch.rand(inputs.shape, generator=noisy) - 0.5) * 0.2 * inputs.std()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            with torch.no_grad():
                embeddings = embed(tokens[:, 1:]).float()
            loss, weights = torch.zeros(()), 0.0
            for at, predicted in enumerate(unrolled(net, inputs + noise, embeddings, unroll), 1):
                scored = predicted.shape[1] - at + 1  # as train.eagle_loss weighs the steps
                every = 1 if at == 1 else LATER_DISTILL_EVERY
                actual = features[:, at:, -hidden:]
                term = _feature_loss(predicted[:, :scored], actual, output, DISTILL_WEIGHT, every)
                loss, weights = loss + 0.8 ** (at - 1) * term, weights + 0.8 ** (at - 1)
            loss = loss / weights
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    net.eval()
    window = min(20, len(losses))
    return sum(losses[:window]) / window, sum(losses[-window:]) / window


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code-chunks", type=int, default=96)
    parser.add_argument("--chat-replies", type=int, default=192)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--layers", default="2,14", help="decoder layers fused beside the last")
    parser.add_argument("--data", default="eagle_fused_data.pt")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--unroll", type=int, default=1, help="steps trained (train --unroll)")
    parser.add_argument("--arms", default="last,fused")
    args = parser.parse_args()
    layers = [int(n) for n in args.layers.split(",")]
    target = load_backend(TARGET, "int4")
    made = collect(target, args.code_chunks, args.chat_replies, layers, Path(args.data))
    hidden = target.hidden_size
    held = torch.tensor([i % HELD_EVERY == HELD_EVERY - 1 for i in range(len(made["sources"]))])
    sources = made["sources"]
    train_set = data.Shard(made["tokens"][~held], made["features"][~held])
    held_out = {}
    for source in ("code", "chat"):
        mine = held & torch.tensor([s == source for s in sources])
        held_out[source] = data.Shard(made["tokens"][mine], made["features"][mine])
    token_ids = trimmed_vocabulary(
        train_set.tokens, 32768, sorted(target.eos_token_ids), target.vocab_size
    )
    head = target.model.get_output_embeddings()
    trimmed = TrimmedHead(head, token_ids, target.vocab_size)
    output = float_rows(head, token_ids)
    embed = target.model.get_input_embeddings()
    layer = target_layer(model_directory(TARGET, verify=True))
    config = target.model.config.to_dict()
    counts = ", ".join(f"{source} {sources.count(source)}" for source in ("code", "chat"))
    print(
        f"CPU: {cpu_name()}; torch {torch.__version__}; {train_set.tokens.numel()} training "
        f"tokens ({counts} chunks, every {HELD_EVERY}th held out); layers {layers} + final; "
        f"{args.steps} steps an arm, unroll {args.unroll}"
    )
    for arm in args.arms.split(","):
        torch.manual_seed(args.seed)
        if arm == "last":
            net: EagleHead = EagleHead(config, 4096)
            width = hidden
        else:
            net = FusedEagle(config, 4096, len(layers) + 1)
            width = hidden * (len(layers) + 1)
        start_from_target(net, *layer)
        started = time.monotonic()
        first, last = train_arm(
            net, output, embed, train_set, width, args.steps, args.seed, args.unroll
        )
        minutes = (time.monotonic() - started) / 60
        for source, shard in held_out.items():
            view = data.Shard(shard.tokens, shard.features[..., -width:])
            result = agreement(
                lambda backend: EagleDrafter(backend, net, trimmed, embed),  # noqa: B023
                _FinalHead(target), view, 3, 48,
            )  # fmt: skip
            rates = " ".join(f"{rate:.3f}" for rate in result.acceptance)
            print(f"{arm}: {source} drafts 1-3 accepted {rates} (of {result.trials}); "
                  f"loss {first:.3f} -> {last:.3f}; {minutes:.1f} min", flush=True)  # fmt: skip


class _FinalHead:
    """The target as ``evaluate.agreement`` reads it: its output layer on the last hidden
    columns of a stored row (the final feature, whatever the view's width)."""

    def __init__(self, target):
        self.model, self.vocab_size = self, target.vocab_size
        self._head, self._hidden = target.model.get_output_embeddings(), target.hidden_size

    def get_output_embeddings(self):
        return lambda rows: self._head(rows[..., -self._hidden :].contiguous())


if __name__ == "__main__":
    main()
