"""Would a draft tree pay on this CPU? Second choices of a head's chain, against row costs.

python bench/draft_siblings.py [--kind eagle] [--max-k 4] [--positions 200] [--data DIR]

A tree (EAGLE-2, SpecInfer) verifies more than one candidate per position in the target's
pass. Its cheapest form adds, at depth j of the greedy chain, the drafter's second choice as
a leaf: when draft j is rejected and that sibling is the target's token, the round emits the
sibling and the bonus token after it, one token more than the chain. This measures, on the
held-out chunks of the heads data and exactly as ``specdec heads eval`` walks them, per
depth j: the chain's acceptance ``a_j`` and ``b_j``, how often the chain reaches j, draft j
is rejected and the second choice is the target's token. With ``d`` such leaves (depths
1..d) a round yields ``sum_{j<=d} reach_j b_j`` tokens more, for ``d`` more rows in the
target's pass, timed here against the chain's pass (interleaved medians, as ``heads eval``
times them). The ratio printed is tree speedup / chain speedup by the paper's formula with
those measured costs: above 1.0 a tree of this shape would pay here.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from specdec.config import SamplingParams
from specdec.heads import data
from specdec.heads.evaluate import StoredTarget, costs
from specdec.heads.fingerprint import target_fingerprint
from specdec.heads.load import load_heads
from specdec.heads.store import entry_dir
from specdec.loading import load_backend
from specdec.machine import cpu_name
from specdec.sampling import Sampler
from specdec.theory import expected_tokens_per_round_by_position

TARGET = "qwen2.5-coder-1.5b-instruct"


class Recording(Sampler):
    """Greedy picks, keeping every row of logits the drafter picked from."""

    def __init__(self) -> None:
        super().__init__(SamplingParams(temperature=0.0))
        self.rows: list[torch.Tensor] = []

    def pick(self, logits, position=None):
        self.rows.append(logits.detach().clone())
        return super().pick(logits, position)


@torch.inference_mode()
def walk(make_drafter, target, held: data.Shard, max_k: int, positions: int) -> dict:
    """Per depth: trials (reached), accepted (draft == target argmax), sibling (rejected,
    and the drafter's second choice == target argmax)."""
    stored = StoredTarget(target.model, target.vocab_size)
    head = target.model.get_output_embeddings()
    counts = {name: [0] * max_k for name in ("trials", "accepted", "sibling")}
    generator = torch.Generator().manual_seed(0)
    for tokens, features in zip(held.tokens.tolist(), held.features, strict=True):
        features = features.float()
        argmax = torch.cat([head(rows).argmax(-1) for rows in features.split(128)]).tolist()
        starts = torch.randperm(len(tokens) - max_k - 2, generator=generator)[:positions]
        drafter = make_drafter(stored)
        for p in starts.sort().values.tolist():
            stored.show(tokens[: p + 1], features[: p + 1])
            sampler = Recording()
            drafts = drafter.propose(tokens[: p + 2], max_k, sampler).token_ids
            for j, token in enumerate(drafts):
                counts["trials"][j] += 1
                wanted = argmax[p + 1 + j]
                if token != wanted:
                    second = int(sampler.rows[j].topk(2).indices[1])
                    counts["sibling"][j] += second == wanted
                    break
                counts["accepted"][j] += 1
                if token != tokens[p + 2 + j]:
                    break  # accepted, but the text goes elsewhere: later depths unobservable
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kind", default="eagle", choices=["eagle", "medusa"])
    parser.add_argument("--dtype", default="int4")
    parser.add_argument("--max-k", type=int, default=4)
    parser.add_argument("--positions", type=int, default=200, help="per held-out chunk")
    parser.add_argument("--data", help="heads data directory (default: the target's entry)")
    args = parser.parse_args()
    target = load_backend(TARGET, args.dtype)
    fingerprint = target_fingerprint(target.model)
    data_dir = Path(args.data) if args.data else entry_dir(None, fingerprint, TARGET) / "data"
    heads = load_heads(args.kind, target, None, TARGET)
    _, held, _ = data.load(data_dir, fingerprint)
    k = args.max_k
    counts = walk(heads.drafter, target, held, k, args.positions)
    rate = {
        name: [n / t if t else 0.0 for n, t in zip(counts[name], counts["trials"], strict=True)]
        for name in ("accepted", "sibling")
    }
    timing = costs(heads.drafter, target, held.tokens[0, :256].tolist(), 2 * k)
    step = timing["step_s"]
    c = timing["chain_s"] / (2 * k) / step
    chain_tokens = expected_tokens_per_round_by_position(rate["accepted"], k)
    chain_cost = k * c + timing["pass_s"][k + 1] / step
    print(f"CPU: {cpu_name()}; python bench/draft_siblings.py --kind {args.kind} --max-k {k}")
    print(f"held-out chunks {held.tokens.shape[0]}, trials by depth {counts['trials']}")
    print("draft accepted by depth  " + " ".join(f"{a:.3f}" for a in rate["accepted"]))
    print("rejected, 2nd choice hit " + " ".join(f"{b:.3f}" for b in rate["sibling"]))
    print(f"step {1e3 * step:.1f} ms, c {c:.3f}, chain of {k}: {chain_tokens:.3f} tokens a round")
    reach = 1.0
    gain = 0.0
    for d in range(1, k + 1):
        gain += reach * rate["sibling"][d - 1]
        reach *= rate["accepted"][d - 1]
        tree_cost = k * c + timing["pass_s"][k + 1 + d] / step
        ratio = ((chain_tokens + gain) / tree_cost) / (chain_tokens / chain_cost)
        print(
            f"leaves at depths 1..{d}: +{gain:.3f} tokens a round, pass of {k + 1 + d} rows "
            f"{1e3 * timing['pass_s'][k + 1 + d]:.1f} ms vs {k + 1} rows "
            f"{1e3 * timing['pass_s'][k + 1]:.1f} ms: tree / chain {ratio:.3f}"
        )


if __name__ == "__main__":
    main()
