"""In one process, interleaved: the k policy choosing the draft's k as if the grammar's
forced drafts at the start of a round were not in its pass (as before) against pricing their
rows (``AdaptiveK.choose_k(given)``, ``keep_going(..., given)``), on the three JSON schemas of
``bench/structured.py``, default pair on int4, greedy, 128 tokens, k auto; JSON as llguidance
compiles it by default and compact (the harness of
``../2026-12-07-forced-then-drafts-zen4-epyc-avx512/forced_ab.py``).

    python forced_k_ab.py --passes 3 > ab.txt
"""

from __future__ import annotations

import sys
from pathlib import Path

from specdec.controller import AdaptiveK

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "2026-12-07-forced-then-drafts-zen4-epyc-avx512"))
from forced_ab import SETTING, run  # noqa: E402

_choose_k, _keep_going, _rates = AdaptiveK.choose_k, AdaptiveK.keep_going, AdaptiveK.rates


def choose_k(self, given=0):
    """As before this change: the forced drafts' rows not priced."""
    return _choose_k(self, 0 if SETTING["old"] else given)


def keep_going(self, confidences, given=0):
    return _keep_going(self, confidences, 0 if SETTING["old"] else given)


def rates(self, given=0):
    return _rates(self, 0 if SETTING["old"] else given)


SYSTEMS = (  # name, drafter recipe, run the old way (k blind to the forced drafts)
    ("plain constrained", "none", False),
    ("model, k blind to forced", "model", True),
    ("model, k prices forced", "model", False),
    ("lookup+model, k blind to forced", "lookup+model", True),
    ("lookup+model, k prices forced", "lookup+model", False),
)


def main() -> None:
    AdaptiveK.choose_k, AdaptiveK.keep_going, AdaptiveK.rates = choose_k, keep_going, rates
    run(SYSTEMS, draft=True)


if __name__ == "__main__":
    main()
