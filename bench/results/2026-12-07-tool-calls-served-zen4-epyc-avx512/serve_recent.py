"""`specdec serve --port PORT` with BatchedModel.RECENT set to KEEP (an experiment)."""

import sys

import specdec.backends.batched as batched

batched.BatchedModel.RECENT = int(sys.argv[1])
from specdec.cli import main  # noqa: E402

sys.exit(main(["serve", "--port", sys.argv[2]]))
