"""In one process, interleaved: the draft model drafting through tokens the grammar forces
in the middle of its chain a pass each (as before) against reading them as guesses in the
pass before them (``ModelDrafter._guesses``: ``DraftMask.forced``), on the three JSON schemas
of ``bench/structured.py``, default pair on int4, greedy, 128 tokens, k auto; JSON as
llguidance compiles it by default and compact (``forced_ab.py``, whose harness this uses).

    python guesses_ab.py --passes 3 > guesses-ab.txt
"""

from __future__ import annotations

import sys
from pathlib import Path

import specdec.grammar as grammar

sys.path.insert(0, str(Path(__file__).resolve().parent))
from forced_ab import SETTING, run  # noqa: E402

_forced = grammar.DraftMask.forced


def forced(self, position):
    """As before this change: the draft guesses no forced tokens."""
    return [] if SETTING["old"] else _forced(self, position)


SYSTEMS = (  # name, drafter recipe, run the old way (forced tokens a draft pass each)
    ("plain constrained", "none", False),
    ("model, a pass each", "model", True),
    ("model, read as guesses", "model", False),
    ("lookup+model, a pass each", "lookup+model", True),
    ("lookup+model, read as guesses", "lookup+model", False),
)


def main() -> None:
    grammar.DraftMask.forced = forced
    run(SYSTEMS, draft=True)


if __name__ == "__main__":
    main()
