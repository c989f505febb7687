"""OpenVINO GenAI as bench peers: Intel's CPU inference library (the peers extra).

- ``openvino``, ``openvino-lookup``: the target's Q4_K_M GGUF read directly, plain and with
  OpenVINO's own prompt-lookup speculation.
- ``openvino-int4``, ``openvino-int4-model``: the pair exported once to OpenVINO IR with INT4
  weights (``bench/openvino_export.sh``: optimum-intel in a separate venv, since it would
  replace this project's pinned torch), plain and with the 0.5B as OpenVINO's draft model.
  A draft must be an OpenVINO directory: OpenVINO GenAI 2026.4.1 refuses the 0.5B GGUF here
  (``gguf_tensor_to_f16 failed``).
Identity is judged against the same OpenVINO form's plain run (its numerics are not ours).
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from specdec.config import SamplingParams

NUM_ASSISTANT_TOKENS = 5
MAX_NGRAM_SIZE = 3
DRAFT_TOKENS = 4  # num_assistant_tokens with the draft model, as measured by hand before
SYSTEMS = {
    "openvino": "OpenVINO GenAI, target alone, the target's GGUF (q4_k_m)",
    "openvino-lookup": (
        f"OpenVINO GenAI prompt lookup ({NUM_ASSISTANT_TOKENS} tokens, n-grams up to "
        f"{MAX_NGRAM_SIZE}), the target's GGUF (q4_k_m)"
    ),
    "openvino-int4": "OpenVINO GenAI, target alone, INT4 OpenVINO IR",
    "openvino-int4-model": (
        f"OpenVINO GenAI with the 0.5B draft ({DRAFT_TOKENS} tokens a round), INT4 OpenVINO IR"
    ),
}
OWN_PLAIN = {"openvino-lookup": "openvino", "openvino-int4-model": "openvino-int4"}


class OpenVinoSystem:
    """One ``LLMPipeline``, made on the first run. ``model_file(role)`` gives the GGUF file
    (GGUF systems) or the exported directory (INT4 systems) of "target" or "draft"."""

    def __init__(self, name: str, model_file):
        self.name, self.model_file = name, model_file
        self.prompt_lookup = name == "openvino-lookup"
        self.with_draft = name == "openvino-int4-model"
        self._pipeline: Any = None
        self.setup_note = ""

    @property
    def needs(self) -> set[tuple[str, str]]:
        return set()  # nothing from the pool: OpenVINO reads the GGUF itself

    def run(self, prompt_ids: list[int], params: SamplingParams):
        import numpy as np
        import openvino as ov

        from specdec.bench.output import RunOutput

        pipeline = self._load()
        config = self._config(params)
        started = time.perf_counter()
        result = pipeline.generate(ov.Tensor(np.array([prompt_ids], dtype=np.int64)), config)
        seconds = time.perf_counter() - started
        return RunOutput([int(t) for t in result.tokens[0]], seconds, None, peer=True)

    def _load(self):
        if self._pipeline is None:
            try:
                import openvino_genai
            except ImportError:
                raise ValueError(
                    f"system {self.name!r} needs OpenVINO GenAI: pip install -e '.[peers]'"
                ) from None
            path: Path = self.model_file("target")
            started = time.perf_counter()
            options: dict[str, Any] = {"prompt_lookup": True} if self.prompt_lookup else {}
            with signal_stack_kept():
                if self.with_draft:
                    draft = str(self.model_file("draft"))
                    options["draft_model"] = openvino_genai.draft_model(draft, "CPU")
                self._pipeline = openvino_genai.LLMPipeline(str(path), "CPU", **options)
            self.setup_note = f"loaded in {time.perf_counter() - started:.1f} s"
        return self._pipeline

    def _config(self, params: SamplingParams):
        import openvino_genai

        config = openvino_genai.GenerationConfig()
        config.max_new_tokens = params.max_tokens
        config.do_sample = not params.greedy
        if not params.greedy:
            config.temperature = params.temperature
            config.top_k = params.top_k or 0
            config.top_p = params.top_p
            if params.seed is not None:
                config.rng_seed = params.seed
        if self.prompt_lookup:
            config.num_assistant_tokens = NUM_ASSISTANT_TOKENS
            config.max_ngram_size = MAX_NGRAM_SIZE
        if self.with_draft:
            config.num_assistant_tokens = DRAFT_TOKENS
        return config


def exported_dir(cache_root: Path, name: str) -> Path:
    """Where ``bench/openvino_export.sh`` puts a catalog model's INT4 OpenVINO IR."""
    path = cache_root / "openvino" / f"{name}-int4"
    if not (path / "openvino_model.xml").is_file():
        raise ValueError(f"{path} is missing: export the pair once with bench/openvino_export.sh")
    return path


class _SignalStack(ctypes.Structure):  # Linux's stack_t
    _fields_ = [
        ("ss_sp", ctypes.c_void_p),
        ("ss_flags", ctypes.c_int),
        ("ss_size", ctypes.c_size_t),
    ]


@contextlib.contextmanager
def signal_stack_kept() -> Iterator[None]:
    """Give the calling thread back its own alternate signal stack after OpenVINO makes a model.

    OpenVINO's CPU plugin (2026.4.1) gives the thread that compiles a model an alternate
    signal stack of its own and, when the model is freed, puts back the one it found. Two
    models freed in the order they were made (a bench's ``openvino`` then
    ``openvino-lookup``) leave the thread on the first model's freed stack, and the next
    signal Python handles there (Ctrl-C, SIGTERM) is a segfault instead of an interrupt.
    Keeping the thread's own stack in place makes every model find, and put back, that one.
    (Generation leaves the stack as it is: only making a model needs this.)"""
    if sys.platform != "linux":
        yield
        return
    libc = ctypes.CDLL(None, use_errno=True)
    own = _SignalStack()
    libc.sigaltstack(None, ctypes.byref(own))
    try:
        yield
    finally:
        libc.sigaltstack(ctypes.byref(own), None)
