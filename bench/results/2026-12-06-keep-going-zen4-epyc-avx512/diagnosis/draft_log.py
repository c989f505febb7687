"""Run the specdec CLI with every draft model round logged: the k it was given, the
tokens it drafted, each ``keep_going`` answer and the drafts' confidences.

    python draft_log.py LOG bench --dtype int4 --workloads code --systems lookup+model-auto \
        --prompts-per-workload 3 --repeats 1 --max-tokens 64 --out OUT
"""

import json
import sys

import specdec.drafters.model as model
from specdec.cli import main

drafting = model.ModelDrafter.drafting


def logged(log):
    def drafting_and_log(self, context, k, sampler=None, keep_going=None, branch=None):
        answers = []

        def asked(confidences):
            answer = keep_going(confidences)
            answers.append((len(confidences), answer))
            return answer

        proposal = yield from drafting(
            self, context, k, sampler, asked if keep_going else None, branch
        )
        confidences = [round(x, 3) for x in (proposal.confidences or [])]
        line = {"k": k, "n": len(proposal.token_ids), "kg": answers, "conf": confidences}
        log.write(json.dumps(line) + "\n")
        return proposal

    return drafting_and_log


if __name__ == "__main__":
    with open(sys.argv[1], "w") as log:
        model.ModelDrafter.drafting = logged(log)
        sys.exit(main(sys.argv[2:]))
