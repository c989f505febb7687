"""Does llama.cpp run on this machine? A self-test in a child process, cached per machine.

Why: llama-cpp-python compiles llama.cpp at install time, for the CPU it was built on and with
whatever the compiler made of it. Built natively on an AMX Xeon with Debian 12's GCC 12, the
AMX code dies with SIGILL on the first batch of two or more tokens (a prefill, a verify
pass), killing the whole process. ``--draft-runtime auto`` must not pick a runtime that does
that, so before choosing llama.cpp it runs a child process that loads a GGUF and decodes a
4-token batch and a 1-token step. The verdict is cached under the model cache, keyed by the
CPU, the llama-cpp-python version and the Python executable: one probe per machine and build.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PROBE = """
import sys
from llama_cpp import Llama
llama = Llama(model_path=sys.argv[1], n_ctx=64, n_batch=32, logits_all=True, verbose=False)
llama.eval([1, 2, 3, 4])
llama.eval([5])
print("ok")
"""
TIMEOUT_SECONDS = 180
REBUILD = (
    "CMAKE_ARGS='-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON "
    "-DGGML_BMI2=ON' pip install --force-reinstall --no-cache-dir llama-cpp-python==0.3.36"
)


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    reason: str  # what happened, in one line


def machine_key() -> str:
    """The CPU, the llama-cpp-python build and the interpreter: what the verdict depends on."""
    import importlib.metadata

    from specdec.machine import cpu_flags, cpu_name

    try:
        version = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        version = "absent"
    # the interpreter by its real path: the `specdec` script's shebang and `python` name the
    # same one by different links (and measured everything twice)
    interpreter = os.path.realpath(sys.executable)
    text = f"{cpu_name()}|{','.join(cpu_flags())}|{version}|{interpreter}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_probe(gguf: Path, command: list[str] | None = None) -> ProbeResult:
    """Run the self-test (``command`` replaces the child's command line, for tests)."""
    argv = command or [sys.executable, "-c", PROBE, str(gguf)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        return ProbeResult(False, f"llama.cpp's self-test did not finish in {TIMEOUT_SECONDS} s")
    if done.returncode == 0 and "ok" in done.stdout:
        return ProbeResult(True, "a 4-token batch and a 1-token step decoded")
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        why = " (an instruction this CPU does not have)" if name == "SIGILL" else ""
        return ProbeResult(False, f"llama.cpp crashed with {name}{why} on a 4-token batch")
    last = (done.stderr.strip().splitlines() or ["no message"])[-1]
    return ProbeResult(False, f"llama.cpp's self-test failed (exit {done.returncode}): {last}")


def llamacpp_works(
    gguf: Path | Callable[[], Path], cache_file: Path, command: list[str] | None = None
) -> ProbeResult:
    """The cached verdict for this machine, probing once when there is none (on ``gguf``, or
    on the file it makes when a callable: a cached verdict needs no model file)."""
    key = machine_key()
    try:
        cached = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        cached = {}
    if key in cached:
        return ProbeResult(**cached[key])
    result = run_probe(gguf if isinstance(gguf, Path) else gguf(), command)
    cached[key] = {"ok": result.ok, "reason": result.reason}
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    temporary = cache_file.with_suffix(".tmp")
    temporary.write_text(json.dumps(cached, indent=1))
    temporary.replace(cache_file)
    return result
