#!/bin/bash
# heads data --chat on int8 for 4 minutes: torch forms (mock) then row kernels, then again
cd "$(git rev-parse --show-toplevel)"
OUT=${OUT:-$(mktemp -d)}
for round in 1 2; do
for form in forms rows; do
  rm -rf "$OUT"/cd-$form; date
  if [ $form = forms ]; then
    python - heads data --chat --dtype int8 --minutes 4 --reply-tokens 192 --data "$OUT"/cd-$form <<'PY' 2>&1 | grep -v "loading\|data (" | tail -2
import sys
from unittest import mock
from specdec.backends import int4
from specdec.cli import main
with mock.patch.object(int4, "kernel_or_none", return_value=None):
    sys.exit(main(sys.argv[1:]))
PY
  else
    specdec heads data --chat --dtype int8 --minutes 4 --reply-tokens 192 --data "$OUT"/cd-$form 2>&1 | grep -v "loading\|data (" | tail -2
  fi
  python -c "
import json
lines = [json.loads(l) for l in open('"$OUT"/cd-$form/builtin-replies.jsonl') if l.strip()]
print('$form round $round: replies', len(lines), 'tokens', sum(len(l['token_ids']) for l in lines))"
done
done
