#!/bin/bash
# The old tree: this repository at a6a0329 (before BatchedModel.PASS_ROWS), unpacked to
# /tmp/exp/old with git archive; the new: the working tree. The prompt: long_prompt.txt beside this script.
# old (before split passes) and new source trees in turn: a 1,412-token prompt, 32 tokens,
# the default pair and drafter, --compare (speculative and plain), --json
P="$(cat long_prompt.txt)"
for rep in 1 2 3; do
  for tree in old new; do
    if [ $tree = old ]; then SRC=/tmp/exp/old/src; else SRC=/work/main/src; fi
    PYTHONPATH=$SRC python -c "import sys; from specdec.cli import main; sys.argv=['specdec']+sys.argv[1:]; sys.exit(main())" \
      generate "$P" --chat --max-tokens 32 --compare --json 2>/dev/null > /tmp/exp/out_${tree}_${rep}.json
    python - "$tree" "$rep" <<'PY'
import json, sys
tree, rep = sys.argv[1:]
d = json.load(open(f"/tmp/exp/out_{tree}_{rep}.json"))
s, c = d["stats"], d.get("compare", {})
print(f"{tree} run {rep}: prefill {s.get('prefill_seconds', float('nan')):.2f} s, total {s.get('total_seconds', s.get('seconds', float('nan')))}, tok/s {s.get('tokens_per_second'):.1f}, compare: {json.dumps({k: v for k, v in c.items() if k != 'token_ids'})[:300]}")
PY
  done
done
