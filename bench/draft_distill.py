"""Distil the draft model toward the target (DistillSpec) on this CPU, and measure whether
its greedy picks agree with the target's more often.

python bench/draft_distill.py train --out DIR [--minutes 40] [--learning-rate 3e-5]
                                     [--data DIR] [--replies-only]
python bench/draft_distill.py agreement --draft DIR [DIR ...] [--runtime int4|float32]
                                         [--prompts-per-workload 20]
python bench/draft_distill.py race --draft DIR [--recipe lookup+model] [--repeats 2] [--out DIR]

``train``: the student is the default draft's transformers weights (float32, bfloat16
autocast where the CPU has it), its decoder layers, final norm and output rows of the
shipped draft vocabulary trained, the embeddings frozen. The teacher at a position is the
int4 target's own output layer (rows of that vocabulary, dequantized) applied to the
target's stored feature there: the data ``specdec heads data`` collected for the default
target (its replies to the built-in chat requests, and chunks of the standard library).
Loss: the forward KL divergence from the teacher's distribution over that vocabulary to the
student's, every position of every chunk. AdamW, linear warm-up and decay over the time
budget. Every few minutes the held-out chunks (every 20th) are scored: how often the
student's argmax is the teacher's. The trained weights are written as a transformers
directory (the full output layer with the trained rows written back).

``agreement``: the default target on int4 writes its greedy reply to every shipped prompt
(none of them in the training data); the draft as generate loads it (int4, a scale per 128
inputs, the shipped vocabulary) and the distilled one loaded the same way each read prompt +
reply in one pass; how often each one's argmax is the reply's token, per workload.
Exactness does not depend on the draft's weights (the target verifies every token).

``race``: both drafts end to end, as generate drafts (``--recipe``, k auto), every output
checked equal to the target's plain greedy text; tok/s ratios per workload.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import torch


def train(args: argparse.Namespace) -> int:
    from transformers import AutoModelForCausalLM

    from specdec import vocab
    from specdec.backends.trim import float_rows
    from specdec.heads import data as heads_data
    from specdec.heads import store
    from specdec.heads.fingerprint import target_fingerprint
    from specdec.heads.train import bf16_native
    from specdec.loading import load_backend, model_directory
    from specdec.machine import cpu_name
    from specdec.models import CATALOG, DEFAULT_DRAFT, DEFAULT_TARGET

    torch.manual_seed(0)
    target = load_backend(DEFAULT_TARGET, "int4")
    ids = vocab.load(vocab.shipped(CATALOG[DEFAULT_DRAFT].tokenizer_family), target.vocab_size)
    teacher_rows = float_rows(target.model.get_output_embeddings(), ids)  # [V, 1536]
    entry = store.entry_dir(None, target_fingerprint(target.model), DEFAULT_TARGET)
    train_set, held, manifest = heads_data.load(args.data or entry / "data")
    marker = target.tokenizer.encode("<|im_start|>assistant\n")
    end = target.tokenizer.convert_tokens_to_ids("<|im_end|>")
    del target

    def weights(tokens: torch.Tensor) -> torch.Tensor:
        """1 at the positions the loss counts: every one, or with --replies-only those
        that predict a chat reply's tokens (its first, from the turn's opening, to its end
        token)."""
        if not args.replies_only:
            return torch.ones(tokens.shape, dtype=torch.float32)
        mask = torch.zeros(tokens.shape, dtype=torch.float32)
        for row, ids in enumerate(tokens.tolist()):
            inside = False
            for i, token in enumerate(ids):  # position i predicts token i + 1
                if ids[max(0, i - len(marker) + 1) : i + 1] == marker:
                    inside = True
                elif inside and token == end:
                    inside = False
                mask[row, i] = float(inside)
        return mask

    print(f"{cpu_name()}; data {train_set.tokens.numel()} tokens, held {held.tokens.numel()}")

    source = model_directory(DEFAULT_DRAFT, None, verify=True)
    student = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    student.model.embed_tokens.weight.requires_grad_(False)
    index = torch.tensor(ids, dtype=torch.long)
    head = torch.nn.Parameter(student.lm_head.weight.detach()[index].clone())
    student.lm_head.weight.requires_grad_(False)
    params = [p for n, p in student.named_parameters() if p.requires_grad] + [head]
    optimizer = torch.optim.AdamW(params, lr=args.learning_rate, weight_decay=0.0)
    bf16 = bf16_native()  # as heads training decides: AVX-512 BF16 or AMX, not held below

    def logits_of(tokens: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            hidden = student.model(input_ids=tokens).last_hidden_state
            return (hidden @ head.t()).float()

    def teacher_of(features: torch.Tensor) -> torch.Tensor:
        return features.float() @ teacher_rows.t()

    def agreement(shard, limit: int = 8) -> float:
        student.eval()
        hits = total = 0
        with torch.no_grad():
            for i in range(min(limit, shard.tokens.shape[0])):
                tokens, features = shard.tokens[i : i + 1], shard.features[i : i + 1]
                picks = logits_of(tokens).argmax(-1)
                wanted = teacher_of(features).argmax(-1)
                counted = weights(tokens).bool()
                hits += int((picks == wanted)[counted].sum())
                total += int(counted.sum())
        student.train()
        return hits / total

    budget = 60.0 * args.minutes
    started = time.monotonic()
    log = [{"minutes": 0.0, "held_agreement": agreement(held)}]
    print(json.dumps(log[-1]))
    order = torch.randperm(train_set.tokens.shape[0])
    step = position = 0
    warmup = 10
    student.train()
    last_eval = time.monotonic()
    while time.monotonic() - started < budget:
        if position + args.batch > len(order):
            order, position = torch.randperm(train_set.tokens.shape[0]), 0
        pick = order[position : position + args.batch]
        position += args.batch
        tokens, features = train_set.tokens[pick], train_set.features[pick]
        fraction = (time.monotonic() - started) / budget
        scale = min(1.0, (step + 1) / warmup) * max(0.0, 1.0 - fraction)
        for group in optimizer.param_groups:
            group["lr"] = args.learning_rate * scale
        teacher = torch.log_softmax(teacher_of(features), dim=-1)
        student_log = torch.log_softmax(logits_of(tokens), dim=-1)
        counted = weights(tokens)
        divergence = (teacher.exp() * (teacher - student_log)).sum(-1)
        loss = (divergence * counted).sum() / counted.sum().clamp(min=1.0)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f} {(time.monotonic() - started) / 60:.1f} min")
        if time.monotonic() - last_eval > 60.0 * args.eval_every:
            log.append(
                {
                    "minutes": round((time.monotonic() - started) / 60, 2),
                    "step": step,
                    "loss": round(loss.item(), 4),
                    "held_agreement": agreement(held),
                }
            )
            print(json.dumps(log[-1]))
            last_eval = time.monotonic()
    log.append(
        {
            "minutes": round((time.monotonic() - started) / 60, 2),
            "step": step,
            "tokens_seen": step * args.batch * train_set.tokens.shape[1],
            "held_agreement": agreement(held, limit=held.tokens.shape[0]),
        }
    )
    print(json.dumps(log[-1]))
    with torch.no_grad():
        student.lm_head.weight[index] = head.detach()
    args.out.mkdir(parents=True, exist_ok=True)
    student.save_pretrained(args.out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (source / name).exists():
            shutil.copy(source / name, args.out / name)
    (args.out / "distill-log.json").write_text(
        json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "log": log}, indent=1)
    )
    print(f"saved {args.out}")
    return 0


def compare_agreement(args: argparse.Namespace) -> int:
    from draft_agreement import agreement, greedy_replies  # bench/draft_agreement.py, beside

    from specdec.loading import load_backend, model_directory
    from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
    from specdec.runtime import load_draft

    target = load_backend(DEFAULT_TARGET, "int4")
    if args.runtime == "int4":
        drafts = {"default": load_draft(DEFAULT_DRAFT, "int4")[0]}
    else:  # the float weights themselves: what training changed, before any rounding
        drafts = {"default": _distilled(model_directory(DEFAULT_DRAFT), args.runtime)}
    for path in args.draft:
        drafts[str(path)] = _distilled(path, args.runtime)
    replies = greedy_replies(target, args.prompts_per_workload, args.max_tokens)
    for name, draft in drafts.items():
        print(f"{name}: {agreement(draft, replies)}")
    return 0


def _distilled(path: Path, runtime: str = "int4"):
    """The draft at ``path`` loaded as generate loads the default draft (int4: a scale per
    128 inputs), or on transformers' float32, scoring the shipped vocabulary."""
    from specdec import vocab
    from specdec.backends.trim import trim_to_vocabulary_file
    from specdec.models import CATALOG, DEFAULT_DRAFT
    from specdec.runtime import Runtime

    backend = Runtime("transformers", runtime).load(str(path), None, None, draft=True)
    trim_to_vocabulary_file(backend, vocab.shipped(CATALOG[DEFAULT_DRAFT].tokenizer_family))
    return backend


def race(args: argparse.Namespace) -> int:
    """The default draft against the distilled one end to end (the engine as generate runs
    it: ``--recipe``, k auto), per prompt one after the other from cold caches, the order
    alternating, ``--repeats`` times; each draft keeps its own engine. Every output is
    checked equal to the target's plain greedy text."""
    import statistics

    from specdec import Engine, SamplingParams, SpecConfig
    from specdec.bench.harness import WORKLOADS, load_workloads
    from specdec.drafters.recipe import DraftSources, build_drafter
    from specdec.loading import load_backend
    from specdec.machine import cpu_name
    from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
    from specdec.prompting import encode_prompt
    from specdec.runtime import load_draft

    target = load_backend(DEFAULT_TARGET, "int4")
    drafts = {"default": load_draft(DEFAULT_DRAFT, "int4")[0], "distilled": _distilled(args.draft)}
    engines = {
        name: Engine(target, build_drafter(args.recipe, DraftSources(draft_model=lambda d=d: d)))
        for name, d in drafts.items()
    }
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    prompts = load_workloads(list(WORKLOADS), args.prompts_per_workload)
    plain: dict[str, list[int]] = {}
    runs = []
    for repeat in range(args.repeats):
        for index, prompt in enumerate(prompts):
            ids = encode_prompt(target.tokenizer, prompt.prompt, prompt.template)
            if prompt.id not in plain:
                target.truncate(0)
                plain[prompt.id] = Engine(target).generate(ids, params, SpecConfig(k=0)).token_ids
            order = list(drafts) if (index + repeat) % 2 == 0 else list(drafts)[::-1]
            for name in order:
                target.truncate(0)
                drafts[name].truncate(0)
                out = engines[name].generate(ids, params, SpecConfig(k="auto"))
                runs.append(
                    {
                        "draft": name,
                        "workload": prompt.id.rsplit("-", 1)[0],
                        "prompt_id": prompt.id,
                        "repeat": repeat,
                        "tokens_per_second": out.stats.tokens_per_second,
                        "mean_accepted_length": out.stats.mean_accepted_length,
                        "identical_to_plain": out.token_ids == plain[prompt.id],
                    }
                )
    lines = [
        f"# The distilled draft against the default ({args.recipe}, k auto)",
        "",
        f"CPU: {cpu_name()}; draft {args.draft}; {args.repeats} repeats, "
        f"{args.max_tokens} tokens, greedy.",
        "",
        "| workload | pairs | tok/s ratio distilled/default (median) | faster pairs "
        "| tok/s default | tok/s distilled | accepted length default / distilled | identical |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for workload in [*WORKLOADS, "all"]:
        mine = [r for r in runs if workload in ("all", r["workload"])]
        if not mine:
            continue
        base = {(r["prompt_id"], r["repeat"]): r for r in mine if r["draft"] == "default"}
        ratios = [
            r["tokens_per_second"] / base[(r["prompt_id"], r["repeat"])]["tokens_per_second"]
            for r in mine
            if r["draft"] == "distilled"
        ]

        def median(key: str, name: str, rows=mine) -> float:
            return statistics.median(r[key] for r in rows if r["draft"] == name)

        lines.append(
            f"| {workload} | {len(ratios)} | {statistics.median(ratios):.3f} | "
            f"{sum(x > 1 for x in ratios)}/{len(ratios)} | "
            f"{median('tokens_per_second', 'default'):.1f} | "
            f"{median('tokens_per_second', 'distilled'):.1f} | "
            f"{median('mean_accepted_length', 'default'):.2f} / "
            f"{median('mean_accepted_length', 'distilled'):.2f} | "
            f"{all(r['identical_to_plain'] for r in mine)} |"
        )
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "race.md").write_text(report)
        (args.out / "race.json").write_text(json.dumps(runs, indent=1))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    t = commands.add_parser("train")
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--minutes", type=float, default=40.0)
    t.add_argument("--learning-rate", type=float, default=3e-5)
    t.add_argument("--batch", type=int, default=2)
    t.add_argument("--eval-every", type=float, default=8.0)
    t.add_argument("--data", type=Path, help="heads data directory (default: the target's)")
    t.add_argument(
        "--replies-only", action="store_true", help="the loss on chat replies' tokens only"
    )
    a = commands.add_parser("agreement")
    a.add_argument("--draft", type=Path, nargs="+", default=[])
    a.add_argument("--prompts-per-workload", type=int, default=20)
    a.add_argument("--max-tokens", type=int, default=128)
    a.add_argument(
        "--runtime", choices=("int4", "float32"), default="int4", help="the drafts' runtime"
    )
    r = commands.add_parser("race")
    r.add_argument("--draft", type=Path, required=True)
    r.add_argument("--recipe", default="lookup+model")
    r.add_argument("--prompts-per-workload", type=int, default=20)
    r.add_argument("--repeats", type=int, default=2)
    r.add_argument("--max-tokens", type=int, default=128)
    r.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    return {"train": train, "agreement": compare_agreement, "race": race}[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
