"""Run the specdec CLI with every k controller's rounds logged, one JSON line a round.

    python controller_log.py LOG bench --dtype int4 --workloads code,edit,summary,chat \
        --systems lookup+model-auto --prompts-per-workload 3 --repeats 2 --max-tokens 64 --out OUT

A line: the controller (``id``), the round's drafts ``k``, ``acc`` accepted, the draft's
confidences, the pass's ms and rows, the draft step, the pass-cost table (ms by rows) and
its history lengths, per-position acceptance, and the k ``choose_k`` would pick next.
"""

import json
import sys

import specdec.controller as controller
from specdec.cli import main

observe = controller.AdaptiveK.observe


def logged(log):
    def observe_and_log(self, round_):
        observe(self, round_)
        rates = self.rates()
        confidences = round_.confidences
        line = {
            "id": id(self) % 1000,
            "conf": None if confidences is None else [round(x, 3) for x in confidences],
            "k": round_.k,
            "acc": round_.num_accepted,
            "rows": round_.rows,
            "pass": round(round_.pass_seconds * 1000, 1),
            "draft": round(round_.draft_seconds * 1000, 1),
            "caught": round_.caught_up,
            "step": round((self.draft_step_seconds or 0) * 1000, 2),
            "table": {n: round(s * 1000, 1) for n, s in sorted(self.pass_seconds.items())},
            "hist": {n: len(h) for n, h in sorted(self.pass_history.items())},
            "pos": [round(x, 2) for x in self.position_rates()],
            "best": None if rates is None else max(range(len(rates)), key=rates.__getitem__),
        }
        log.write(json.dumps(line) + "\n")

    return observe_and_log


if __name__ == "__main__":
    with open(sys.argv[1], "w") as log:
        controller.AdaptiveK.observe = logged(log)
        sys.exit(main(sys.argv[2:]))
