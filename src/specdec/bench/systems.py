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
from specdec.drafters import FallbackDrafter, ModelDrafter, NGramDrafter, PromptLookupDrafter
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


PEERS = {
    "hf-generate": ("transformers generate(), target alone", {}),
    "hf-assisted": ("transformers assisted generation, same draft", {"assistant": True}),
    "hf-lookup": ("transformers prompt lookup (prompt_lookup_num_tokens=10)", {"prompt_lookup_num_tokens": 10}),
}
DRAFTER_NAMES = {"model": "draft model", "lookup": "prompt lookup", "ngram": "n-gram model",
                 "lookup+model": "prompt lookup else draft model", "lookup+ngram": "prompt lookup else n-gram model"}
DEFAULT_SYSTEMS = ("plain", "model-k4", "model-auto", "lookup-k4", "lookup+model-auto",
                   "hf-generate", "hf-assisted", "hf-lookup")


def describe(name: str) -> str:
    if name == "plain":
        return "specdec, target alone (the baseline)"
    if name in PEERS:
        return PEERS[name][0]
    drafter, _, k = name.rpartition("-")
    return f"specdec, {DRAFTER_NAMES[drafter]}, " + ("adaptive k" if k == "auto" else f"k={k[1:]}")


def make_system(name: str, models: Models, ngram=None):
    """``plain``, a peer, or ``DRAFTER-kN`` / ``DRAFTER-auto`` for a drafter of DRAFTER_NAMES."""
    if name == "plain":
        return SpecdecSystem(name, models, lambda: [], 0)
    if name in PEERS:
        return HFGenerateSystem(name, models, **PEERS[name][1])
    drafter, _, k_text = name.rpartition("-")
    if drafter not in DRAFTER_NAMES or not (k_text == "auto" or (k_text[:1] == "k" and k_text[1:].isdigit())):
        raise ValueError(f"unknown system {name!r}; use plain, {', '.join(PEERS)}, or DRAFTER-kN / "
                         f"DRAFTER-auto with DRAFTER one of {', '.join(DRAFTER_NAMES)}")
    if "ngram" in drafter and ngram is None:
        raise ValueError(f"system {name!r} needs --ngram-model (make one with 'specdec ngram build')")
    k = "auto" if k_text == "auto" else int(k_text[1:])

    def drafters():
        made = {"model": lambda: draft_model(models), "lookup": PromptLookupDrafter,
                "ngram": lambda: NGramDrafter(ngram)}
        return [made[part]() for part in drafter.split("+")]

    return SpecdecSystem(name, models, drafters, k)
