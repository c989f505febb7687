"""The llama.cpp self-test: a crashing child is reported, not inherited; verdicts are cached."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

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
    from specdec.backends import runtime_choice

    timed = []

    def measure(runtime):
        timed.append(runtime)
        return {"int8": 20.0, "llamacpp:q4_0": 12.5, "bfloat16": 30.0}[runtime]

    choice, measured = runtime_choice.choose("d", ["int8", "llamacpp:q4_0"], tmp_path, measure)
    assert measured and choice.runtime == "llamacpp:q4_0" and timed == ["int8", "llamacpp:q4_0"]
    assert "llamacpp:q4_0 12.5 ms" in choice.reason
    again, measured = runtime_choice.choose("d", ["int8", "llamacpp:q4_0"], tmp_path, measure)
    assert again == choice and not measured and len(timed) == 2  # from the cache
    assert runtime_choice.cached_choices(tmp_path) == [choice]
    # Other candidates, another draft, or another machine/build: measured again.
    other, measured = runtime_choice.choose("d", ["bfloat16", "llamacpp:q4_0"], tmp_path, measure)
    assert measured and other.runtime == "llamacpp:q4_0"
    monkeypatch.setattr(
        runtime_choice, "machine_key", lambda model, role="draft": f"another CPU|{model}"
    )
    _, measured = runtime_choice.choose("d", ["int8", "llamacpp:q4_0"], tmp_path, measure)
    assert measured


def test_a_cpu_held_to_a_smaller_instruction_set_is_measured_as_another(monkeypatch):
    from specdec.backends import runtime_choice

    for name in runtime_choice.ISA_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    plain = runtime_choice.machine_key("d", "target")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    held = runtime_choice.machine_key("d", "target")
    monkeypatch.setenv("SPECDEC_INT4_PATH", "avx2")
    assert len({plain, held, runtime_choice.machine_key("d", "target")}) == 3
    assert "ONEDNN_MAX_CPU_ISA=AVX2" in held and held.endswith("|d|target")


def test_an_unreadable_runtime_choice_cache_is_measured_again(tmp_path):
    from specdec.backends import runtime_choice

    (tmp_path / runtime_choice.CACHE_FILE).write_text("{not json")
    choice, measured = runtime_choice.choose("d", ["int8"], tmp_path, lambda runtime: 5.0)
    assert measured and choice.runtime == "int8"


# ---- the measured target runtime (--target-runtime auto) -------------------------------


def test_the_target_is_chosen_by_its_verify_pass_and_cached(tmp_path, monkeypatch, capsys):
    from specdec import runtime as choosing
    from specdec.backends import runtime_choice
    from specdec.backends.quant import kernels
    from specdec.runtime import Runtime
    from specdec.runtime import choose_target_runtime as choose_target

    monkeypatch.setattr(kernels, "kernel", lambda: None)  # "it builds"
    monkeypatch.setattr(Runtime, "load", lambda self, spec, cache_dir, progress: self.name)
    # int8 and int4 are timed on stand-ins of the model (quant.stand_in)
    monkeypatch.setattr(choosing, "stand_in_backend", lambda spec, runtime, *rest: runtime)
    timed = []

    def pass_ms(loaded, tokens=1):
        timed.append((loaded, tokens))
        return {"int8": 52.0, "int4": 46.0}[loaded]

    monkeypatch.setattr(runtime_choice, "step_ms", pass_ms)
    target = tmp_path / "t"
    target.mkdir()
    assert choose_target("auto", str(target), str(tmp_path)) == "int4"
    assert timed == [("int8", 5), ("int4", 5)]  # a k = 4 verify pass on each
    err = capsys.readouterr().err
    assert "target runtime auto -> int4" in err and "5-token pass" in err and "int8 52.0" in err
    assert choose_target("auto", str(target), str(tmp_path)) == "int4" and len(timed) == 2
    assert capsys.readouterr().err == ""  # from the cache, silently
    # a draft's verdict for the same model is another entry
    (draft,) = [c for c in runtime_choice.cached_choices(tmp_path) if c.role == "target"]
    assert draft.runtime == "int4"
    # given choices are kept; --dtype given means no measuring
    assert choose_target("llamacpp:q4_k_m", str(target), str(tmp_path)) == "llamacpp:q4_k_m"
    assert choose_target("auto", str(target), str(tmp_path), dtype="float32") == "float32"
    # a target that is neither a catalog model nor a directory: loading it will say so
    assert choose_target("auto", str(tmp_path / "missing"), str(tmp_path)) == "int8"
    assert len(timed) == 2


def test_without_the_int4_kernel_auto_is_int8_with_a_line(tmp_path, monkeypatch, capsys):
    from specdec.backends.quant import kernels
    from specdec.runtime import choose_target_runtime as choose_target

    def unavailable():
        raise kernels.KernelUnavailable("the int4 kernel did not build (no compiler)")

    monkeypatch.setattr(kernels, "kernel", unavailable)
    monkeypatch.setattr(kernels, "kernel_ready", lambda: True)
    assert choose_target("auto", str(tmp_path), str(tmp_path)) == "int8"
    assert "not considering int4: the int4 kernel did not build" in capsys.readouterr().err


def test_a_pass_is_timed_at_one_position_and_the_cache_left_empty():
    from helpers import backend, tiny_llama
    from specdec.backends import runtime_choice

    model = backend(tiny_llama(seed=0))
    fresh = backend(tiny_llama(seed=0)).forward([1, 2, 3, 4])
    assert runtime_choice.step_ms(model, repeats=3, tokens=5) > 0
    # the cache was cut back to nothing: the model scores a new text as a fresh one does
    assert torch.equal(model.forward([1, 2, 3, 4]), fresh)


def test_the_first_compile_is_said_once(monkeypatch, capsys):
    from specdec import runtime as choosing
    from specdec.backends.quant import kernels

    monkeypatch.setattr(kernels, "kernel_ready", lambda: False)
    monkeypatch.setattr(kernels, "kernel", lambda: None)
    assert choosing.transformers_candidates(None) == ["int8", "int4"]
    assert choosing.transformers_candidates(None) == ["int8", "int4"]  # target, then draft
    assert choosing.transformers_candidates("bfloat16") == ["bfloat16"]
    assert capsys.readouterr().err.count("compiling specdec's int4 kernel") == 1


def test_the_kernel_lives_apart_from_the_model_cache(monkeypatch, tmp_path):
    from specdec.backends.quant import kernels

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "models"))
    monkeypatch.delenv("SPECDEC_KERNELS", raising=False)
    assert kernels.kernel_dir() == Path.home() / ".cache" / "specdec" / "kernels"
    monkeypatch.setenv("SPECDEC_KERNELS", str(tmp_path / "k"))
    assert kernels.kernel_dir() == tmp_path / "k"


def test_auto_times_stand_ins_and_makes_no_runtime_form(model_dir, tmp_path, capsys):
    """The loser's form is never made (for the default pair it was 3.3 GB of int8), nor the
    winner's until it is loaded."""
    from specdec.runtime import choose_target_runtime

    cache = tmp_path / "cache"
    chosen = choose_target_runtime("auto", str(model_dir), str(cache))
    assert chosen in ("int8", "int4")
    assert "target runtime auto" in capsys.readouterr().err
    assert not (cache / "int8").exists() and not (cache / "int4").exists()


def test_the_interpreter_is_known_by_its_real_path(monkeypatch, tmp_path):
    """`specdec` (its shebang names python3.11) and `python -m specdec` (python, a link to
    it) are one interpreter: one verdict, not two measurements."""
    import os
    import sys

    link = tmp_path / "python"
    os.symlink(os.path.realpath(sys.executable), link)
    real = probe.machine_key()
    monkeypatch.setattr(sys, "executable", str(link))
    assert probe.machine_key() == real
