"""The corpus of the shipped draft vocabulary (``src/specdec/data/qwen2.5.vocab.json``): code
and English prose that this Python installation already holds, none of it the bench's prompts.

python bench/draft_vocab_corpus.py > corpus.txt
specdec vocab build $(cat corpus.txt) -o src/specdec/data/qwen2.5.vocab.json --size 32768

Prints one path a line: the standard library's top-level ``*.py`` files in name order while
they total at most 4 MB, then the installed distributions' ``*.dist-info/METADATA`` files
(their long descriptions) in path order while they total at most 4 MB. The recipe measured in
bench/results/2026-12-04-trimmed-vocab-again-epyc-avx512 ("mixed"): on the int4 pair it kept
the draft's acceptance and made it faster end to end on all four workloads, where a
code-only vocabulary lost on edits.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

LIMIT = 4 * 1024 * 1024


def first_files(paths: list[Path], limit: int = LIMIT) -> list[Path]:
    """``paths`` in order while their sizes total at most ``limit`` bytes."""
    chosen, total = [], 0
    for path in paths:
        total += path.stat().st_size
        if total > limit:
            break
        chosen.append(path)
    return chosen


def main() -> None:
    paths = sysconfig.get_paths()
    code = first_files(sorted(Path(paths["stdlib"]).glob("*.py")))
    prose = first_files(sorted(Path(paths["purelib"]).glob("*.dist-info/METADATA")))
    for path in code + prose:
        print(path)


if __name__ == "__main__":
    main()
