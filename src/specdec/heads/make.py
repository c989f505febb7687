"""``specdec heads make``: one kind of heads from nothing, data and training within one time
budget, run as the separate ``heads data`` / ``heads train`` / ``heads eval`` commands would
run them (the same code, with the target loaded once), then evaluated.

The budget is shared out by the recipes measured within 90 minutes on 2 cores
(docs/notes/heads.md): on the AVX-512 EPYC code data 17, chat data 20, EAGLE 35 + 15 minutes at
distillation weight 1.0 (87.4 minutes, the issue's goals met); on the AVX2 EPYC 19, 24, 28 +
12 (84.4). Both are close to the shares below. The code data is the target's own
completions of the standard library's documented functions (``heads data --code``) unless a
corpus is given: in the same minutes of data and training, heads trained on them accepted
more first drafts on unseen prompts than heads trained on the library's text itself
(docs/notes/heads.md, "Code the target writes itself"). A phase that ends early (a corpus
read to its end, every prompt answered) leaves its time to the phases after it, in
proportion to what they still have to run. Progress (minutes spent and phases done) is
kept beside the data, so an interrupted make continues where it stopped, and a make whose
budget ran out continues with a larger ``--minutes``. The evaluation runs after the
budget, outside it; for the default target the draft model is evaluated the same way after
it, on the same held-out chunks, so that ``--drafter auto`` compares the two by measurement.

Pure planning here; ``heads.command`` runs the phases.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

# (phase, share of the budget); the evaluation is outside the budget
SHARES = {
    "eagle": (("code", 0.20), ("chat", 0.25), ("train", 0.40), ("finish", 0.15)),
    "medusa": (("code", 0.25), ("chat", 0.30), ("train", 0.45)),
}
REPLY_TOKENS = 192  # the measured recipes' --reply-tokens
FINISH_DISTILL_WEIGHT = "1.0"  # the last EAGLE phase's --distill-weight (the recipes')
LABELS = {
    "code": "code data",
    "chat": "chat data",
    "train": "training",
    "finish": "training at distillation weight 1.0",
    "eval": "evaluation (outside the budget)",
    "compare": "the draft model's evaluation, for --drafter auto (outside the budget)",
}


@dataclass(frozen=True)
class Phase:
    name: str  # code | chat | train | finish | eval | compare
    share: float  # of the budget (0: outside it)
    argv: tuple[str, ...]  # the 'specdec heads' command it runs, without --minutes


def phases(
    kind: str,
    corpus: list[str] | None = None,
    suffix: list[str] | None = None,
    chat: bool = True,
    chat_prompts: str | None = None,
    reply_tokens: int = REPLY_TOKENS,
    length: int | None = None,
    compare: bool = False,
) -> list[Phase]:
    """The phases of making ``kind`` heads, in order (``None``: the data commands' own
    defaults); ``compare``: the draft model's evaluation last."""
    if kind not in SHARES:
        raise ValueError(f"unknown heads kind {kind!r}: {' or '.join(SHARES)}")
    chunks = () if length is None else ("--length", str(length))
    # the target completes the standard library's documented functions (``heads data
    # --code``); a corpus of one's own is read as it is
    code: tuple[str, ...] = ("data",) if corpus else ("data", "--code")
    if corpus:
        code += ("--corpus", *corpus)
    if suffix:
        code += ("--suffix", *suffix)
    code += chunks
    source = ("--chat-prompts", chat_prompts) if chat_prompts else ("--chat",)
    argv = {
        "code": code,
        "chat": ("data", *source, "--reply-tokens", str(reply_tokens), *chunks),
        "train": ("train", "--kind", kind),
        "finish": ("train", "--kind", kind, "--distill-weight", FINISH_DISTILL_WEIGHT),
    }
    made = [
        Phase(name, share, argv[name]) for name, share in SHARES[kind] if chat or name != "chat"
    ]
    evaluations = [Phase("eval", 0.0, ("eval", "--kind", kind))]
    if compare:
        evaluations.append(Phase("compare", 0.0, ("eval", "--kind", "model")))
    return [*made, *evaluations]


@dataclass
class Progress:
    """What a make of one kind has done so far (``make-<kind>.json`` in the data directory)."""

    kind: str
    spent: dict[str, float] = field(default_factory=dict)  # minutes by phase
    done: list[str] = field(default_factory=list)

    def spent_in_budget(self, plan: list[Phase]) -> float:
        return sum(self.spent.get(p.name, 0.0) for p in plan if p.share > 0)

    def save(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path, kind: str) -> Progress | None:
        """The progress saved at ``path``, or None when there is none or it is unreadable."""
        try:
            payload = json.loads(path.read_text())
            made = cls(kind, dict(payload["spent"]), list(payload["done"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return made if payload.get("kind") == kind else None


def progress_path(data_dir: Path, kind: str) -> Path:
    return data_dir / f"make-{kind}.json"


def minutes_for(plan: list[Phase], progress: Progress, budget: float, name: str) -> float:
    """Minutes phase ``name`` may run now: the budget not yet spent, shared among the phases
    not done in proportion to what each has left of its own share (so the time of a phase
    that ended early goes to the later ones, and an interrupted phase gets its rest)."""
    left = max(0.0, budget - progress.spent_in_budget(plan))
    pending = [p for p in plan if p.share > 0 and p.name not in progress.done]
    assert name in [p.name for p in pending], f"{name} is not pending"
    owed = {p.name: max(0.0, p.share * budget - progress.spent.get(p.name, 0.0)) for p in pending}
    total = sum(owed.values())
    if total <= 0.0:  # every pending phase had its share (a budget made smaller): even parts
        return left / len(pending)
    return left * owed[name] / total
