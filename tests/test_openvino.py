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
