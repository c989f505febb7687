#!/bin/bash
# generate_old_new.sh OLD_SRC NEW_SRC: two source trees' src/ folders in turn (as run: this
# repository at a6a0329, before BatchedModel.PASS_ROWS, unpacked with git archive, and the
# tree after it), three times: the 1,412-token chat prompt beside this script
# (long_prompt.txt), 32 tokens, the default pair and drafter, --compare (speculative and
# plain), --json; per run the prefill, the whole request and the comparison.
set -euo pipefail
OLD_SRC=$1 NEW_SRC=$2
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=$(mktemp -d)
P="$(cat "$HERE/long_prompt.txt")"
for rep in 1 2 3; do
  for tree in old new; do
    if [ $tree = old ]; then SRC=$OLD_SRC; else SRC=$NEW_SRC; fi
    PYTHONPATH=$SRC python -c "import sys; from specdec.cli import main; sys.argv=['specdec']+sys.argv[1:]; sys.exit(main())" \
      generate "$P" --chat --max-tokens 32 --compare --json 2>/dev/null > "$OUT/${tree}_${rep}.json"
    python - "$OUT/${tree}_${rep}.json" "$tree" "$rep" <<'PY'
import json, sys
path, tree, rep = sys.argv[1:]
d = json.load(open(path))
s, c = d["stats"], d.get("compare", {})
print(f"{tree} run {rep}: prefill {s.get('prefill_seconds', float('nan')):.2f} s, total {s.get('total_seconds', s.get('seconds', float('nan')))}, tok/s {s.get('tokens_per_second'):.1f}, compare: {json.dumps({k: v for k, v in c.items() if k != 'token_ids'})[:300]}")
PY
  done
done
