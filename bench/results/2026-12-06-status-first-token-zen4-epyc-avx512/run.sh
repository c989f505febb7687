#!/bin/sh
# The status command alternated: the source before the change (OLD) and after (NEW), each
# from its own tree (git archive COMMIT src | tar x -C DIR). sh run.sh OLD_SRC NEW_SRC
set -e
for run in ${RUNS:-1 2}; do
  for side in old new; do
    if [ $side = old ]; then src=$1; else src=$2; fi
    PYTHONPATH=$src python -c "import sys; from specdec.cli import main; sys.exit(main())" \
      bench --dtype int4 --systems plain,model-auto,lookup+model-auto \
      --prompts-per-workload 3 --repeats 2 --max-tokens 64 --out run$run-$side \
      > run$run-$side.log 2>&1
  done
done
