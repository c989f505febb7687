#!/bin/bash
# ./run.sh TAG SETTINGS...: 12 minutes of EAGLE training in float32 under the AVX2 limits
# with heads train's SETTINGS, a copy of the head as eagle-TAG, then the held-out eval.
# DATA: a heads data directory (here: 65,024 tokens of code and chat replies, int4 target);
# COPIES: where each trained head is copied before the next run overwrites the cache.
cd "$(git rev-parse --show-toplevel)"
DATA=${DATA:?set DATA to a heads data directory}
COPIES=${COPIES:-$HOME/heads-runs}
TAG=${1:?a tag for the copy}
shift
mkdir -p "$COPIES"
export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
date
specdec heads train --kind eagle --minutes 12 --restart --precision float32 --data "$DATA" "$@" 2>&1 | tail -3
E=$(ls -d ~/.cache/specdec/heads/*/)
cp -r $E/eagle "$COPIES"/eagle-$TAG
date
specdec heads eval --kind eagle --max-k 4 --positions 400 --data "$DATA" 2>&1 | python -c "import json,sys; t=sys.stdin.read(); d=json.loads(t[t.index('{'):]); print(d['acceptance_by_position'], d['c_per_draft'], d['trials_by_position'], {s:v['acceptance_by_position'] for s,v in d['by_source'].items()})"
date
