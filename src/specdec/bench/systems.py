"""The systems a benchmark compares, each behind one small interface.

Every system decodes the same prompt ids with the same target weights and runtime; only the
decoding method differs. Caches start empty for every run, so no system gets a prefix for free.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from specdec.backends.hf import HFModel
from specdec.config import SamplingParams, SpecConfig
from specdec.controller import AdaptiveK
from specdec.drafters import FallbackDrafter, ModelDrafter, PromptLookupDrafter
from specdec.engine import Engine


@dataclass(frozen=True)
class RunOutput:
    token_ids: list[int]
    seconds: float
    stats: dict | None  # SpecStats.to_dict() for specdec systems, None for peers


@dataclass
class Models:
    """The loaded pair: raw transformers modules, shared by every system."""

    target: torch.nn.Module
    draft: torch.nn.Module
    tokenizer: object


class SpecdecSystem:
    """specdec's engine with a given drafter recipe and k; fresh caches per run, while an
    adaptive controller keeps what it learned across runs (as a server's engine would)."""

    def __init__(self, name: str, models: Models, drafters: Callable[[], list], k: int | str):
        self.name, self.models, self.drafters, self.spec = name, models, drafters, SpecConfig(k=k)
        self.controller: AdaptiveK | None = None

    def run(self, prompt_ids: list[int], params: SamplingParams) -> RunOutput:
        drafters = self.drafters()
        drafter = None if not drafters else drafters[0] if len(drafters) == 1 else FallbackDrafter(drafters)
        engine = Engine(HFModel(self.models.target, self.models.tokenizer), drafter)
        engine.controller = self.controller
        started = time.perf_counter()
        out = engine.generate(prompt_ids, params, self.spec if drafter else SpecConfig(k=0))
        seconds = time.perf_counter() - started
        self.controller = engine.controller
        return RunOutput(out.token_ids, seconds, out.stats.to_dict())


class HFGenerateSystem:
    """transformers' own ``generate()``: plain, assisted (draft model) or prompt lookup,
    with transformers' default schedules."""

    def __init__(self, name: str, models: Models, **generate_kwargs):
        self.name, self.models, self.generate_kwargs = name, models, generate_kwargs

    @torch.inference_mode()
    def run(self, prompt_ids: list[int], params: SamplingParams) -> RunOutput:
        kwargs = dict(self.generate_kwargs)
        if kwargs.pop("assistant", False):
            kwargs["assistant_model"] = self.models.draft
        input_ids = torch.tensor([prompt_ids])
        sampling = {"do_sample": False} if params.greedy else {
            "do_sample": True, "temperature": params.temperature,
            "top_k": params.top_k or None, "top_p": params.top_p,
        }
        if params.seed is not None and not params.greedy:
            torch.manual_seed(params.seed)  # transformers samples from the global RNG
        started = time.perf_counter()
        out = self.models.target.generate(
            input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
            max_new_tokens=params.max_tokens, pad_token_id=self.models.tokenizer.eos_token_id,
            **sampling, **kwargs,
        )
        seconds = time.perf_counter() - started
        return RunOutput(out[0, len(prompt_ids):].tolist(), seconds, None)


class LlamaCppSystem:
    """Plain llama.cpp decoding of the target's GGUF (the optional llama-cpp-python)."""

    def __init__(self, name: str, gguf_path: str, threads: int = 2):
        from llama_cpp import Llama

        self.name = name
        self.llama = Llama(model_path=gguf_path, n_ctx=2048, n_threads=threads, verbose=False)

    def run(self, prompt_ids: list[int], params: SamplingParams) -> RunOutput:
        self.llama.reset()
        started = time.perf_counter()
        token_ids = []
        for token in self.llama.generate(prompt_ids, temp=params.temperature or 0.0,
                                         top_k=params.top_k or 1_000_000, top_p=params.top_p):
            if token in (self.llama.token_eos(),):
                token_ids.append(int(token))
                break
            token_ids.append(int(token))
            if len(token_ids) >= params.max_tokens:
                break
        return RunOutput(token_ids, time.perf_counter() - started, None)


def draft_model(models: Models) -> ModelDrafter:
    return ModelDrafter(HFModel(models.draft))


# name -> (description, factory). "plain" is the baseline for every ratio.
SYSTEMS: dict[str, tuple[str, Callable[[Models], object]]] = {
    "plain": ("specdec, target alone (the baseline)",
              lambda m: SpecdecSystem("plain", m, lambda: [], 0)),
    "model-k4": ("specdec, draft model, k=4",
                 lambda m: SpecdecSystem("model-k4", m, lambda: [draft_model(m)], 4)),
    "model-auto": ("specdec, draft model, adaptive k",
                   lambda m: SpecdecSystem("model-auto", m, lambda: [draft_model(m)], "auto")),
    "lookup-k4": ("specdec, prompt lookup, k=4",
                  lambda m: SpecdecSystem("lookup-k4", m, lambda: [PromptLookupDrafter()], 4)),
    "lookup+model-auto": ("specdec, prompt lookup else draft model, adaptive k",
                          lambda m: SpecdecSystem("lookup+model-auto", m,
                                                  lambda: [PromptLookupDrafter(), draft_model(m)], "auto")),
    "hf-generate": ("transformers generate(), target alone",
                    lambda m: HFGenerateSystem("hf-generate", m)),
    "hf-assisted": ("transformers assisted generation, same draft",
                    lambda m: HFGenerateSystem("hf-assisted", m, assistant=True)),
    "hf-lookup": ("transformers prompt lookup (prompt_lookup_num_tokens=10)",
                  lambda m: HFGenerateSystem("hf-lookup", m, prompt_lookup_num_tokens=10)),
}
