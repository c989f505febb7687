"""Training heads on this CPU by self-distillation: the target's own next-token
distribution (its output layer on the stored features, over the trimmed vocabulary) is the
teacher, so no labelled data set is needed.

- Medusa: head j at position i learns the target's distribution at i + j (the token j + 1
  ahead); losses weighted 0.8^j as in the Medusa paper.
- EAGLE: the layer learns to predict ``f_{i+1}`` from ``(f_i, t_{i+1})``: a smooth-L1
  regression on the feature plus 0.1 x the distillation loss (EAGLE-1's recipe), with
  uniform noise on its input features (EAGLE's defence against drafting from its own,
  imperfect, predictions). Its layer starts as the target's last layer (``--init``).

The budget is wall-clock minutes; a checkpoint is written every minute and at the end, and
a rerun continues from it (same data, same kind). Matrix products run in bfloat16 where the
CPU has native bfloat16 arithmetic (about 4x float32 on AVX-512 BF16), else float32
(``--precision`` overrides; the record says which ran).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specdec.heads import data, store
from specdec.heads.nets import EagleHead, HeadsConfig, build, start_from_target
from specdec.vocab import top_tokens

CHECKPOINT_EVERY = 60.0  # seconds
WARMUP_STEPS = 30
MIN_STEPS = WARMUP_STEPS  # fewer never reach the full learning rate: not saved as trained
SPECIAL_SLACK = 64  # room for special tokens beyond --vocab-size
DISTILL_WEIGHT = 0.1  # EAGLE: weight of the distillation term next to the regression
LATER_DISTILL_EVERY = 4  # EAGLE unrolled: distill steps 2+ on every 4th chain (cost)


PRECISIONS = ("auto", "bfloat16", "float32")
# EAGLE: where its layer starts (``nets.start_from_target``); Medusa's heads always start as
# the identity. The target's last layer is the default: after the same 500 float32 steps its
# first chat draft was accepted 0.533 against 0.467 from random weights, code level
# (docs/notes/heads.md, "Starting from the target's last layer").
INITS = ("target", "random")
DEFAULT_INIT = "target"
# Defaults by the precision training runs in. In float32 (a CPU without native bfloat16) the
# output layer is most of a step: 16,384 rows, distilled on every 4th position, gave 2.8x
# the steps of 32,768 rows on all of them and better drafts held out after the same 12
# minutes (first draft accepted 0.375 against 0.289; docs/notes/heads.md, "Cheaper steps").
DEFAULT_VOCAB_SIZE = {"bfloat16": 32768, "float32": 16384}
DEFAULT_DISTILL_EVERY = {"bfloat16": 1, "float32": 4}  # EAGLE; Medusa always distils all


def bf16_native() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX) and torch's
    kernels are not held below it (``bf16_allowed``)."""
    from specdec.machine import cpu_flag_set

    return bf16_allowed(cpu_flag_set(), os.environ)


def bf16_allowed(flags: Collection[str], environ: Mapping[str, str]) -> bool:
    """Native bfloat16 by the CPU's ``flags`` (its flag names, or /proc/cpuinfo's line),
    unless a variable that holds torch's kernels to a smaller instruction set
    (``runtime_choice.ISA_VARIABLES``) rules it out: run held to AVX2, training takes the
    float32 defaults an AVX2 CPU gets, instead of bfloat16 products emulated in AVX2 code."""
    if "avx512_bf16" not in flags and "amx_bf16" not in flags:
        return False
    onednn = environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    with_bf16 = onednn in {"", "ALL", "DEFAULT"} or any(
        part in onednn for part in ("BF16", "AMX", "AVX10")
    )
    if not with_bf16:
        return False
    return environ.get("ATEN_CPU_CAPABILITY", "").strip().lower() not in {"avx2", "default"}


def training_precision(asked: str = "auto") -> str:
    """The precision of training's matrix products: ``asked``, or for ``auto`` bfloat16
    where the CPU multiplies it natively, else float32."""
    if asked not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {asked!r}")
    if asked == "auto":
        return "bfloat16" if bf16_native() else "float32"
    return asked


def trimmed_vocabulary(
    tokens: torch.Tensor, size: int, always: list[int], vocab_size: int | None = None
) -> list[int]:
    """The ``size`` most frequent ids in the training tokens (ties by id), plus ``always``.
    When the data has fewer distinct tokens than ``size``, the rest are the lowest unseen
    ids below ``vocab_size``: a BPE vocabulary numbers its tokens in merge order, so low
    ids are the common ones of its own training text (prose the corpus may lack)."""
    chosen = set(top_tokens(Counter(tokens.flatten().tolist()), size))
    for token in range(vocab_size or 0):
        if len(chosen) >= size:
            break
        chosen.add(token)
    return sorted(chosen | set(always))


def distill_loss(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of student logits against the teacher's softmax  # [..., vocab]"""
    target = torch.softmax(teacher.float(), dim=-1)
    return -(target * torch.log_softmax(student.float(), dim=-1)).sum(-1).mean()


def medusa_loss(
    net, output: torch.Tensor, tokens: torch.Tensor, features: torch.Tensor
) -> torch.Tensor:
    """features  # [batch, length, hidden]; output  # [vocab_count, hidden]"""
    del tokens  # Medusa reads features only
    k = net.num_heads
    length = features.shape[1]
    with torch.no_grad():
        teacher = features @ output.T  # row p: the target's logits for token p + 1
    heads = net(features[:, : length - k])  # [batch, length - k, k, hidden]
    loss = torch.zeros(())
    for j in range(k):
        student = heads[:, :, j] @ output.T
        loss = loss + 0.8**j * distill_loss(student, teacher[:, 1 + j : length - k + 1 + j])
    return loss / sum(0.8**j for j in range(k))


def unrolled_mask(pairs: int, step: int) -> torch.Tensor:
    """The keys that the queries of unrolled step ``step`` (1-based) see  # [1, 1, pairs,
    step * pairs] bool, True where seen. Keys lie as the real pairs, then each step's
    pairs in turn; query i sees the real pairs 0 .. i (what the drafter's cache holds when
    it drafts after pair i) and, of each step's block, only its own chain's pair i."""
    causal = torch.ones(pairs, pairs, dtype=torch.bool).tril()
    own = torch.eye(pairs, dtype=torch.bool)
    return torch.cat([causal] + [own] * (step - 1), dim=1)[None, None]


def eagle_loss(
    net,
    output: torch.Tensor,
    tokens: torch.Tensor,
    features: torch.Tensor,
    embed: nn.Module,
    distill_weight: float = DISTILL_WEIGHT,
    unroll: int = 1,
    distill_every: int = 1,
) -> torch.Tensor:
    """EAGLE's loss on chunks  # tokens [batch, length], features [batch, length, hidden].

    Step 1: pair i = (f_i + noise, t_{i+1}) predicts f_{i+1}. With ``unroll`` > 1 the
    drafter's later steps are rehearsed as in EAGLE-3's training-time test: at step s,
    chain i feeds its own step s - 1 prediction (of f_{i+s-1}) with the text's t_{i+s} at
    position i + s - 1, attending to the real pairs 0 .. i and its own earlier steps
    (``unrolled_mask``), and is scored on f_{i+s}; step s weighs 0.8^(s-1). The
    distillation term is taken on every ``distill_every``-th chain of step 1 (from a random
    offset: an unbiased estimate at a fraction of the output layer's cost) and on every
    ``LATER_DISTILL_EVERY``-th (or sparser) of the later steps; none at weight 0."""
    inputs = features[:, :-1]
    noise = (torch.rand_like(inputs) - 0.5) * 0.2 * inputs.std()
    with torch.no_grad():
        embeddings = embed(tokens[:, 1:]).to(features.dtype)  # row j: t_{j+1}
    loss = torch.zeros(())
    weights = 0.0
    for step, predicted in enumerate(unrolled(net, inputs + noise, embeddings, unroll), 1):
        scored = predicted.shape[1] - step + 1  # chains whose f_{i+step} is in the chunk
        if scored <= 0:
            break
        weight = 0.8 ** (step - 1)
        loss = loss + weight * _feature_loss(
            predicted[:, :scored],
            features[:, step:],
            output,
            distill_weight,
            every=distill_every if step == 1 else max(distill_every, LATER_DISTILL_EVERY),
        )
        weights += weight
    return loss / weights


def unrolled(net, features, embeddings, unroll: int) -> list[torch.Tensor]:
    """Every chain's prediction at each of ``unroll`` steps  # [batch, pairs, hidden] each:
    pairs (features f_i, embeddings of t_{i+1}) at step 1, then each chain's own previous
    prediction beside the next token's embedding (the last chains, past the chunk's end,
    repeat its last token)."""
    from transformers import DynamicCache

    pairs = features.shape[1]
    cache = DynamicCache(config=net.body.config) if unroll > 1 else None
    predicted = net(features, embeddings, cache)
    steps = [predicted]
    for step in range(2, unroll + 1):
        later = embeddings[:, min(step - 1, pairs - 1) :]
        padded = torch.cat([later, later[:, -1:].expand(-1, pairs - later.shape[1], -1)], dim=1)
        positions = torch.arange(pairs)[None] + step - 1
        predicted = net(predicted, padded, cache, positions, unrolled_mask(pairs, step))
        steps.append(predicted)
    return steps


def _feature_loss(predicted, actual, output, distill_weight: float, every: int = 1) -> torch.Tensor:
    """EAGLE-1's: smooth-L1 of the predicted features on the ``actual`` ones plus
    ``distill_weight`` x the distillation of the output layer's distribution on them (the
    target's own next-token logits), the latter on every ``every``-th position only, from a
    random offset: the output layer is most of a step's cost, and only the positions
    distilled pay for it (none at weight 0)."""
    regression = nn.functional.smooth_l1_loss(predicted.float(), actual.float())
    if not distill_weight:
        return regression
    start = int(torch.randint(min(every, predicted.shape[1]), ()))
    with torch.no_grad():
        teacher = actual[:, start::every] @ output.T
    student = predicted[:, start::every] @ output.T
    return regression + distill_weight * distill_loss(student, teacher)


def train(
    config: HeadsConfig,
    net: nn.Module,
    output: torch.Tensor,
    train_set: data.Shard,
    minutes: float,
    embed: nn.Module | None = None,
    checkpoint: Path | None = None,
    state: dict | None = None,
    progress=None,
    batch_chunks: int = 2,
    learning_rate: float | None = None,
    max_steps: int | None = None,
    distill_weight: float = DISTILL_WEIGHT,
    precision: str = "auto",
    unroll: int = 1,
    distill_every: int = 1,
    init: str | None = None,
) -> dict:
    """Train ``net`` in place for ``minutes`` (plus any time an earlier run spent, read from
    ``state``), or ``max_steps`` steps in all if that comes first; returns the training
    record (steps, tokens seen, minutes, the mean loss of every 20 steps, the precision of
    the matrix products: that of the last run where a checkpoint was continued; ``init``,
    where the caller started an EAGLE layer, as the first run said)."""
    lr = learning_rate or (1e-3 if config.kind == "medusa" else 5e-4)
    optimizer = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.0)
    record: dict[str, Any] = {"steps": 0, "tokens_seen": 0, "minutes": 0.0, "losses": []}
    if init is not None:
        record["init"] = init
    if state is not None:
        net.load_state_dict(state["net"])
        optimizer.load_state_dict(state["optimizer"])
        record = state["record"]
    budget = 60.0 * minutes
    spent_before = 60.0 * record["minutes"]
    generator = torch.Generator().manual_seed(record["steps"])
    record["precision"] = training_precision(precision)
    record["learning_rate"] = lr
    if config.kind == "eagle":
        record["unroll"] = unroll
        record["distill_every"] = distill_every
    autocast = torch.autocast(
        "cpu", dtype=torch.bfloat16, enabled=record["precision"] == "bfloat16"
    )
    if record["precision"] == "bfloat16":
        # Autocast rounds the output layer to bfloat16 in each of a step's products anyway
        # (the same bits): once here instead (docs/notes/heads.md, "Training on the AMX Xeon").
        output = output.to(torch.bfloat16)
    began = last_save = time.monotonic()
    chunks = train_set.tokens.shape[0]
    net.train()
    recent: list[float] = []
    step_seconds = 0.0  # the last step's: a step that would end past the budget is not begun
    while True:
        step_began = time.monotonic()
        elapsed = step_began - began
        if elapsed + step_seconds >= budget:
            break
        if max_steps is not None and record["steps"] >= max_steps:
            break
        fraction = (spent_before + elapsed) / max(1.0, spent_before + budget)
        if max_steps is not None:
            fraction = max(fraction, record["steps"] / max_steps)
        scale = min(1.0, (record["steps"] + 1) / WARMUP_STEPS) * (1.0 - 0.9 * fraction)
        for group in optimizer.param_groups:
            group["lr"] = lr * scale
        pick = torch.randint(chunks, (batch_chunks,), generator=generator)
        tokens = train_set.tokens[pick]
        features = train_set.features[pick].float()
        with autocast:
            if config.kind == "medusa":
                loss = medusa_loss(net, output, tokens, features)
            else:
                assert embed is not None, "EAGLE embeds tokens with the target's embedding"
                loss = eagle_loss(
                    net, output, tokens, features, embed, distill_weight, unroll, distill_every
                )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        optimizer.step()
        if not math.isfinite(loss.item()):
            raise ValueError("training diverged (loss is not finite); retry with --restart")
        recent.append(loss.item())
        record["steps"] += 1
        record["tokens_seen"] += int(tokens.numel())
        record["minutes"] = (spent_before + time.monotonic() - began) / 60.0
        if progress is not None:
            progress(f"training {config.kind} heads (seconds)", int(elapsed), int(budget))
        if len(recent) == 20:
            record["losses"].append(round(sum(recent) / len(recent), 4))
            recent = []
        if checkpoint is not None and time.monotonic() - last_save > CHECKPOINT_EVERY:
            _save_checkpoint(checkpoint, net, optimizer, record, config)
            last_save = time.monotonic()
        step_seconds = time.monotonic() - step_began
    if progress is not None:
        progress(f"training {config.kind} heads (seconds)", int(budget), int(budget))
    if checkpoint is not None:
        _save_checkpoint(checkpoint, net, optimizer, record, config)
    net.eval()
    return record


def _save_checkpoint(path: Path, net, optimizer, record: dict, config: HeadsConfig) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(
        {
            "net": net.state_dict(),
            "optimizer": optimizer.state_dict(),
            "record": record,
            "config": config.to_dict(),
        },
        tmp,
    )
    os.replace(tmp, path)


def check_args(args: argparse.Namespace) -> None:
    """``specdec heads train``'s own arguments (checked before the target loads)."""
    if args.minutes <= 0:
        raise ValueError(f"--minutes must be > 0, got {args.minutes}")
    if args.vocab_size is not None and args.vocab_size < 16:
        raise ValueError(f"--vocab-size must be >= 16, got {args.vocab_size}")
    if args.num_heads is not None and not 1 <= args.num_heads <= 16:
        raise ValueError(f"--num-heads must be in 1..16, got {args.num_heads}")
    if args.intermediate_size is not None and not 16 <= args.intermediate_size <= 65536:
        raise ValueError(f"--intermediate-size must be in 16..65536, got {args.intermediate_size}")
    if not 1 <= args.unroll <= 8:
        raise ValueError(f"--unroll must be in 1..8, got {args.unroll}")
    if args.unroll > 1 and args.kind != "eagle":
        raise ValueError("--unroll is for EAGLE (Medusa's heads do not draft on their own output)")
    if args.distill_every is not None and not 1 <= args.distill_every <= 64:
        raise ValueError(f"--distill-every must be in 1..64, got {args.distill_every}")
    if (args.distill_every or 1) > 1 and args.kind != "eagle":
        raise ValueError("--distill-every is for EAGLE (Medusa's heads learn by distilling alone)")
    if args.init is not None and args.kind != "eagle":
        raise ValueError("--init is for EAGLE (Medusa's heads start as the identity)")
    if args.learning_rate is not None and not 0 < args.learning_rate <= 0.1:
        raise ValueError(f"--learning-rate must be in (0, 0.1], got {args.learning_rate}")
    if args.distill_weight < 0:
        raise ValueError(f"--distill-weight must be >= 0, got {args.distill_weight}")


def check_continuing(
    args: argparse.Namespace, config: HeadsConfig, checkpoint: Path, started: str | None = None
) -> None:
    """Refuse shape settings given for this run that the checkpoint it would continue was
    started without (they cannot change mid-training: continuing would ignore them);
    ``started``: the EAGLE init its record names (none before ``--init`` existed: random)."""
    differ = []
    if args.init is not None and args.init != (started or "random"):
        differ.append(f"--init {args.init} (it started {started or 'random'})")
    count, asked = config.vocab_count, args.vocab_size
    # N asked gives N tokens (all of a smaller vocabulary) and up to SPECIAL_SLACK specials
    if asked is not None and not min(asked, config.vocab_size) <= count <= asked + SPECIAL_SLACK:
        differ.append(f"--vocab-size {args.vocab_size} (it scores {count} tokens)")
    if args.kind == "medusa" and args.num_heads not in (None, config.num_heads):
        differ.append(f"--num-heads {args.num_heads} (it has {config.num_heads})")
    if args.kind == "eagle" and args.intermediate_size not in (None, config.intermediate_size):
        differ.append(
            f"--intermediate-size {args.intermediate_size} (it has {config.intermediate_size})"
        )
    if differ:
        raise ValueError(
            f"{checkpoint}: the checkpoint this run would continue was started otherwise: "
            f"{'; '.join(differ)}. Add --restart to start over with these settings, or leave "
            "them out to continue (the checkpoint is kept)"
        )


def step_settings(args: argparse.Namespace, continuing: bool = False) -> tuple[int, int]:
    """(vocabulary size, distill every) as asked, else the defaults for the precision
    training runs in here; says so on stderr when a float32 default applies. The
    vocabulary of heads ``continuing`` from a checkpoint is the checkpoint's (not reported)."""
    precision = training_precision(args.precision)
    vocab_size = args.vocab_size or DEFAULT_VOCAB_SIZE[precision]
    every = args.distill_every or (DEFAULT_DISTILL_EVERY[precision] if args.kind == "eagle" else 1)
    defaults = []
    if args.vocab_size is None and not continuing:
        defaults.append(f"the heads score the {vocab_size} most frequent tokens")
    if args.distill_every is None and every > 1:
        defaults.append(f"EAGLE distils on every {every}th position")
    if precision == "float32" and defaults:
        why = "no native bfloat16 here" if args.precision == "auto" else "as asked"
        sys.stderr.write(
            f"training in float32 ({why}): {' and '.join(defaults)}, which trains faster in "
            "float32 (--vocab-size, --distill-every to change)\n"
        )
    return vocab_size, every


def fresh_config(
    kind: str,
    target,
    fingerprint: str,
    tokens: torch.Tensor,
    vocab_size: int,
    num_heads: int = HeadsConfig.num_heads,
    intermediate_size: int = HeadsConfig.intermediate_size,
) -> HeadsConfig:
    """The config of heads trained from nothing for ``target`` on data ``tokens``: they
    score the ``vocab_size`` most frequent tokens and the target's special ones."""
    special = sorted(
        {int(t) for t in getattr(target.tokenizer, "all_special_ids", [])}
        | set(target.eos_token_ids)
    )
    special = [t for t in special if 0 <= t < target.vocab_size][:SPECIAL_SLACK]
    return HeadsConfig(
        kind=kind,
        fingerprint=fingerprint,
        hidden_size=target.hidden_size,
        vocab_size=target.vocab_size,
        token_ids=trimmed_vocabulary(tokens, vocab_size, special, target.vocab_size),
        num_heads=num_heads,
        intermediate_size=intermediate_size,
        target_config=target.model.config.to_dict() if kind == "eagle" else {},
    )


def run_command(
    args: argparse.Namespace, target, fingerprint: str, data_dir: Path, entry: Path, progress
) -> int:
    """``specdec heads train`` (``check_args`` has passed), one trainer of a kind per
    target at a time. ``--minutes`` holds reading the data and building the heads too (the
    target is loaded before), so that the phases of ``heads make`` end within its budget."""
    with store.training(entry, args.kind):
        return _train_and_save(args, target, fingerprint, data_dir, entry, progress)


def _train_and_save(
    args: argparse.Namespace, target, fingerprint: str, data_dir: Path, entry: Path, progress
) -> int:
    started = time.monotonic()
    train_set, _, manifest = data.load(data_dir, fingerprint)
    num_heads = args.num_heads or HeadsConfig.num_heads
    if train_set.tokens.shape[1] < num_heads + 2:
        raise ValueError(f"{data_dir}: chunks too short to train heads")
    checkpoint = entry / f".{args.kind}.checkpoint.pt"
    state = None
    if checkpoint.exists() and not args.restart:
        try:
            state = torch.load(checkpoint, weights_only=True)
        except (OSError, RuntimeError, EOFError, ValueError):
            sys.stderr.write(f"{checkpoint}: unreadable checkpoint, starting over\n")
    if state is not None:  # refused before anything is said: the refusal is one line
        config = HeadsConfig.from_dict(state["config"])
        check_continuing(args, config, checkpoint, state["record"].get("init"))
    vocab_size, distill_every = step_settings(args, continuing=state is not None)
    if state is not None:
        sys.stderr.write(
            f"continuing from a checkpoint: {state['record']['steps']} steps, "
            f"{state['record']['minutes']:.1f} min so far, {config.vocab_count} tokens scored "
            "(--restart to start over)\n"
        )
    else:
        config = fresh_config(
            args.kind,
            target,
            fingerprint,
            train_set.tokens,
            vocab_size,
            num_heads,
            args.intermediate_size or HeadsConfig.intermediate_size,
        )
    net = build(config)
    init = None
    if isinstance(net, EagleHead) and state is None:
        init = args.init or DEFAULT_INIT
        if init == "target":
            from specdec.loading import model_directory

            start_from_target(
                net, *target_layer(model_directory(args.target, args.cache_dir, verify=True))
            )
    output = output_rows(target, config.token_ids)
    embed = target.model.get_input_embeddings()
    entry.mkdir(parents=True, exist_ok=True)
    record = train(
        config,
        net,
        output,
        train_set,
        max(0.0, args.minutes - (time.monotonic() - started) / 60.0),
        embed,
        checkpoint,
        state,
        progress,
        learning_rate=args.learning_rate,
        distill_weight=args.distill_weight,
        precision=args.precision,
        unroll=args.unroll,
        distill_every=distill_every,
        init=init,
    )
    if record["steps"] < MIN_STEPS:  # the checkpoint keeps them: a rerun adds to it
        steps = record["steps"]
        pace = f"; a step takes {60.0 * record['minutes'] / steps:.2g} s here" if steps else ""
        raise ValueError(
            f"{steps} training step{'' if steps == 1 else 's'} in {record['minutes']:.2f} min "
            f"{'is' if steps == 1 else 'are'} too few to train {args.kind} heads (at least "
            f"{MIN_STEPS}{pace}): run again with more --minutes, which continues from this "
            "run's checkpoint"
        )
    trained = HeadsConfig.from_dict(
        config.to_dict()
        | {
            "training": record
            | {
                "data_tokens": int(train_set.tokens.numel()),
                "data_minutes": round(manifest["seconds"] / 60, 2),
            }
        }
    )
    directory = store.save(entry, args.kind, trained.to_dict(), net.state_dict())
    losses = record["losses"]
    sys.stderr.write(
        f"saved {directory}: {record['steps']} steps, {record['tokens_seen']} tokens seen, "
        f"{record['minutes']:.1f} min ({record['precision']}"
        f"{', unroll ' + str(record['unroll']) if 'unroll' in record else ''}); loss "
        f"{losses[0] if losses else '?'} -> {losses[-1] if losses else '?'}\n"
    )
    return 0


def target_layer(directory: Path) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The float tensors of the target's last decoder layer (by name within the layer:
    ``self_attn.q_proj.weight`` ...) and its final norm's weight, read from the safetensors
    files of its transformers ``directory`` (what ``nets.start_from_target`` starts EAGLE's
    layer from)."""
    import json

    from safetensors import safe_open

    config = json.loads((directory / "config.json").read_text())
    prefix = f"model.layers.{int(config['num_hidden_layers']) - 1}."
    layer: dict[str, torch.Tensor] = {}
    norm = None
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(path, "pt") as weights:
            for key in weights.keys():  # noqa: SIM118 (safe_open is not iterable)
                if key.startswith(prefix):
                    layer[key[len(prefix) :]] = weights.get_tensor(key).float()
                elif key == "model.norm.weight":
                    norm = weights.get_tensor(key).float()
    if not layer or norm is None:
        raise ValueError(
            f"{directory}: no last decoder layer and final norm in its safetensors files "
            "(--init random trains without them)"
        )
    return layer, norm


def output_rows(target, token_ids: list[int]) -> torch.Tensor:
    """The target's output-layer rows for ``token_ids``  # [count, hidden] float32."""
    from specdec.backends.trim import float_rows

    return float_rows(target.model.get_output_embeddings(), token_ids)
