"""What specdec reads from a GGUF file: the config and tokenizer transformers makes of its
metadata, and each tensor's stored bytes.

Why not gguf-py's ``GGUFReader`` (behind ``AutoConfig``/``AutoTokenizer.from_pretrained(...,
gguf_file=...)`` for these architectures): it makes a numpy view of each of the vocabulary's
300,000 strings, 9.5-13 s an open for the default pair's files, and a first run opened each
file several times. The metadata is read with transformers' own fast reader
(``read_gguf_metadata``), the tensor table walked here (that reader refuses tensor types it
cannot load itself, the 0.5B's Q5_0), and the tensors' bytes mapped, nothing read.

The config is parsed as transformers' own GGUF loader parses it (``load_gguf_checkpoint``:
its key mapping, defaults, tied output layer and vocabulary size), for the dense decoder
architectures listed in ``FAST``; other architectures go through that loader itself.
``tests/backends/quant/test_from_gguf.py`` holds the two against each other.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

# Architectures whose config is the generic key mapping alone (no special case in the loader).
FAST = ("llama", "qwen2", "qwen3")


def architecture(gguf: Path) -> str:
    """The file's ``general.architecture`` (llama.cpp's name for it)."""
    from transformers.integrations.gguf import read_gguf_metadata

    return read_gguf_metadata(str(gguf))[0]["general.architecture"]


def config_dict(gguf: Path) -> dict:
    """The transformers config (as a dict) that ``AutoConfig.from_pretrained(..., gguf_file=)``
    builds for ``gguf``."""
    from transformers.integrations.gguf import read_gguf_metadata

    metadata, tensor_names = read_gguf_metadata(str(gguf))
    architecture = metadata["general.architecture"]
    if architecture not in FAST or "mistral" in str(metadata.get("general.name", "")).lower():
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

        return load_gguf_checkpoint(str(gguf), return_tensors=False)["config"]
    return _mapped_config(metadata, tensor_names, architecture)


def _mapped_config(metadata: dict, tensor_names: tuple[str, ...], architecture: str) -> dict:
    from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_CONFIG_MAPPING

    config: dict = {"tie_word_embeddings": "output.weight" not in tensor_names}
    config.update(GGUF_CONFIG_DEFAULTS_MAPPING.get(architecture, {}))
    for key, value in metadata.items():
        prefix, _, config_key = key.partition(".")
        renames: dict = GGUF_CONFIG_MAPPING.get(prefix, {})  # type: ignore[assignment]
        renamed = renames.get(config_key)
        if renamed not in (None, -1):
            config[renamed] = value
    if "vocab_size" not in config and isinstance(metadata.get("tokenizer.ggml.tokens"), int):
        config["vocab_size"] = metadata["tokenizer.ggml.tokens"]  # the reader counts the array
    return config


def write_config(gguf: Path, out_dir: Path):
    """``gguf``'s transformers config, saved in ``out_dir`` and returned."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = AutoConfig.for_model(**config_dict(gguf))
    # as a float32 model saved by transformers records them
    config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]]
    config.dtype = "float32"
    config.save_pretrained(out_dir)
    return config


def write_tokenizer(gguf: Path, model_type: str, out_dir: Path):
    """``gguf``'s tokenizer, of the class ``AutoTokenizer`` picks for ``model_type``, saved in
    ``out_dir`` and returned (the same files as ``AutoTokenizer.from_pretrained(gguf_file=)``
    gives, without the config it would parse again)."""
    from transformers.models.auto.tokenization_auto import (
        TOKENIZER_MAPPING_NAMES,
        tokenizer_class_from_name,
    )

    names = TOKENIZER_MAPPING_NAMES.get(model_type)
    name = names if isinstance(names, str) or names is None else next(n for n in names if n)
    tokenizer_class = tokenizer_class_from_name(name) if name else None
    if tokenizer_class is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    else:
        tokenizer = tokenizer_class.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer.save_pretrained(out_dir)
    return tokenizer


def tensor_data(gguf: Path) -> tuple[np.memmap, dict[str, tuple[np.ndarray, int]]]:
    """The file mapped, and every tensor's stored bytes in it (a view, nothing read yet)
    shaped as gguf-py's ``dequantize`` takes them, [..., bytes of a row], with its ggml
    type."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    blob = np.memmap(gguf, mode="r", dtype=np.uint8)
    header = memoryview(blob)  # type: ignore[arg-type]  # a memmap is a buffer
    if bytes(header[:4]) != b"GGUF":
        raise ValueError(f"{gguf} is not a GGUF file (it does not start with GGUF)")
    _, tensor_count, metadata_count = struct.unpack_from("<IQQ", header, 4)
    position, alignment = 24, 32
    for _ in range(metadata_count):
        key, position = _string(header, position)
        (kind,) = struct.unpack_from("<I", header, position)
        if key == "general.alignment":
            (alignment,) = struct.unpack_from("<I", header, position + 4)
        position = _skip_value(header, position + 4, kind)
    table = []
    for _ in range(tensor_count):
        name, position = _string(header, position)
        (dims,) = struct.unpack_from("<I", header, position)
        shape = struct.unpack_from(f"<{dims}Q", header, position + 4)[::-1]  # torch's order
        ggml_type, offset = struct.unpack_from("<IQ", header, position + 4 + 8 * dims)
        table.append((name, shape, ggml_type, offset))
        position += 4 + 8 * dims + 12
    start = -(-position // alignment) * alignment
    tensors = {}
    for name, shape, ggml_type, offset in table:
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
        size = int(np.prod(shape)) // block * block_bytes
        data = blob[start + offset : start + offset + size]
        tensors[name] = (data.reshape(*shape[:-1], -1), ggml_type)
    return blob, tensors


_WIDTHS = {0: 1, 1: 1, 7: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 10: 8, 11: 8, 12: 8}  # by value type


def _string(header: memoryview, position: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", header, position)
    end = position + 8 + length
    return bytes(header[position + 8 : end]).decode("utf-8"), end


def _skip_value(header: memoryview, position: int, kind: int) -> int:
    if kind in _WIDTHS:
        return position + _WIDTHS[kind]
    if kind == 8:  # a string: its length, then its bytes (not decoded: only skipped)
        return position + 8 + struct.unpack_from("<Q", header, position)[0]
    if kind != 9:
        raise ValueError(f"a GGUF metadata value of unknown type {kind}")
    element, count = struct.unpack_from("<IQ", header, position)
    position += 12
    if element in _WIDTHS:
        return position + count * _WIDTHS[element]
    for _ in range(count):
        position = _skip_value(header, position, element)
    return position
