#!/bin/bash
# $1 = learning rate, $2 = tag
cd /work/main
export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
date
specdec heads train --kind eagle --minutes 12 --restart --vocab-size 16384 --distill-every 4 --precision float32 --data /work/data --learning-rate $1 2>&1 | tail -3
E=$(ls -d ~/.cache/specdec/heads/*/)
cp -r $E/eagle /work/eagle-$2
date
specdec heads eval --kind eagle --max-k 4 --positions 400 --data /work/data 2>&1 | tail -25
date
