"""How often the int4 draft's greedy pick is the target's token, a weight scale per 32 inputs
against the draft's own form (per 128): teacher-forced over the target's greedy replies.

python bench/draft_agreement.py [--prompts-per-workload 20] [--max-tokens 128]

The default target on int4 writes its greedy reply to every shipped prompt; each draft then
reads prompt + reply in one pass and its argmax at each reply position is compared with the
reply's token (both drafts score the shipped vocabulary). No timing: the fraction is what
bounds acceptance, free of adaptive k and of the machine's pace.
"""

from __future__ import annotations

import argparse

import torch

from specdec import Engine, SamplingParams, SpecConfig
from specdec.bench.harness import WORKLOADS, load_workloads
from specdec.loading import load_backend
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.prompting import encode_prompt
from specdec.runtime import load_draft, score_draft_vocabulary


def greedy_replies(target, prompts_per_workload: int, max_tokens: int) -> list[tuple]:
    """(workload, prompt ids, reply ids): the target's greedy reply to each shipped prompt."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    replies = []
    for prompt in load_workloads(list(WORKLOADS), prompts_per_workload):
        ids = encode_prompt(target.tokenizer, prompt.prompt, prompt.template)
        reply = Engine(target).generate(ids, params, SpecConfig(k=0)).token_ids
        replies.append((prompt.id.rsplit("-", 1)[0], ids, reply))
    print(f"{len(replies)} replies, {sum(len(r) for _, _, r in replies)} tokens")
    return replies


def agreement(draft, replies: list[tuple]) -> str:
    """How often ``draft``'s argmax is the reply's token, reading prompt + reply in one pass:
    overall, then per workload."""
    agree: dict[str, list[int]] = {}
    for workload, ids, reply in replies:
        draft.truncate(0)
        logits = draft.forward(ids + reply, last_only=False)
        picks = logits[len(ids) - 1 : len(ids) + len(reply) - 1].argmax(-1)
        counts = agree.setdefault(workload, [0, 0])
        counts[0] += int((picks == torch.tensor(reply)).sum())
        counts[1] += len(reply)
    total = [sum(c[i] for c in agree.values()) for i in (0, 1)]
    by = ", ".join(f"{w} {c[0] / c[1]:.3f}" for w, c in agree.items())
    return f"{total[0] / total[1]:.4f} ({by})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts-per-workload", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    target = load_backend(DEFAULT_TARGET, "int4")
    by_32 = load_backend(DEFAULT_DRAFT, "int4")
    score_draft_vocabulary(by_32, DEFAULT_DRAFT, "auto", "int4")
    by_128, _ = load_draft(DEFAULT_DRAFT, "int4")
    replies = greedy_replies(target, args.prompts_per_workload, args.max_tokens)
    for name, draft in (("32", by_32), ("128", by_128)):
        print(f"a scale per {name} inputs: {agreement(draft, replies)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
