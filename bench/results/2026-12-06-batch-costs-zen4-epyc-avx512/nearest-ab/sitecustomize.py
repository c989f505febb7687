"""Logs every batched step of `specdec serve` (on PYTHONPATH, with STEPLOG=FILE): its
requests, tokens drafted (accepted or not), tokens emitted, milliseconds. One JSON line each.

    STEPLOG=steps.jsonl PYTHONPATH=<this folder>:src python bench/load.py ..."""

import atexit
import json
import os
import time

if os.environ.get("STEPLOG"):
    import specdec.server.scheduler as scheduler

    _step_together = scheduler.step_together
    _log = open(os.environ["STEPLOG"], "a")  # noqa: SIM115 (open for the process's life)
    atexit.register(_log.close)

    def step_together(runs, forward_many, max_rows=None, policy=None):
        began = time.perf_counter()
        chunks = _step_together(runs, forward_many, max_rows, policy)
        ms = (time.perf_counter() - began) * 1e3
        drafted = sum(
            getattr(c, "num_from_draft", 0) + len(getattr(c, "rejected_ids", None) or [])
            for c in chunks
        )
        tokens = sum(len(getattr(c, "token_ids", [])) for c in chunks)
        step = {"t": round(began, 4), "n": len(runs), "drafted": drafted, "tokens": tokens}
        _log.write(json.dumps({**step, "ms": round(ms, 1)}) + "\n")
        _log.flush()
        return chunks

    scheduler.step_together = step_together
