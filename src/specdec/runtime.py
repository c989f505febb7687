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
from dataclasses import dataclass

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
    engine: str  # "transformers" or "llamacpp"
    precision: str  # a transformers dtype, or a GGUF type

    @property
    def name(self) -> str:
        return self.precision if self.engine == "transformers" else f"llamacpp:{self.precision}"

    def load(self, spec: str, cache_dir: str | None = None, progress=None):
        """``spec`` (a catalog name, a model directory or a .gguf file) as a backend."""
        from specdec.loading import load_backend

        if self.engine == "transformers":
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
    from specdec.backends.int4 import RowInt4Linear
    from specdec.backends.int8 import RowInt8Linear

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
