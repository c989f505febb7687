"""Passes of 1, 4 and 8 rows of the default pair's int4 models after contexts of 128, 512 and
1,024 tokens (``specdec cost --context`` for one model and context; this one runs under any
version of the source, to compare two): medians of 9 interleaved rounds, in ms.

python bench/pass_context.py LABEL target|draft
(to compare two versions: PYTHONPATH=/path/to/other/src python bench/pass_context.py old target)
"""

from __future__ import annotations

import argparse

from specdec.loading import load_backend
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.tune import time_passes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("label")
    parser.add_argument("model", choices=["target", "draft"])
    args = parser.parse_args()
    name = DEFAULT_TARGET if args.model == "target" else DEFAULT_DRAFT
    backend = load_backend(name, "int4", None, None)
    for length in (128, 512, 1024):
        context = [1000 + (i * 7) % 5000 for i in range(length)]
        times = time_passes(backend, context, [1, 4, 8], repeats=9)
        cells = " ".join(f"{n} rows {1000 * seconds:.1f}" for n, seconds in times.items())
        print(f"{args.label} {args.model} after {length}: {cells}", flush=True)


if __name__ == "__main__":
    main()
