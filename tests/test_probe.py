"""The llama.cpp self-test: a crashing child is reported, not inherited; verdicts are cached."""

from __future__ import annotations

import sys

from specdec.backends import probe

CRASH = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGILL)"]
FAIL = [sys.executable, "-c", "import sys; sys.exit('cannot load the model')"]
PASS = [sys.executable, "-c", "print('ok')"]


def test_a_crash_by_sigill_is_reported_in_one_line(tmp_path):
    result = probe.run_probe(tmp_path / "x.gguf", CRASH)
    assert not result.ok and "SIGILL" in result.reason and "\n" not in result.reason


def test_a_failure_says_what_the_child_said(tmp_path):
    result = probe.run_probe(tmp_path / "x.gguf", FAIL)
    assert not result.ok and "cannot load the model" in result.reason


def test_the_verdict_is_cached_per_machine(tmp_path, monkeypatch):
    cache = tmp_path / "probe.json"
    first = probe.llamacpp_works(tmp_path / "x.gguf", cache, CRASH)
    # Cached: a passing command is not even run for this machine's key.
    assert probe.llamacpp_works(tmp_path / "x.gguf", cache, PASS) == first
    monkeypatch.setattr(probe, "machine_key", lambda: "another machine or build")
    assert probe.llamacpp_works(tmp_path / "x.gguf", cache, PASS).ok
