#!/bin/bash
# heads train with one 512-token chunk a step instead of two (train.train's batch_chunks),
# otherwise the float32 "4096 wide" run of docs/heads.md; then the held-out eval.
# DATA: a heads data directory (here: 65,024 tokens of code and chat replies, int4 target).
cd "$(git rev-parse --show-toplevel)"
DATA=${DATA:?set DATA to a heads data directory}
export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
date
python - heads train --kind eagle --minutes 12 --restart --vocab-size 16384 --distill-every 4 \
  --precision float32 --data "$DATA" <<'PY' 2>&1 | tail -3
import functools, sys
import specdec.heads.train as train
from specdec.cli import main
train.train = functools.partial(train.train, batch_chunks=1)
sys.exit(main(sys.argv[1:]))
PY
date
specdec heads eval --kind eagle --max-k 4 --positions 400 --data "$DATA" 2>&1 | tail -25
date
