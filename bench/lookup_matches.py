"""How good is a prompt-lookup draft, by the length of the match it copies from?

Replays prompt lookup over the greedy outputs a ``specdec bench`` run recorded (the plain
system's ``token_ids``): at each round the longest earlier occurrence of the context's
tail (up to ``--max-ngram`` tokens) gives a draft of ``--k`` tokens, the target's text
decides how many are accepted, and the round advances by that many plus one. Prints, per
workload and match length, the rounds and the accepted tokens a round. This is what set
``drafters.lookup.IN_FRONT_MIN_NGRAM``.

    python bench/lookup_matches.py bench/results/DIR/results.json --k 4
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

from specdec.bench.harness import encode_items, load_workloads
from specdec.drafters.lookup import PromptLookupDrafter
from specdec.loading import load_tokenizer
from specdec.models import DEFAULT_TARGET


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", help="a results.json of specdec bench with a plain system")
    parser.add_argument("--system", default="plain@int4", help="whose outputs (plain@int4)")
    parser.add_argument("--k", type=int, default=4, help="tokens a draft copies (default: 4)")
    parser.add_argument("--max-ngram", type=int, default=4, help="longest match (default: 4)")
    args = parser.parse_args()

    with open(args.results) as file:
        runs = json.load(file)["runs"]
    outputs = {u["prompt_id"]: u["token_ids"] for u in runs if u["system"] == args.system}
    if not outputs:
        raise SystemExit(f"no runs of {args.system!r} with token ids in {args.results}")
    per_workload = max(int(pid.rsplit("-", 1)[1]) for pid in outputs) + 1
    items = [item for item in load_workloads(per_workload=per_workload) if item.id in outputs]
    prompts = encode_items(load_tokenizer(DEFAULT_TARGET), items)
    counts: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])  # rounds, accepted
    for item in items:
        prompt, output = prompts[item.id], outputs[item.id]
        lookup = PromptLookupDrafter(max_ngram=args.max_ngram, min_ngram=1)
        at = 0
        while at < len(output):
            context = prompt + output[:at]
            n, draft = longest_match(lookup, context, args.k)
            accepted = 0
            while accepted < len(draft) and at + accepted < len(output):
                if draft[accepted] != output[at + accepted]:
                    break
                accepted += 1
            counts[(item.workload, n)][0] += 1
            counts[(item.workload, n)][1] += accepted
            at += accepted + 1
    print("workload  match  rounds  accepted a round")
    for (workload, n), (rounds, accepted) in sorted(counts.items()):
        label = "none" if n == 0 else f"{n}"
        print(f"{workload:9} {label:>5}  {rounds:6}  {accepted / rounds:.2f}")


def longest_match(lookup: PromptLookupDrafter, context: list[int], k: int) -> tuple[int, list]:
    """(the match's length, its draft); (0, []) without one. Same index as ``propose``."""
    lookup.prepare(context)
    for n in range(min(lookup.max_ngram, len(context) - 1), 0, -1):
        end = lookup._latest_end.get(tuple(context[-n:]))
        if end is not None:
            return n, context[end : end + k]
    return 0, []


if __name__ == "__main__":
    main()
