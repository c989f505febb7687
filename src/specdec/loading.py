"""Turn a user's model argument into a backend: a catalog name or a local directory."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import xxhash

from specdec.backends.hf import HFModel
from specdec.models import (
    CATALOG,
    Progress,
    cache_root,
    ensure_converted,
    ensure_gguf,
    ensure_model_files,
    form_directory,
    group_suffix,
    lookup,
    no_progress,
    remove_gguf,
)

# int8 / int4: float32 weights loaded, then quantized by backends.quant (int8:
# batch-invariant W8A8; int4: 4-bit weights, int8 activations); both cached on disk.
DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "int8": torch.float32,
    "int4": torch.float32,
}
QUANTIZED = ("int8", "int4")


RUNTIMES = ("transformers", "llamacpp")


def load_backend(
    spec: str,
    dtype: str = "int8",
    cache_dir: str | None = None,
    progress: Progress | None = None,
    runtime: str = "transformers",
    gguf_type: str = "q4_k_m",
    int4_group: int = 32,
):
    """``spec`` is a catalog name (built and cached on first use) or a model directory
    (a .gguf file for llama.cpp). ``dtype`` applies to transformers; llama.cpp runs a
    catalog model as ``gguf_type`` (made once from the catalog's Q4_K_M file) and a .gguf
    file as it is. ``int4_group``: inputs per weight scale on int4 (32; a draft's 128,
    ``backends.quant.int4.DRAFT_GROUP``, in a runtime form of its own)."""
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
    if runtime == "llamacpp":
        return _load_llamacpp(spec, cache_dir, progress, gguf_type)
    quantized = dtype in QUANTIZED
    if quantized and spec in CATALOG:
        entry, root = lookup(spec), cache_root(cache_dir)
        return _load_catalog_quantized(entry, dtype, root, progress, int4_group)
    directory = model_directory(spec, cache_dir, progress, verify=not quantized)

    def check_source() -> None:  # the float32 weights are read to quantize: check them first
        model_directory(spec, cache_dir, progress, verify=True)

    return load_hf(
        directory,
        dtype,
        progress,
        cache_root(cache_dir) / "int8",
        check_source=check_source,
        int4_group=int4_group,
    )


def _load_catalog_quantized(
    entry, dtype: str, root: Path, progress: Progress | None, int4_group: int = 32
) -> HFModel:
    """A catalog model on int8 or int4, its runtime form made straight from the GGUF when it
    is not cached yet (``backends.quant.from_gguf``: no float32 copy is made). An int4
    form of another ``int4_group`` than 32 (a draft's) is a form of its own."""

    from specdec.backends.quant import store
    from specdec.backends.quant.from_gguf import build_form

    report = progress or no_progress
    files = ensure_model_files(entry, root, report)
    group = int4_group if dtype == "int4" else 32
    built = []

    def build():
        built.append(dtype)
        return build_form(ensure_gguf(entry, root, report), files, dtype, progress, group)

    directory = form_directory(entry, root, dtype, group)
    model = store.load_or_build(files, directory, progress, dtype, build=build)
    if built:  # the form and the small files are all this runtime reads from now on
        remove_gguf(entry, root)
    return HFModel(model, tokenizer_of(files))


# One parsed tokenizer per tokenizer.json and tokenizer_config.json (by content): a pair's
# draft, whose files are the target's very bytes, reuses the target's instead of parsing
# them again (about a second of a cached start on these CPUs). A chat template of its own
# (the 0.5B's differs from the 1.5B's by two braces) goes on a shallow copy.
_TOKENIZERS: dict[str, Any] = {}


def tokenizer_of(files: Path) -> Any:
    """The transformers tokenizer saved in ``files``, its parsed vocabulary shared with any
    model whose tokenizer files hold the same bytes."""
    from transformers import AutoTokenizer

    digest = xxhash.xxh3_128()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        path = files / name
        digest.update(name.encode() + (path.read_bytes() if path.exists() else b""))
    key = digest.hexdigest()
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = AutoTokenizer.from_pretrained(files)
        return _TOKENIZERS[key]
    template = files / "chat_template.jinja"
    own = template.read_text() if template.exists() else None
    tokenizer = _TOKENIZERS[key]
    if own is not None and own != tokenizer.chat_template:
        tokenizer = copy.copy(tokenizer)
        tokenizer.chat_template = own
    return tokenizer


def model_directory(
    spec: str, cache_dir: str | None = None, progress: Progress | None = None, verify: bool = False
) -> Path:
    """The float32 transformers directory of ``spec``: a catalog name's (converted once;
    ``verify``: its weights checked against their digests, converted again if damaged) or
    ``spec`` itself, a directory."""
    if spec in CATALOG:
        entry, root = lookup(spec), cache_root(cache_dir)
        if progress is None:
            return ensure_converted(entry, root, verify=verify)
        return ensure_converted(entry, root, progress, verify)
    directory = Path(spec).expanduser()
    if not directory.is_dir():
        raise ValueError(
            f"{spec!r} is neither a catalog model ({', '.join(CATALOG)}) nor a directory"
        )
    return directory


def load_hf(
    path: str | Path,
    dtype: str = "float32",
    progress: Progress | None = None,
    int8_cache: Path | None = None,
    check_source: Callable[[], object] | None = None,
    int4_group: int = 32,
) -> HFModel:
    """Load a saved transformers causal LM (+ its tokenizer, if saved beside it).

    ``int8`` / ``int4``: from the runtime form cached under ``int8_cache`` (int4 beside it,
    in ``<int8_cache>/../int4``) when there is one for this model (built and written on
    first use), else quantized in memory. ``check_source``: called before the float32
    weights are read to build a runtime form. ``int4_group``: as ``load_backend``'s."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # ours, not one per weight file
    hf_logging.set_verbosity_error()
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    directory = Path(path).expanduser()
    if not (directory / "config.json").is_file():
        raise ValueError(f"{path!s} is not a transformers model directory (no config.json in it)")
    model: PreTrainedModel
    if dtype not in QUANTIZED:
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=DTYPES[dtype])
    elif int8_cache is None:
        from specdec.backends.quant.store import quantizer

        model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
        quantizer(dtype, int4_group)(model, progress)
    else:
        from specdec.backends.quant import store as runtime_cache

        root = int8_cache if dtype == "int8" else int8_cache.with_name(dtype)
        name = _cache_name(directory) + (group_suffix(int4_group) if dtype == "int4" else "")
        model = runtime_cache.load_or_build(
            directory, root / name, progress, dtype, check_source, int4_group=int4_group
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory)
    except (OSError, ValueError):
        tokenizer = None  # a model without a saved tokenizer still decodes ids
    return HFModel(model, tokenizer)


def _cache_name(directory: Path) -> str:
    """One runtime-cache entry per model directory: its name and a hash of its path."""
    digest = hashlib.sha1(str(directory.resolve()).encode()).hexdigest()[:12]
    return f"{directory.name}-{digest}"


def model_config(spec: str, cache_dir: str | None = None, progress: Progress | None = None):
    """The transformers config of a catalog model (from its small files) or a directory."""
    from transformers import AutoConfig

    if spec in CATALOG:
        entry, root = lookup(spec), cache_root(cache_dir)
        return AutoConfig.from_pretrained(ensure_model_files(entry, root, progress or no_progress))
    return AutoConfig.from_pretrained(model_directory(spec, cache_dir))


def load_tokenizer(spec: str, cache_dir: str | None = None):
    """The transformers tokenizer of a catalog model (from its small files: no weights are
    converted for it) or a model directory."""
    from transformers import AutoTokenizer

    if spec in CATALOG:
        return tokenizer_of(ensure_model_files(lookup(spec), cache_root(cache_dir)))
    return AutoTokenizer.from_pretrained(model_directory(spec, cache_dir))


def _load_llamacpp(spec: str, cache_dir: str | None, progress: Progress | None, gguf_type: str):
    from specdec.backends.llamacpp import LlamaCppModel
    from specdec.models import ensure_gguf_type

    if spec in CATALOG:
        entry = lookup(spec)
        path = ensure_gguf_type(
            entry, cache_root(cache_dir), gguf_type, *([progress] if progress else [])
        )
        model = LlamaCppModel(path)
        extra_eos = [
            model.llama.tokenize(t.encode(), add_bos=False, special=True) for t in entry.eos_tokens
        ]
        model.eos_token_ids = model.eos_token_ids | {ids[0] for ids in extra_eos if len(ids) == 1}
        return model
    path = Path(spec).expanduser()
    if path.suffix != ".gguf" or not path.is_file():
        raise ValueError(
            f"{spec!r} is neither a catalog model ({', '.join(CATALOG)}) nor a .gguf file"
        )
    return LlamaCppModel(path)
