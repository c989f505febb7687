"""One chunk of ``specdec heads data``: the default target over 512 tokens in prefill, timed.

python bench/heads_data_chunk.py [--dtype int4,int8] [--int4-path best|avx512|avx2|scalar]
    [--chunks 5] [--length 512]

Loads the default target on each runtime of ``--dtype`` (cached runtime forms, as ``heads
data`` does), keeps its features, and runs it over the first ``--chunks`` chunks of the
default corpus (the Python standard library, in ``heads data``'s order): the time of each
chunk and their median, with the minutes ``heads data`` would need for the 426 chunks of
the measured recipe (docs/notes/heads.md).

``--int4-path avx2`` pins the int4 kernel to its AVX2 code (bit-identical output); with
torch's kernels held to AVX2 too, before Python starts, it estimates a CPU without AVX-512
(same clocks and caches, narrower vectors):
ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
    python bench/heads_data_chunk.py --dtype int4 --int4-path avx2
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time

import torch
from heads_train_step import machine  # bench/heads_train_step.py, beside this script

from specdec.backends.quant.int4 import RowInt4Linear
from specdec.backends.quant.kernels import PATH_BY_NAME
from specdec.heads import data
from specdec.loading import load_backend
from specdec.models import DEFAULT_TARGET

INT4_PATHS = {"best": -1, **PATH_BY_NAME}
RECIPE_CHUNKS = 426  # the code data of the measured 90-minute recipe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="int4,int8", help="comma-separated (int4,int8)")
    parser.add_argument("--int4-path", default="best", choices=list(INT4_PATHS))
    parser.add_argument("--chunks", type=int, default=5, help="chunks timed per runtime (5)")
    parser.add_argument("--length", type=int, default=512)
    args = parser.parse_args()

    files = data.corpus_files([data.default_corpus()], [".py"])
    rows = []
    for dtype in args.dtype.split(","):
        target = load_backend(DEFAULT_TARGET, dtype)
        pinned = 0
        for module in target.model.modules():
            if isinstance(module, RowInt4Linear) and args.int4_path != "best":
                module.path = INT4_PATHS[args.int4_path]
                pinned += 1
        target.keep_hidden_states()
        seconds = []
        for chunk in itertools.islice(
            data.chunks(files, target.tokenizer, args.length), args.chunks
        ):
            target.truncate(0)
            started = time.perf_counter()
            target.forward(chunk, last_only=True)
            target.hidden_states().to(torch.float16)
            seconds.append(time.perf_counter() - started)
        median = statistics.median(seconds)
        rows.append(
            {
                "dtype": dtype,
                "int4_layers_pinned": pinned,
                "chunk_s": round(median, 2),
                "all_s": [round(s, 2) for s in seconds],
                "recipe_minutes": round(RECIPE_CHUNKS * median / 60, 1),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    summary = {
        **machine(),
        "int4_path": args.int4_path,
        "chunk": f"{args.length} tokens of the standard library",
        "rows": rows,
    }
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
