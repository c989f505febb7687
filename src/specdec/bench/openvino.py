"""OpenVINO GenAI as bench peers: Intel's CPU inference library, plain and with its own
prompt-lookup speculation, reading the target's GGUF file directly (the peers extra).

Measured here: OpenVINO GenAI 2026.4.1 loads the catalog's 1.5B Q4_K_M GGUF (about 8 s) but
refuses the 0.5B's (``gguf_tensor_to_f16 failed``), and a draft model must be an OpenVINO
directory made by ``optimum-cli export openvino``, whose requirements (optimum-intel, nncf)
would replace this project's pinned torch; so the draft-model configuration is not a system
here. Identity is judged against OpenVINO's own plain run (its numerics are not ours).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from specdec.config import SamplingParams

NUM_ASSISTANT_TOKENS = 5
MAX_NGRAM_SIZE = 3
SYSTEMS = {
    "openvino": "OpenVINO GenAI, target alone",
    "openvino-lookup": (
        f"OpenVINO GenAI prompt lookup ({NUM_ASSISTANT_TOKENS} tokens, n-grams up to "
        f"{MAX_NGRAM_SIZE})"
    ),
}


class OpenVinoSystem:
    """One ``LLMPipeline`` over the target's GGUF, made on the first run."""

    def __init__(self, name: str, gguf_file, prompt_lookup: bool):
        self.name, self.gguf_file, self.prompt_lookup = name, gguf_file, prompt_lookup
        self._pipeline: Any = None
        self.load_seconds: float | None = None

    @property
    def needs(self) -> set[tuple[str, str]]:
        return set()  # nothing from the pool: OpenVINO reads the GGUF itself

    def run(self, prompt_ids: list[int], params: SamplingParams):
        import numpy as np
        import openvino as ov

        from specdec.bench.systems import RunOutput

        pipeline = self._load()
        config = self._config(params)
        started = time.perf_counter()
        result = pipeline.generate(ov.Tensor(np.array([prompt_ids], dtype=np.int64)), config)
        seconds = time.perf_counter() - started
        return RunOutput([int(t) for t in result.tokens[0]], seconds, None)

    def _load(self):
        if self._pipeline is None:
            try:
                import openvino_genai
            except ImportError:
                raise ValueError(
                    f"system {self.name!r} needs OpenVINO GenAI: pip install -e '.[peers]'"
                ) from None
            path: Path = self.gguf_file("target")
            started = time.perf_counter()
            options = {"prompt_lookup": True} if self.prompt_lookup else {}
            self._pipeline = openvino_genai.LLMPipeline(str(path), "CPU", **options)
            self.load_seconds = time.perf_counter() - started
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
        return config
