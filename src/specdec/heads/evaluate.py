"""``specdec heads eval``: how well trained heads draft for their target, on held-out text
and on the target's own replies to prompts no drafter trained on.

Agreement is measured with the real drafter objects reading the stored features, greedily:
at a position p of a held-out chunk the target has scored t_0..t_p and the next token
t_{p+1} is known, exactly as in decoding. Draft j (1-based, the token p + 1 + j) counts as
accepted when it equals the target's own argmax there, over its full vocabulary. The
target's argmax after draft j is known only while the drafts follow the chunk's text, so
the acceptance rate of draft j is measured over positions where drafts 1..j-1 were accepted
and equal the text (the greedy chain the engine would run). Costs are timed on the loaded
target: a chain of k drafts against a one-token step and a (k+1)-token pass, interleaved.

Held-out chunks come from the heads' own training sources (the target's completions of the
standard library's functions or the library itself, its replies to the built-in chat
requests), which favours the heads over the draft model. So the same agreement is also
measured on the target's greedy replies to ``UNSEEN_PROMPTS`` (code completions, questions,
edits and summaries that neither the heads' data nor the bench's workloads hold), and that
prediction is what ``--drafter auto`` compares (``heads.load``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec.heads import data, store
from specdec.heads.fingerprint import target_fingerprint
from specdec.heads.load import load_heads
from specdec.theory import expected_tokens_per_round_by_position, speedup_by_position

POSITIONS_PER_CHUNK = 48
UNSEEN_PROMPTS = Path(__file__).parent.parent / "data" / "unseen_prompts.jsonl"
UNSEEN_REPLY_TOKENS = 96
MIN_REPLY = 16  # tokens: a reply shorter than this leaves too few positions to draft at


class StoredTarget:
    """Stands in for the target at one position of a stored chunk: what a head drafter
    reads (cached tokens, their features, the model's embeddings)."""

    def __init__(self, model, vocab_size: int):
        self.model = model
        self.vocab_size = vocab_size
        self._tokens: Sequence[int] = []
        self._features = torch.empty(0)

    def keep_hidden_states(self) -> None:
        pass

    def show(self, tokens: Sequence[int], features: torch.Tensor) -> None:
        self._tokens, self._features = tokens, features

    @property
    def cached_token_ids(self) -> Sequence[int]:
        return self._tokens

    def hidden_states(self, start: int = 0, end: int | None = None) -> torch.Tensor:
        return self._features[start:end]


@dataclass(frozen=True)
class Agreement:
    accepted: list[int]  # per draft position: accepted
    trials: list[int]  # per draft position: positions where it was reached on the text

    @property
    def acceptance(self) -> list[float]:
        return [a / t if t else 0.0 for a, t in zip(self.accepted, self.trials, strict=True)]


@torch.inference_mode()
def agreement(make_drafter, target, held: data.Shard, max_k: int, positions: int) -> Agreement:
    """Greedy chain acceptance per draft position on held-out chunks of the drafter
    ``make_drafter(backend)`` makes (heads read the stored features through ``backend``; a
    draft model ignores it and follows the text in its own cache)."""
    generator = torch.Generator().manual_seed(0)
    texts = []
    for tokens, features in zip(held.tokens.tolist(), held.features, strict=True):
        starts = torch.randperm(len(tokens) - max_k - 2, generator=generator)[:positions]
        texts.append((tokens, features, sorted(starts.tolist())))
    return _agreement(make_drafter, target, texts, max_k)


@dataclass(frozen=True)
class Reply:
    """The target's greedy reply to one of ``UNSEEN_PROMPTS``: prompt and reply token ids,
    the target's features of every position but the last, where the reply starts."""

    kind: str  # code, chat, edit or summary
    tokens: list[int]
    features: torch.Tensor
    start: int


@torch.inference_mode()
def reply_agreement(make_drafter, target, replies: Sequence[Reply], max_k: int) -> Agreement:
    """``agreement`` over every position of each reply (drafting from its prompt on)."""
    texts = [
        (r.tokens, r.features, list(range(r.start - 1, len(r.tokens) - max_k - 2))) for r in replies
    ]
    return _agreement(make_drafter, target, texts, max_k)


def _agreement(make_drafter, target, texts, max_k: int) -> Agreement:
    """Acceptance per draft position over ``texts``: (token ids, features, positions)."""
    stored = StoredTarget(target.model, target.vocab_size)
    head = target.model.get_output_embeddings()
    accepted, trials = [0] * max_k, [0] * max_k
    for tokens, features, starts in texts:
        features = features.float()
        argmax = torch.cat([head(rows).argmax(-1) for rows in features.split(128)]).tolist()
        drafter = make_drafter(stored)  # fresh per text: a drafter's cache follows one text
        for p in starts:
            stored.show(tokens[: p + 1], features[: p + 1])
            drafts = drafter.propose(tokens[: p + 2], max_k).token_ids
            for j, token in enumerate(drafts):
                trials[j] += 1
                if token != argmax[p + 1 + j]:
                    break
                accepted[j] += 1
                if token != tokens[p + 2 + j]:
                    break  # accepted, but the text goes elsewhere: later drafts unobservable
    return Agreement(accepted, trials)


def unseen_replies(
    target, data_dir: Path, runtime: str, reply_tokens: int, progress=None
) -> list[Reply]:
    """The target's greedy replies to ``UNSEEN_PROMPTS`` (chat prompts in the target's chat
    template where it has one, else raw), with its features from one prefill pass each; a
    reply ends where the target's context does, and a prompt that leaves no room for
    ``MIN_REPLY`` tokens is left out. The replies' token ids are kept in ``data_dir`` per
    runtime (int4 and int8 round apart), so a second evaluation only prefills."""
    from specdec import Engine, SamplingParams
    from specdec.prompting import encode_prompt

    saved = data_dir / f"unseen-replies-{runtime}.json"
    fingerprint = target_fingerprint(target.model)
    kept = json.loads(saved.read_text()) if saved.is_file() else {}
    if kept.get("fingerprint") != fingerprint or kept.get("reply_tokens") != reply_tokens:
        kept = {"fingerprint": fingerprint, "reply_tokens": reply_tokens, "replies": {}}
    written = 0  # replies written now: the file is rewritten only then
    chat = bool(getattr(target.tokenizer, "chat_template", None))
    replies = []
    lines = UNSEEN_PROMPTS.read_text().splitlines()
    for done, line in enumerate(lines):
        if progress is not None:
            progress("the target's replies to unseen prompts", done, len(lines))
        prompt = json.loads(line)
        template = prompt["template"] if chat else "raw"
        ids = encode_prompt(target.tokenizer, prompt["prompt"], template)
        room = reply_tokens if target.max_length is None else target.max_length - len(ids) - 1
        if min(room, reply_tokens) < MIN_REPLY:
            continue
        tokens = kept["replies"].get(prompt["id"])
        if tokens is None or tokens[: len(ids)] != ids:
            params = SamplingParams(max_tokens=min(room, reply_tokens), temperature=0.0)
            tokens = ids + Engine(target).generate(ids, params).token_ids
            kept["replies"][prompt["id"]] = tokens
            written += 1
        target.keep_hidden_states()
        target.truncate(0)
        target.forward(tokens[:-1])
        kind = prompt["id"].split("-")[1]
        replies.append(Reply(kind, tokens, target.hidden_states().clone(), len(ids)))
    if progress is not None:
        progress("the target's replies to unseen prompts", len(lines), len(lines))
    if written:
        data_dir.mkdir(parents=True, exist_ok=True)
        temporary = saved.with_suffix(".tmp")
        temporary.write_text(json.dumps(kept))
        temporary.replace(saved)
    return replies


def costs(make_drafter, target, prompt: list[int], max_k: int, repeats: int = 9) -> dict:
    """Median seconds of a one-token target step, of a (k+1)-token pass for every k up to
    ``max_k``, and of a ``max_k``-draft chain, timed interleaved after ``prompt`` is cached."""
    drafter = make_drafter(target)
    target.truncate(0)
    target.forward(prompt[:-1], last_only=True)
    drafter.prepare(prompt)
    base = len(prompt) - 1
    step, chains = [], []
    passes: dict[int, list[float]] = {n: [] for n in range(2, max_k + 2)}
    for _ in range(repeats + 1):
        started = time.perf_counter()
        target.forward([prompt[-1]], last_only=True)
        step.append(time.perf_counter() - started)
        target.truncate(base)
        for n, times in passes.items():
            started = time.perf_counter()
            target.forward(prompt[-1:] * n)
            times.append(time.perf_counter() - started)
            target.truncate(base)
        started = time.perf_counter()
        drafter.propose(prompt, max_k)
        chains.append(time.perf_counter() - started)
    return {
        "step_s": statistics.median(step[1:]),
        "pass_s": {n: statistics.median(times[1:]) for n, times in passes.items()},
        "chain_s": statistics.median(chains[1:]),
    }


def speedups_by_k(acceptance: list[float], timing: dict, max_k: int) -> list[float]:
    """The paper's speedup for every fixed k = 1..max_k: tokens a round over k c + v(k+1),
    with per-position acceptance, c per draft and each pass size measured. On a runtime
    whose pass cost grows steeply with its rows (int4) the best k is short, so a prediction
    at max_k alone would undersell a drafter that k = auto runs shorter."""
    c = timing["chain_s"] / max_k / timing["step_s"]
    return [
        speedup_by_position(acceptance, k, c, timing["pass_s"][k + 1] / timing["step_s"])
        for k in range(1, max_k + 1)
    ]


def summarize(agree: Agreement, timing: dict, max_k: int) -> dict:
    acceptance = agree.acceptance
    c = timing["chain_s"] / max_k / timing["step_s"]
    v = timing["pass_s"][max_k + 1] / timing["step_s"]
    tokens = expected_tokens_per_round_by_position(acceptance, max_k)
    by_k = speedups_by_k(acceptance, timing, max_k)
    best = max(range(max_k), key=lambda i: by_k[i])
    return {
        "k": max_k,
        "acceptance_by_position": [round(a, 3) for a in acceptance],
        "trials_by_position": agree.trials,
        "expected_tokens_per_round": round(tokens, 3),
        "c_per_draft": round(c, 4),
        "v": round(v, 3),
        "v_by_size": {n: round(t / timing["step_s"], 3) for n, t in timing["pass_s"].items()},
        "predicted_speedup_by_k": [round(x, 3) for x in by_k],
        "best_k": best + 1,
        "predicted_speedup": round(by_k[best], 3),  # at the best k: what --drafter auto compares
        "step_ms": round(1000 * timing["step_s"], 2),
        "chain_ms": round(1000 * timing["chain_s"], 2),
    }


def unseen_summary(make_drafter, target, replies: Sequence[Reply], timing: dict, max_k: int):
    """What ``summarize`` says of the agreement on ``replies``, with each kind's first-draft
    acceptance and predicted speedup."""
    by_kind = {
        kind: reply_agreement(make_drafter, target, [r for r in replies if r.kind == kind], max_k)
        for kind in dict.fromkeys(r.kind for r in replies)
    }
    whole = summarize(_pooled(by_kind.values(), max_k), timing, max_k)
    keys = ("acceptance_by_position", "expected_tokens_per_round", "best_k", "predicted_speedup")
    summary: dict = {key: whole[key] for key in keys} | {"prompts": len(replies)}
    summary["by_kind"] = {}
    for kind, agree in by_kind.items():
        result = summarize(agree, timing, max_k)
        summary["by_kind"][kind] = {
            "first_draft_acceptance": result["acceptance_by_position"][0],
            "predicted_speedup": result["predicted_speedup"],
        }
    return summary


def _pooled(parts, max_k: int) -> Agreement:
    parts = list(parts)
    return Agreement(
        [sum(a.accepted[j] for a in parts) for j in range(max_k)],
        [sum(a.trials[j] for a in parts) for j in range(max_k)],
    )


def check_args(args: argparse.Namespace) -> None:
    """``specdec heads eval``'s own arguments (checked before the target loads)."""
    if not 1 <= args.max_k <= 16:
        raise ValueError(f"--max-k must be in 1..16, got {args.max_k}")
    if args.positions < 1:
        raise ValueError(f"--positions must be >= 1, got {args.positions}")


def run_command(
    args: argparse.Namespace, target, fingerprint: str, data_dir: Path, entry: Path, progress
) -> int:
    """``specdec heads eval`` (``check_args`` has passed)."""
    max_k = args.max_k
    label = args.kind
    if args.kind == "model":
        from specdec import vocab
        from specdec.drafters import ModelDrafter
        from specdec.runtime import load_draft

        draft, draft_on = load_draft(
            args.draft, args.draft_runtime, args.cache_dir, progress, args.dtype, args.dtype,
            args.draft_vocab,
        )  # fmt: skip
        runtime = draft_on.library  # the label names the library, as before
        default = args.draft_runtime == "auto" and args.draft_vocab == vocab.AUTO
        suffix = {vocab.AUTO: "", vocab.FULL: "-full"}.get(args.draft_vocab, "-trimmed")
        label = "model" if default else f"model-{runtime}{suffix}"

        def make_drafter(backend):
            return ModelDrafter(draft)
    else:
        heads = load_heads(args.kind, target, args.cache_dir, args.target)
        make_drafter = heads.drafter
        if args.kind == "medusa":
            max_k = min(max_k, heads.config.num_heads)
    _, held, _ = data.load(data_dir, fingerprint)
    if held.tokens.shape[0] == 0:
        raise ValueError(
            f"{data_dir}: no held-out chunks (every {data.HELD_OUT}th chunk is held out): "
            "collect more data"
        )
    by_source = {
        source: agreement(make_drafter, target, held.only(source), max_k, args.positions)
        for source in sorted(set(held.sources))
    }
    agree = _pooled(by_source.values(), max_k)
    timing = costs(make_drafter, target, held.tokens[0, :256].tolist(), max_k)
    result = summarize(agree, timing, max_k)
    result["held_out_chunks"] = int(held.tokens.shape[0])
    if len(by_source) > 1:  # code and chat acceptance differ: each is reported
        result["by_source"] = {
            source: {
                key: value
                for key, value in summarize(part, timing, max_k).items()
                if key
                in (
                    "acceptance_by_position",
                    "expected_tokens_per_round",
                    "best_k",
                    "predicted_speedup",
                )
            }
            | {"held_out_chunks": held.sources.count(source)}
            for source, part in by_source.items()
        }
    replies = unseen_replies(target, data_dir, args.dtype, UNSEEN_REPLY_TOKENS, progress)
    if replies:  # none where the target's context holds no prompt with room for a reply
        result["unseen_prompts"] = unseen_summary(make_drafter, target, replies, timing, max_k)
    result["target_runtime"] = args.dtype
    result["drafter"] = label if args.kind != "model" else f"{label} ({args.draft}, {runtime})"
    store.save_eval(entry, label, result, args.dtype)
    json.dump(result, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0
