"""One name for where a model runs, the same in every command, the bench and the server.

A runtime value is a transformers precision, ``int8`` or ``int4`` (specdec's
batch-invariant runtimes), ``bfloat16`` or ``float32``, or llama.cpp with a GGUF type,
``llamacpp:q4_0`` (``llamacpp`` alone: the command's default type). The bench's short form,
a bare GGUF type (``q4_0``), means the same as ``llamacpp:q4_0``. The older spellings stay
accepted where they were: ``--dtype D`` and ``--runtime transformers`` mean the transformers
runtime ``D``, ``--runtime llamacpp --gguf-type T`` means ``llamacpp:T``.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from specdec.backends.base import Backend
from specdec.models import GGUF_TYPES

TRANSFORMERS_DTYPES = ("int8", "int4", "bfloat16", "float32")
# The runtimes whose block pass scores every row bit for bit as one-token steps do (the
# kernels are batch-invariant; ``specdec doctor`` checks it on this machine): there a
# greedy or seeded request gives plain decoding's text whatever k, k=auto's choices and the
# drafter. On the others (transformers' float kernels, llama.cpp) a block pass can round
# differently from steps: the output still follows the target's distribution, but where two
# tokens nearly tie it can differ from plain decoding's (bfloat16 more often than float32).
SAME_TEXT_AS_PLAIN = ("int8", "int4")
HELP = (
    "int8, int4 (specdec's runtimes: a verify pass equals its steps bit for bit), bfloat16, "
    "float32 (transformers), or llamacpp:TYPE "
    f"with TYPE one of {', '.join(GGUF_TYPES)} (llama.cpp; needs the llamacpp extra)"
)


@dataclass(frozen=True)
class Runtime:
    library: str  # "transformers" or "llamacpp"
    precision: str  # a transformers dtype, or a GGUF type

    @property
    def name(self) -> str:
        return self.precision if self.library == "transformers" else f"llamacpp:{self.precision}"

    def load(self, spec: str, cache_dir: str | None = None, progress=None, draft: bool = False):
        """``spec`` (a catalog name, a model directory or a .gguf file) as a backend;
        ``draft``: as a draft model (on int4, 128 inputs a weight scale: ``DRAFT_GROUP``)."""
        from specdec.loading import load_backend

        if self.library == "transformers":
            if draft and self.precision == "int4":
                from specdec.backends.quant.int4 import DRAFT_GROUP

                return load_backend(spec, "int4", cache_dir, progress, int4_group=DRAFT_GROUP)
            return load_backend(spec, self.precision, cache_dir, progress)
        return load_backend(
            spec,
            cache_dir=cache_dir,
            progress=progress,
            runtime="llamacpp",
            gguf_type=self.precision,
        )


def runtime_of(backend) -> str:
    """The runtime a loaded backend runs on: int4, int8, a transformers dtype, or llamacpp."""
    from specdec.backends.hf import HFModel

    return model_runtime(backend.model) if isinstance(backend, HFModel) else "llamacpp"


def model_runtime(model) -> str:
    """The runtime a transformers model is on, by its output layer: int4, int8, or its dtype."""
    from specdec.backends.quant.int4 import RowInt4Linear
    from specdec.backends.quant.int8 import RowInt8Linear

    head = model.get_output_embeddings()
    if isinstance(head, RowInt4Linear):
        return "int4"
    if isinstance(head, RowInt8Linear):
        return "int8"
    return str(next(model.parameters()).dtype).removeprefix("torch.")


def parse_runtime(text: str, dtype: str = "int8", gguf_type: str = "q4_k_m") -> Runtime:
    """A runtime value (see the module docstring). ``dtype`` and ``gguf_type`` fill in the
    older spellings ``transformers`` and ``llamacpp``. Unknown values raise ValueError."""
    value = text.strip().lower()
    if value == "transformers":
        value = dtype
    if value in TRANSFORMERS_DTYPES:
        return Runtime("transformers", value)
    engine, _, precision = value.partition(":")
    if engine == "llamacpp":
        precision = precision or gguf_type
    elif not precision and value in GGUF_TYPES:
        precision = value  # the bench's short form
    else:
        precision = ""
    if precision not in GGUF_TYPES:
        raise ValueError(f"unknown runtime {text!r}: use {HELP}")
    return Runtime("llamacpp", precision)


def runtime_value(text: str) -> str:
    """argparse type of a runtime flag: a runtime value, or ``auto``."""
    if text != "auto":
        try:
            parse_runtime(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
    return text


# ---- choosing a runtime: -k auto's counterpart for where models run --------------------


def transformers_candidates(dtype: str | None) -> list[str]:
    """The transformers runtimes ``auto`` chooses among: ``dtype`` when the user gave one,
    else int8 and, where its kernel builds, int4 (both bit-exact block == steps)."""
    if dtype is not None:
        return [dtype]
    return ["int8", "int4"] if _int4_builds() else ["int8"]


@functools.cache
def _int4_builds() -> bool:
    """Whether the int4 kernel builds here (compiled now if it is not yet: said in a line);
    a failure is said once."""
    from specdec.backends.quant import kernels

    if not kernels.kernel_ready():
        sys.stderr.write("specdec: compiling specdec's int4 kernel (once, about half a minute)\n")
    try:
        kernels.kernel()
    except kernels.KernelUnavailable as error:
        sys.stderr.write(f"specdec: not considering int4: {error}\n")
        return False
    return True


def choose_target_runtime(
    choice: str, target: str, cache_dir: str | None = None, progress=None, dtype=None
) -> str:
    """``auto``: ``dtype`` when given, else whichever of int8 and int4 scores a 5-token pass
    faster on this machine, measured once per machine, build and target
    (``backends.runtime_choice``). Other choices are returned as they are."""
    if choice != "auto":
        return choice
    from specdec.backends import runtime_choice
    from specdec.models import CATALOG, cache_root

    if target not in CATALOG and not os.path.isdir(os.path.expanduser(target)):
        return dtype or "int8"  # nothing to measure: loading it says what is wrong
    candidates = transformers_candidates(dtype)
    if len(candidates) == 1:
        return candidates[0]

    def measure(runtime: str) -> float:
        loaded = stand_in_backend(target, runtime, cache_dir, progress)
        return runtime_choice.step_ms(loaded, tokens=runtime_choice.TARGET_PASS)

    chosen, measured = runtime_choice.choose(
        target, candidates, cache_root(cache_dir), measure, role="target"
    )
    if measured:
        sys.stderr.write(f"specdec: target runtime auto -> {chosen.runtime} ({chosen.reason})\n")
    return chosen.runtime


def stand_in_backend(spec: str, runtime: str, cache_dir: str | None = None, progress=None):
    """``spec``'s architecture on int8 or int4 with made-up weights (``quant.stand_in``): a
    pass costs what the real model's does, and no runtime form is made for a runtime that
    may not be chosen."""
    from specdec.backends.hf import HFModel
    from specdec.backends.quant.stand_in import stand_in
    from specdec.loading import model_config

    return HFModel(stand_in(model_config(spec, cache_dir, progress), runtime))


SAME_RUNTIME_MARGIN = 1.05  # a draft step this close to the fastest keeps the target's runtime


def choose_draft_runtime(
    choice: str,
    draft: str,
    cache_dir: str | None = None,
    progress=None,
    dtype: str | None = None,
    target_runtime: str | None = None,
    batched: bool = False,
) -> str:
    """``auto``: the runtime the draft steps fastest on here among ``dtype`` (when given, else
    int8 and int4) and, for a catalog draft with llama-cpp-python installed and passing its
    self-test on this machine (``backends.probe``), llama.cpp Q4_0; measured once per machine
    and build (``backends.runtime_choice``), with one line saying why when llama.cpp failed.
    The target's own runtime is kept when its step is within ``SAME_RUNTIME_MARGIN`` of the
    fastest: then draft and target share one thread pool (measured on the AVX-512 EPYC: an
    int4 draft at 12.4 ms a step beat a llama.cpp one at 12.0 ms on all four workloads, 23 vs
    24 ms a token on code, 32 vs 34 on chat). ``batched`` (the server): llama.cpp is not a
    candidate, for its passes cannot join the other requests' in one batched pass. Other
    choices are returned as they are."""
    if choice != "auto":
        return choice
    import importlib.util

    from specdec.backends import runtime_choice
    from specdec.models import CATALOG, cache_root, ensure_gguf, gguf_path, lookup, remove_gguf

    candidates = transformers_candidates(dtype)
    root = cache_root(cache_dir)
    if not batched and importlib.util.find_spec("llama_cpp") is not None and draft in CATALOG:
        from specdec.backends.probe import REBUILD, llamacpp_works

        def gguf() -> Path:  # only when the self-test has not run on this machine yet
            return ensure_gguf(lookup(draft), root, *([progress] if progress else []))

        result = llamacpp_works(gguf, root / "llamacpp-probe.json")
        if result.ok:
            candidates.append("llamacpp:q4_0")
        else:
            sys.stderr.write(
                f"specdec: not drafting on llama.cpp: {result.reason}; drafting on "
                f"{' or '.join(candidates)} instead. A build that runs everywhere: {REBUILD}\n"
            )
    if len(candidates) == 1:
        return candidates[0]

    made: list[str] = []  # llama.cpp files made only to be timed

    def measure(runtime: str) -> float:
        if runtime in ("int8", "int4"):
            return runtime_choice.step_ms(stand_in_backend(draft, runtime, cache_dir, progress))
        llamacpp = parse_runtime(runtime)
        if not gguf_path(lookup(draft), root, llamacpp.precision).is_file():
            made.append(llamacpp.precision)
        return runtime_choice.step_ms(llamacpp.load(draft, cache_dir, progress))

    chosen, measured = runtime_choice.choose(draft, candidates, root, measure)
    runtime, steps = chosen.runtime, chosen.step_ms
    why = chosen.reason
    if target_runtime in steps and steps[target_runtime] <= SAME_RUNTIME_MARGIN * steps[runtime]:
        if target_runtime != runtime:
            margin = round(100 * (SAME_RUNTIME_MARGIN - 1))
            why += f"; the target's own {target_runtime} is within {margin}% of the fastest"
        runtime = target_runtime
    for gguf_type in made:  # the losers' files: the verdict is cached, the files not needed
        if runtime != f"llamacpp:{gguf_type}":
            remove_gguf(lookup(draft), root, gguf_type)
    if measured:
        sys.stderr.write(f"specdec: draft runtime auto -> {runtime} ({why})\n")
    return runtime


def draft_vocabulary(draft: str, vocabulary: str | None, runtime: str) -> str | None:
    """The vocabulary file a draft on ``runtime`` scores (None: all its tokens). ``vocabulary``
    is a file, ``full`` (or None) for none, or ``auto``: the file shipped for a catalog draft's
    family (``vocab.SHIPPED``) where the draft runs on int8 or int4, whose output layer is a
    fifth of the step there and the trimmed draft measured faster end to end
    (bench/results/2026-12-04-draft-vocab-default-epyc-avx512); none elsewhere."""
    from specdec import vocab
    from specdec.models import CATALOG

    if vocabulary in (None, vocab.FULL):
        return None
    if vocabulary != vocab.AUTO:
        return vocabulary
    entry = CATALOG.get(draft)
    if entry is None or runtime not in SAME_TEXT_AS_PLAIN:
        return None
    return vocab.shipped(entry.tokenizer_family)


def score_draft_vocabulary(backend: Backend, draft: str, vocabulary: str | None, runtime: str):
    """Restrict ``backend`` (the model ``draft`` loaded on ``runtime``) to the tokens
    ``draft_vocabulary`` picks, if it picks a file."""
    from specdec.backends.trim import trim_to_vocabulary_file

    chosen = draft_vocabulary(draft, vocabulary, runtime)
    if chosen:
        trim_to_vocabulary_file(backend, chosen)


def load_draft(
    draft: str,
    choice: str = "auto",
    cache_dir: str | None = None,
    progress=None,
    dtype: str | None = None,
    target_runtime: str | None = None,
    vocabulary: str | None = "auto",
    batched: bool = False,
    gguf_type: str = "q4_0",
) -> tuple[Backend, Runtime]:
    """The draft model as a backend, and the runtime it runs on: ``choice``, or for ``auto``
    the one ``choose_draft_runtime`` measures fastest. ``vocabulary`` is what
    ``draft_vocabulary`` takes. A trimmed vocabulary file (``specdec vocab build``) is a
    feature of the transformers runtimes: given one, with auto the draft runs on the target's
    runtime when that is int8 or int4 (one thread pool), else on --dtype's. The one rule for
    generate, serve, the bench and heads eval."""
    from specdec import vocab

    given = vocabulary not in (None, vocab.AUTO, vocab.FULL)
    if given and choice == "auto":
        chosen = target_runtime if target_runtime in ("int8", "int4") else "transformers"
    else:
        chosen = choose_draft_runtime(
            choice, draft, cache_dir, progress, dtype, target_runtime, batched
        )
    runtime = parse_runtime(chosen, dtype or "int8", gguf_type)
    backend = runtime.load(draft, cache_dir, progress, draft=True)
    score_draft_vocabulary(backend, draft, vocabulary, runtime.name)
    return backend, runtime
