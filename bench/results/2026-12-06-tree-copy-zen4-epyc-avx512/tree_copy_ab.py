"""`tree auto` before and after its copy branch was shaped by measured chance and cost (and
the runner-up's share read without copying the row), and the chain, in one process.

    python tree_copy_ab.py WORKLOADS PASSES [TEMPERATURE]

The default int4 pair, the draft model with its lookup guide (as `--drafter model`), k auto,
greedy (or TEMPERATURE with seed 7: coupled verification), 64 tokens, 3 prompts a workload;
the three systems in rotating order each pass. Every output must equal the others' (an
assertion). "before" is the new code with the two changes
undone in this process: the tree's leaves decided from `second_choice` at every depth, and
every guess the draft parts from hung as a branch.
"""

import statistics
import sys

import torch

import specdec.drafters.model as model
import specdec.speculation as speculation
from specdec import Engine, SamplingParams, SpecConfig
from specdec.bench.harness import load_workloads
from specdec.drafters.base import Proposal, Siblings
from specdec.drafters.recipe import DraftSources, build_drafter
from specdec.loading import load_backend
from specdec.machine import cpu_kind, cpu_name
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.prompting import encode_prompt
from specdec.runtime import load_draft
from specdec.tree import chain

NEW_BRANCH = speculation.Speculation._branch
NEW_TREE = model.ModelDrafter._tree


def old_branch(self, policy):  # every guess the draft parts from hung
    branch = NEW_BRANCH(self, policy)
    return branch.leaves if isinstance(branch, Siblings) else branch


def old_tree(self, context, token_ids, probs, confidences, dists, sampler, branch) -> Proposal:
    sampled = bool(probs)  # a second choice drawn at every depth, then the leaves picked
    seconds = [
        model.second_choice(dist, sampled, token_ids[depth], sampler, len(context) + depth)
        for depth, dist in enumerate(dists)
    ]
    leaves = [d for d in branch(confidences, [s[2] for s in seconds]) if seconds[d][0] >= 0]
    parents = [*chain(len(token_ids)), *(d - 1 for d in leaves)]
    nodes = token_ids + [seconds[d][0] for d in leaves]
    draft_probs = None
    if probs:
        draft_probs = torch.stack([*probs, *(seconds[d][1] for d in leaves)])
    return Proposal(nodes, draft_probs, self.name, confidences, parents)


SYSTEMS = {  # name: (tree, branch, _tree)
    "chain": ("off", NEW_BRANCH, NEW_TREE),
    "tree auto, before": ("auto", old_branch, old_tree),
    "tree auto, after": ("auto", NEW_BRANCH, NEW_TREE),
}


def main() -> None:
    workloads, passes = sys.argv[1].split(","), int(sys.argv[2])
    temperature = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    seed = 7 if temperature > 0 else None
    target = load_backend(DEFAULT_TARGET, "int4")
    draft, _ = load_draft(DEFAULT_DRAFT, "int4", target_runtime="int4")
    print(f"CPU: {cpu_name()} ({cpu_kind()}); {passes} passes, rotating order\n")
    names = list(SYSTEMS)
    runs: dict[tuple[str, str], list] = {}
    for p in range(passes):
        order = names[p % 3 :] + names[: p % 3]
        for work in workloads:
            for item in load_workloads([work], 3):
                prompt_ids = encode_prompt(target.tokenizer, item.prompt, item.template)
                outputs = {}
                for name in order:
                    tree, branch, grow = SYSTEMS[name]
                    speculation.Speculation._branch = branch
                    model.ModelDrafter._tree = grow
                    target.truncate(0)
                    drafter = build_drafter("model", DraftSources(draft_model=lambda: draft))
                    params = SamplingParams(max_tokens=64, temperature=temperature, seed=seed)
                    out = Engine(target, drafter).generate(
                        prompt_ids, params, SpecConfig(k="auto", tree=tree)
                    )
                    outputs[name] = out.token_ids
                    runs.setdefault((work, name), []).append(out.stats)
                assert len({tuple(t) for t in outputs.values()}) == 1, f"{item.id}: outputs differ"
    header = "| workload | system | tok/s | over the chain | mean accepted length | extra nodes |"
    print(header)
    print("|---|---|---|---|---|---|")
    for work in workloads:
        base = None
        for name in names:
            stats = runs[(work, name)]  # per prompt, the median of its passes; then the median
            per_prompt = [
                statistics.median(s.tokens_per_second for s in stats[i::3]) for i in range(3)
            ]
            tps = statistics.median(per_prompt)
            base = base or tps
            rounds = sum(s.rounds for s in stats)
            mal = 1 + sum(s.accepted_tokens for s in stats) / rounds
            extra = sum(s.sibling_tokens for s in stats) / rounds
            print(f"| {work} | {name} | {tps:.1f} | {tps / base:.3f}x | {mal:.2f} | {extra:.2f} |")


if __name__ == "__main__":
    main()
