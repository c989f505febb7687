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


# ---- the measured draft runtime (--draft-runtime auto) ---------------------------------


def test_the_fastest_measured_draft_runtime_is_chosen_and_cached(tmp_path, monkeypatch):
    from specdec.backends import draft_choice

    timed = []

    def measure(runtime):
        timed.append(runtime)
        return {"int8": 20.0, "llamacpp:q4_0": 12.5, "bfloat16": 30.0}[runtime]

    choice, measured = draft_choice.choose("d", ["int8", "llamacpp:q4_0"], tmp_path, measure)
    assert measured and choice.runtime == "llamacpp:q4_0" and timed == ["int8", "llamacpp:q4_0"]
    assert "llamacpp:q4_0 12.5 ms" in choice.reason
    again, measured = draft_choice.choose("d", ["int8", "llamacpp:q4_0"], tmp_path, measure)
    assert again == choice and not measured and len(timed) == 2  # from the cache
    assert draft_choice.cached_choices(tmp_path) == [choice]
    # Other candidates, another draft, or another machine/build: measured again.
    other, measured = draft_choice.choose("d", ["bfloat16", "llamacpp:q4_0"], tmp_path, measure)
    assert measured and other.runtime == "llamacpp:q4_0"
    monkeypatch.setattr(draft_choice, "machine_key", lambda draft: f"another CPU|{draft}")
    _, measured = draft_choice.choose("d", ["int8", "llamacpp:q4_0"], tmp_path, measure)
    assert measured


def test_an_unreadable_draft_choice_cache_is_measured_again(tmp_path):
    from specdec.backends import draft_choice

    (tmp_path / draft_choice.CACHE_FILE).write_text("{not json")
    choice, measured = draft_choice.choose("d", ["int8"], tmp_path, lambda runtime: 5.0)
    assert measured and choice.runtime == "int8"
