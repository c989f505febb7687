"""OpenVINO GenAI as a bench peer, on the catalog's 1.5B GGUF (slow; the peers extra)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("openvino_genai", reason="OpenVINO GenAI (the peers extra) is not installed")
pytestmark = pytest.mark.slow


def test_openvino_plain_and_prompt_lookup_decode_the_same_tokens(tmp_path):
    from specdec.cli import main
    from specdec.models import CATALOG, DEFAULT_TARGET, cache_root, status

    found = status(CATALOG[DEFAULT_TARGET], cache_root())
    if not (found.installed or found.gguf_cached):
        pytest.skip(f"{DEFAULT_TARGET}'s weight packages are not installed")
    out = tmp_path / "bench"
    args = ["bench", "--systems", "openvino,openvino-lookup", "--workloads", "edit"]
    args += ["--prompts-per-workload", "1", "--max-tokens", "16", "--repeats", "1"]
    assert main([*args, "--out", str(out)]) == 0
    rows = json.loads((out / "results.json").read_text())["summary"]
    lookup = next(row for row in rows if row["system"] == "openvino-lookup")
    assert lookup["reference"] == "openvino" and lookup["identical"] == 1.0
    plain = next(row for row in rows if row["system"] == "openvino")
    assert plain["tokens_per_second"] > 0


def test_openvino_with_the_draft_model_decodes_what_it_decodes_alone(tmp_path):
    """The exported INT4 pair (bench/openvino_export.sh): OpenVINO's speculative decoding
    with the 0.5B draft gives its own plain output."""
    from specdec.cli import main
    from specdec.models import cache_root

    exported = cache_root() / "openvino"
    if not (exported / "qwen2.5-coder-0.5b-instruct-int4" / "openvino_model.xml").is_file():
        pytest.skip("the pair is not exported (run bench/openvino_export.sh)")
    out = tmp_path / "bench"
    args = ["bench", "--systems", "openvino-int4,openvino-int4-model", "--workloads", "code"]
    args += ["--prompts-per-workload", "1", "--max-tokens", "16", "--repeats", "1"]
    assert main([*args, "--out", str(out)]) == 0
    rows = json.loads((out / "results.json").read_text())["summary"]
    speculative = next(row for row in rows if row["system"] == "openvino-int4-model")
    assert speculative["reference"] == "openvino-int4" and speculative["identical"] == 1.0


CHECK_SIGNALS = """
import faulthandler, os, signal, time
faulthandler.enable()  # as pytest does: the thread then has an alternate signal stack
import numpy as np, openvino as ov
from openvino import opset13 as ops
from specdec.bench.openvino import signal_stack_kept
def compiled():  # with a Core of its own, as each LLMPipeline has
    x = ops.parameter([1, 4], np.float32)
    with signal_stack_kept():
        core = ov.Core()
        return core, core.compile_model(ov.Model([ops.relu(x)], [x]), "CPU")
models = [compiled(), compiled()]
del models[0]  # freed in the order they were made
del models[0]
def stop(signum, frame):
    raise KeyboardInterrupt
signal.signal(signal.SIGTERM, stop)
try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
except KeyboardInterrupt:
    print("interrupted")
"""


def test_a_signal_after_openvino_models_are_freed_is_an_interrupt_not_a_crash():
    # OpenVINO's CPU plugin left the main thread on a freed signal stack, so a SIGTERM
    # after a bench of two OpenVINO systems was a segfault (it took the test suite down).
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", CHECK_SIGNALS], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "interrupted", done
