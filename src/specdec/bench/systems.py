"""The systems a benchmark compares, each behind one small interface.

A system is ``NAME`` or ``NAME@RUNTIME``. RUNTIME is the target's runtime, optionally with
the draft's after a slash: a transformers precision (int8, bfloat16, float32) or a GGUF type
run by llama.cpp (q4_k_m, the catalog's own file; q8_0, q4_0, f16, bf16 made from it). A name
without one runs on the benchmark's ``--dtype``. Systems on the same runtime share the same
weights; caches start empty for every run, so no system gets a prefix for free.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from specdec.backends.base import Backend
from specdec.backends.hf import HFModel
from specdec.bench.onnxgenai import OWN_PLAIN as ONNX_OWN_PLAIN
from specdec.bench.onnxgenai import SYSTEMS as ONNX_SYSTEMS
from specdec.bench.onnxgenai import OnnxGenAISystem
from specdec.bench.openvino import OWN_PLAIN as OPENVINO_OWN_PLAIN
from specdec.bench.openvino import SYSTEMS as OPENVINO_SYSTEMS
from specdec.bench.openvino import OpenVinoSystem
from specdec.bench.output import RunOutput
from specdec.config import TREES, SamplingParams, SpecConfig
from specdec.controller import KPolicy
from specdec.drafters import Drafter
from specdec.drafters.recipe import (
    KINDS,
    DraftSources,
    build_drafter,
    describe_recipe,
    is_choice,
    is_recipe,
)
from specdec.engine import Engine
from specdec.models import GGUF_TYPES
from specdec.runtime import TRANSFORMERS_DTYPES, parse_runtime

if TYPE_CHECKING:
    from specdec.heads.load import Heads


@dataclass(frozen=True)
class RuntimePair:
    """Where the target and the draft run: a transformers dtype or a GGUF type each."""

    target: str
    draft: str

    @property
    def label(self) -> str:
        return self.target if self.draft == self.target else f"{self.target}/{self.draft}"

    @staticmethod
    def parse(text: str) -> RuntimePair:
        """``TARGET[/DRAFT]``, each a runtime value (``specdec.runtime``): int8, bfloat16,
        float32, llamacpp:TYPE, or the short form TYPE (a GGUF type)."""
        target, _, draft = text.partition("/")
        parts = [parse_runtime(part) for part in (target, draft or target)]
        return RuntimePair(*(part.precision for part in parts))


def is_transformers(runtime: str) -> bool:
    return runtime in TRANSFORMERS_DTYPES


class ModelPool:
    """Loads each (role, runtime) once and hands out backends with empty caches.

    ``load_hf(role, dtype, progress)`` returns a transformers module; ``load_gguf(role, type,
    progress)`` a ``LlamaCppModel`` (one per file, shared by every system on it).
    """

    def __init__(
        self,
        tokenizer,
        load_hf: Callable,
        load_gguf: Callable | None = None,
        gguf_file: Callable | None = None,
        openvino_dir: Callable | None = None,
        cache_dir: str | None = None,
        target_name: str = "target",
        onnx_dir: Callable | None = None,
    ):
        self.tokenizer = tokenizer
        self._onnx_dir = onnx_dir  # "target" | "pair" -> (converted ONNX directory, note)
        self._load_hf, self._load_gguf = load_hf, load_gguf
        self._gguf_file = gguf_file  # role -> the catalog's GGUF path, for peers that read it
        self._openvino_dir = openvino_dir  # role -> the exported OpenVINO IR directory
        self.progress = None  # set while loading, for the loaders' progress bars
        self._loaded: dict[tuple[str, str], object] = {}
        self._cache_dir, self._target_name = cache_dir, target_name
        self._heads: dict[tuple[str, int], Heads] = {}

    def heads_drafter(self, kind: str, target) -> Drafter:
        """A ``kind`` heads drafter over ``target`` (a backend of the pool's target), the
        heads loaded once per target runtime."""
        from specdec.heads.load import load_heads

        key = (kind, id(getattr(target, "model", target)))
        if key not in self._heads:
            self._heads[key] = load_heads(kind, target, self._cache_dir, self._target_name)
        return self._heads[key].drafter(target)

    def module(self, role: str, dtype: str):
        return self._get(role, dtype)

    def backend(self, role: str, runtime: str):
        """A backend of ``role`` ("target" or "draft") on ``runtime``, its cache empty."""
        if is_transformers(runtime):
            return HFModel(self._get(role, runtime), self.tokenizer)
        model = self._get(role, runtime)
        model.truncate(0)
        return model

    def gguf_file(self, role: str):
        if self._gguf_file is None:
            raise ValueError("this system reads the catalog's GGUF file: use catalog models")
        return self._gguf_file(role)

    def openvino_dir(self, role: str):
        if self._openvino_dir is None:
            raise ValueError("this system reads exported OpenVINO models: use catalog models")
        return self._openvino_dir(role)

    def onnx_dir(self, role: str):
        if self._onnx_dir is None:
            raise ValueError("this system converts catalog models to ONNX: use catalog models")
        return self._onnx_dir(role)

    def load(self, needs: set[tuple[str, str]]) -> None:
        for role, runtime in sorted(needs):
            self._get(role, runtime)

    def _get(self, role: str, runtime: str):
        key = (role, runtime)
        if key not in self._loaded:
            if is_transformers(runtime):
                self._loaded[key] = self._load_hf(role, runtime, self.progress)
            elif self._load_gguf is None:
                raise ValueError(
                    f"runtime {runtime!r} needs llama.cpp and the catalog's GGUF models"
                )
            else:
                self._loaded[key] = self._load_gguf(role, runtime, self.progress)
        return self._loaded[key]


class SpecdecSystem:
    """specdec's engine with a given drafter recipe and k; fresh caches per run, while an
    adaptive controller keeps what it learned across runs (as a server's engine would)."""

    def __init__(
        self,
        name: str,
        pool: ModelPool,
        runtime: RuntimePair,
        make_drafter: Callable[[Backend], Drafter | None],
        k: int | str,
        verification: str = "auto",
        tree: str = "off",
    ):
        self.name, self.pool, self.runtime, self.make_drafter = name, pool, runtime, make_drafter
        self.spec = SpecConfig(k=k, verification=verification, tree=tree)
        self.controller: KPolicy | None = None

    @property
    def needs(self) -> set[tuple[str, str]]:
        return {("target", self.runtime.target)} | (
            {("draft", self.runtime.draft)} if "model" in self.name.split("@")[0] else set()
        )

    def run(self, prompt_ids: list[int], params: SamplingParams) -> RunOutput:
        target = self.pool.backend("target", self.runtime.target)
        drafter = self.make_drafter(target)
        engine = Engine(target, drafter, self.controller)
        started = time.perf_counter()
        out = engine.generate(prompt_ids, params, self.spec if drafter else SpecConfig(k=0))
        seconds = time.perf_counter() - started
        self.controller = engine.controller
        return RunOutput(out.token_ids, seconds, out.stats.to_dict())


class HFGenerateSystem:
    """transformers' own ``generate()``: plain, assisted (draft model) or prompt lookup,
    with transformers' default schedules."""

    def __init__(self, name: str, pool: ModelPool, runtime: RuntimePair, **generate_kwargs):
        self.name, self.pool, self.runtime, self.generate_kwargs = (
            name,
            pool,
            runtime,
            generate_kwargs,
        )
        if not is_transformers(runtime.target) or not is_transformers(runtime.draft):
            raise ValueError(
                f"system {name!r}: transformers generate() needs a transformers runtime"
            )

    @property
    def needs(self) -> set[tuple[str, str]]:
        return {("target", self.runtime.target)} | (
            {("draft", self.runtime.draft)} if self.generate_kwargs.get("assistant") else set()
        )

    @torch.inference_mode()
    def run(self, prompt_ids: list[int], params: SamplingParams) -> RunOutput:
        kwargs = dict(self.generate_kwargs)
        if kwargs.pop("assistant", False):
            kwargs["assistant_model"] = self.pool.module("draft", self.runtime.draft)
        target = self.pool.module("target", self.runtime.target)
        input_ids = torch.tensor([prompt_ids])
        sampling = (
            {"do_sample": False}
            if params.greedy
            else {
                "do_sample": True,
                "temperature": params.temperature,
                "top_k": params.top_k or None,
                "top_p": params.top_p,
            }
        )
        if params.seed is not None and not params.greedy:
            torch.manual_seed(params.seed)  # transformers samples from the global RNG
        started = time.perf_counter()
        out = target.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=params.max_tokens,
            pad_token_id=self.pool.tokenizer.eos_token_id,
            **sampling,
            **kwargs,
        )
        seconds = time.perf_counter() - started
        return RunOutput(out[0, len(prompt_ids) :].tolist(), seconds, None, peer=True)


class LlamaCppSystem:
    """Plain decoding by llama-cpp-python's own ``generate`` loop and sampler: what a CPU
    user runs today. Shares the GGUF's loaded model with specdec systems on that runtime."""

    def __init__(self, name: str, pool: ModelPool, runtime: RuntimePair):
        if is_transformers(runtime.target):
            raise ValueError(f"system {name!r}: llama.cpp runs a GGUF type (e.g. NAME@q4_k_m)")
        self.name, self.pool, self.runtime = name, pool, runtime

    @property
    def needs(self) -> set[tuple[str, str]]:
        return {("target", self.runtime.target)}

    def run(self, prompt_ids: list[int], params: SamplingParams) -> RunOutput:
        model = self.pool.backend("target", self.runtime.target)  # its cache emptied
        return _llama_generate(model, self._llama(model, prompt_ids, params), prompt_ids, params)

    def _llama(self, model, prompt_ids: list[int], params: SamplingParams):
        return model.llama


class LlamaCppLookupSystem(LlamaCppSystem):
    """llama.cpp's own prompt-lookup speculation (llama-cpp-python's
    ``LlamaPromptLookupDecoding``, 10 tokens a round) in its own generate loop. It needs a
    Llama with logits for every position, so it loads its own context of the same GGUF."""

    NUM_PRED_TOKENS = 10
    N_CTX = 4096

    def __init__(self, name: str, pool: ModelPool, runtime: RuntimePair):
        super().__init__(name, pool, runtime)
        self._own: Any = None  # its own Llama, made on the first run

    def _llama(self, model, prompt_ids: list[int], params: SamplingParams):
        if len(prompt_ids) + params.max_tokens > self.N_CTX:
            raise ValueError(f"{self.name}: prompt + max_tokens over its {self.N_CTX} context")
        if self._own is None:
            from llama_cpp import Llama
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            self._own = Llama(
                model_path=model.llama.model_path,
                n_ctx=self.N_CTX,
                n_threads=os.cpu_count() or 1,
                n_threads_batch=os.cpu_count() or 1,
                draft_model=LlamaPromptLookupDecoding(num_pred_tokens=self.NUM_PRED_TOKENS),
                verbose=False,
            )
        return self._own


def _llama_generate(model, llama, prompt_ids: list[int], params: SamplingParams) -> RunOutput:
    """llama-cpp-python's own generate loop and sampler, timed; ``model`` gives the EOS ids
    and is left with an empty cache."""
    started = time.perf_counter()
    token_ids: list[int] = []
    for token in llama.generate(
        prompt_ids,
        temp=params.temperature or 0.0,
        reset=True,
        top_k=params.top_k or 0,
        top_p=params.top_p,
        min_p=0.0,
        repeat_penalty=1.0,
    ):
        token_ids.append(int(token))
        if int(token) in model.eos_token_ids or len(token_ids) >= params.max_tokens:
            break
    seconds = time.perf_counter() - started
    model.truncate(0)  # generate moved llama.cpp's state under the backend: start clean
    return RunOutput(token_ids, seconds, None, peer=True)


LLAMACPP_LOOPS = {
    "llamacpp": "",
    "llamacpp-lookup": " with its prompt-lookup speculation (10 tokens)",
}
PEERS: dict[str, tuple[str, dict[str, Any]]] = {
    "hf-generate": ("transformers generate(), target alone", {}),
    "hf-assisted": ("transformers assisted generation, same draft", {"assistant": True}),
    "hf-lookup": (
        "transformers prompt lookup (prompt_lookup_num_tokens=10)",
        {"prompt_lookup_num_tokens": 10},
    ),
}


def systems_help() -> str:
    """What ``--systems`` takes, from the registries the names are made from (so that the
    help names every system ``make_system`` knows and no other)."""
    peers = [
        *(f"{name}: llama.cpp's own loop{what}" for name, what in LLAMACPP_LOOPS.items()),
        *(f"{name}: {what}" for name, (what, _) in PEERS.items()),
        *(f"{name}: {what}" for name, what in OPENVINO_SYSTEMS.items()),
        *(f"{name}: {what}" for name, what in ONNX_SYSTEMS.items()),
    ]
    return (
        f"comma-separated; plain: specdec without drafts; {'; '.join(peers)}; and "
        f"DRAFTER-kN or DRAFTER-auto with DRAFTER a recipe as for --drafter: one of "
        f"{', '.join(KINDS)}, a '+'-joined fallback chain (lookup+model) or a '/'-joined "
        "choice (model/eagle, k auto only); a recipe with the draft model then :tree-full, "
        ":tree-auto or :tree-deep verifies draft trees (--tree). OpenVINO and ONNX systems "
        "need the peers extra (openvino-int4*: the pair exported by bench/openvino_export.sh; "
        "onnx-*: converted once by its model builder); eagle and medusa need heads (specdec "
        "heads make). Each "
        f"may end in @RUNTIME: a transformers runtime ({', '.join(TRANSFORMERS_DTYPES)}) or a "
        f"llama.cpp GGUF type ({', '.join(GGUF_TYPES)}), optionally TARGET/DRAFT, e.g. "
        "model-auto@int8/q4_0"
    )


DEFAULT_SYSTEMS = (
    "plain",
    "model-k4",
    "model-auto",
    "lookup-k4",
    "lookup+model-auto",
    "hf-generate",
    "hf-assisted",
    "hf-lookup",
)


def split_name(name: str, default_runtime: str) -> tuple[str, RuntimePair]:
    base, _, runtime = name.partition("@")
    if (base in LLAMACPP_LOOPS or base in OPENVINO_SYSTEMS) and not runtime:
        runtime = "q4_k_m"
    return base, RuntimePair.parse(runtime or default_runtime)


def describe(name: str, default_runtime: str = "int8") -> str:
    base, runtime = split_name(name, default_runtime)
    where = f" [{runtime.label}]"
    if base == "plain":
        return "specdec, target alone" + where
    if base in OPENVINO_SYSTEMS:
        return OPENVINO_SYSTEMS[base]
    if base in ONNX_SYSTEMS:
        return ONNX_SYSTEMS[base]
    if base in LLAMACPP_LOOPS:
        return (
            f"llama.cpp's own generate loop{LLAMACPP_LOOPS[base]}, the target's GGUF "
            f"({runtime.target}), {os.cpu_count()} threads"
        )
    if base in PEERS:
        return PEERS[base][0] + where
    base, tree = split_tree(base)
    drafter, _, k = base.rpartition("-")
    return (
        f"specdec, {describe_recipe(drafter)}, "
        + ("adaptive k" if k == "auto" else f"k={k[1:]}")
        + ("" if tree == "off" else f", draft tree {tree}")
        + where
    )


def split_tree(base: str) -> tuple[str, str]:
    """``DRAFTER-K:tree-MODE`` -> (``DRAFTER-K``, MODE); ``DRAFTER-K`` -> (it, "off")."""
    head, _, tree = base.partition(":tree-")
    return head, tree or "off"


def make_system(
    name: str,
    pool: ModelPool,
    ngram=None,
    default_runtime: str = "int8",
    verification: str = "auto",
):
    """``plain``, ``llamacpp``, a transformers peer, or ``DRAFTER-kN`` / ``DRAFTER-auto`` for
    a drafter recipe (``lookup+model``, ``model/eagle``); each optionally ``@RUNTIME``.
    ``verification``: how specdec systems verify sampled drafts (``SpecConfig.verification``)."""
    base, runtime = split_name(name, default_runtime)
    if base == "plain":
        return SpecdecSystem(name, pool, runtime, lambda target: None, 0)
    if base == "llamacpp":
        return LlamaCppSystem(name, pool, runtime)
    if base == "llamacpp-lookup":
        return LlamaCppLookupSystem(name, pool, runtime)
    if base in OPENVINO_SYSTEMS:
        model_file = pool.openvino_dir if "int4" in base else pool.gguf_file
        return OpenVinoSystem(name, model_file)
    if base in ONNX_SYSTEMS:
        return OnnxGenAISystem(name, pool.onnx_dir)
    if base in PEERS:
        return HFGenerateSystem(name, pool, runtime, **PEERS[base][1])
    base, tree = split_tree(base)
    drafter, _, k_text = base.rpartition("-")
    recipe = drafter != "none" and is_recipe(drafter)  # none is plain
    if recipe and is_choice(drafter) and k_text != "auto":
        raise ValueError(f"system {name!r}: a choice of drafters needs k auto ({drafter}-auto)")
    if not recipe or not (k_text == "auto" or (k_text[:1] == "k" and k_text[1:].isdigit())):
        raise ValueError(
            f"unknown system {name!r}; use plain, {', '.join(LLAMACPP_LOOPS)}, "
            f"{', '.join(OPENVINO_SYSTEMS)}, {', '.join(ONNX_SYSTEMS)}, "
            f"{', '.join(PEERS)}, or DRAFTER-kN / "
            f"DRAFTER-auto with DRAFTER a recipe as for --drafter: {', '.join(KINDS)}, a "
            "'+'-joined fallback chain (lookup+model) or a '/'-joined choice (model/eagle, k "
            "auto only), then :tree-full, :tree-auto or :tree-deep for draft trees (model only); "
            "each may end in @RUNTIME"
        )
    if tree != "off" and (is_choice(drafter) or "model" not in drafter.split("+")):
        raise ValueError(
            f"system {name!r}: draft trees grow from the draft model, alone or in a chain "
            "(model-k3:tree-full, lookup+model-auto:tree-auto)"
        )
    if tree not in TREES:
        raise ValueError(f"system {name!r}: :tree-{tree}? use :tree-full, :tree-auto or :tree-deep")
    if "ngram" in drafter and ngram is None:
        raise ValueError(
            f"system {name!r} needs --ngram-model (make one with 'specdec ngram build')"
        )
    k = "auto" if k_text == "auto" else int(k_text[1:])

    def make_drafter(target) -> Drafter | None:
        sources = DraftSources(
            draft_model=lambda: pool.backend("draft", runtime.draft),
            heads={
                kind: functools.partial(pool.heads_drafter, kind, target)
                for kind in ("medusa", "eagle")
            },
            ngram_model=(lambda: ngram) if ngram is not None else None,
        )
        return build_drafter(drafter, sources)

    return SpecdecSystem(name, pool, runtime, make_drafter, k, verification, tree)


def reference_of(name: str, names: list[str], default_runtime: str) -> str:
    """The plain system of the same target runtime, when the run has one; else ``plain``.
    Token identity is judged against it: different runtimes round differently. llama.cpp's
    own speculation is judged against llama.cpp's own plain loop, when the run has it."""
    base, runtime_of_name = split_name(name, default_runtime)
    own_plain = {"llamacpp-lookup": "llamacpp", **OPENVINO_OWN_PLAIN, **ONNX_OWN_PLAIN}.get(base)
    for other in names if own_plain else []:
        other_base, other_runtime = split_name(other, default_runtime)
        if other_base == own_plain and other_runtime == runtime_of_name:
            return other
    target = runtime_of_name.target
    for other in names:
        base, runtime = split_name(other, default_runtime)
        if base == "plain" and runtime.target == target:
            return other
    return "plain"
