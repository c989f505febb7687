"""Turn a user's model argument into a backend: a local transformers model directory."""

from __future__ import annotations

from pathlib import Path

import torch

from specdec.backends.hf import HFModel

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_hf(path: str | Path, dtype: str = "float32") -> HFModel:
    """Load a saved transformers causal LM (+ its tokenizer, if saved beside it)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # ours, not one per weight file
    hf_logging.set_verbosity_error()

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    directory = Path(path).expanduser()
    if not (directory / "config.json").is_file():
        raise ValueError(
            f"{path!s} is not a transformers model directory (no config.json in it)"
        )
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=DTYPES[dtype])
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory)
    except (OSError, ValueError):
        tokenizer = None  # a model without a saved tokenizer still decodes ids
    return HFModel(model, tokenizer)
