"""The int8 and int4 runtimes' form of a model, kept on disk: a second load skips the float32
weights.

Quantizing a 1.5B model means loading 6 GB of float32 weights and rounding them (about 20 s
and 11 GB resident for the default pair on these machines). The runtime form is written
once: every ``RowInt8Linear``'s int8 rows and scales (every ``RowInt4Linear``'s packed
blocks), the other tensors (embeddings, norms) as they are, the config and generation
config. A later load builds the model's skeleton on the meta device, packs the int8 rows
for fbgemm and never materializes a float linear.

Like the model cache, a directory counts only when its marker, written last, names the
format, the source's fingerprint and every file's size and digest: an interrupted or
truncated write is rebuilt, never used, and so is one damaged in place (its digest is
checked before every load, with a line saying it is rebuilt).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import PreTrainedModel

from specdec.backends.quant.convert import make_int4_batch_invariant, make_int8_batch_invariant
from specdec.backends.quant.embedding import BlockEmbedding
from specdec.backends.quant.int4 import RowInt4Linear
from specdec.backends.quant.int8 import RowInt8Linear
from specdec.integrity import (
    damaged_files,
    file_lock,
    read_marker,
    say_rebuilding,
    write_marker,
)

FORMAT = 3  # 2: q/k/v and gate/up stored fused (quant/fused.py); 3: digests
KINDS = ("int8", "int4")
MARKER = "specdec-int8.json"
WEIGHTS = "int8.safetensors"
_COPIED = ("config.json", "generation_config.json")


def quantizer(kind: str, int4_group: int = 32):
    """The function that puts a float32 model on runtime ``kind`` in place (on int4 with
    ``int4_group`` inputs a weight scale in its layers: a draft's 128)."""
    if kind not in KINDS:
        raise ValueError(f"runtime form must be one of {', '.join(KINDS)}, got {kind!r}")
    if kind == "int8":
        return make_int8_batch_invariant
    return functools.partial(make_int4_batch_invariant, group=int4_group)


def source_fingerprint(source: Path, kind: str = "int8") -> str:
    """What the runtime form was made from: the source's config and weight files (names,
    sizes, modification times), the runtime and this format's version."""
    digest = hashlib.sha256(f"specdec-{kind}-{FORMAT}".encode())
    for path in sorted(source.iterdir()):
        if path.suffix in (".json", ".safetensors") and path.name != MARKER:
            stat = path.stat()
            digest.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()


def is_complete(directory: Path, fingerprint: str) -> bool:
    """Whether ``directory`` holds a finished runtime form of this source, every file in
    its recorded size (digests: ``damaged``)."""
    marker = read_marker(directory, MARKER, {"format": FORMAT, "source": fingerprint})
    return marker is not None and WEIGHTS in marker["files"]


def damaged(directory: Path, fingerprint: str, progress=None) -> list[str]:
    """The files of a complete runtime form whose bytes are not the ones written."""
    marker = read_marker(directory, MARKER, {"format": FORMAT, "source": fingerprint})
    assert marker is not None, "a complete form (is_complete) has a marker"
    return damaged_files(directory, marker, progress=progress)


def save(model: nn.Module, source: Path, directory: Path, kind: str = "int8") -> None:
    """Write ``model`` (already on runtime ``kind``) as its runtime form, atomically."""
    from safetensors.torch import save_file

    building = directory.with_name(directory.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    tensors: dict[str, torch.Tensor] = {}
    linears = {
        name
        for name, module in model.named_modules()
        if isinstance(module, RowInt8Linear | RowInt4Linear)
    }
    for name in sorted(linears):
        layer = model.get_submodule(name)
        if isinstance(layer, RowInt4Linear):
            tensors[f"{name}.int4"] = layer.packed
        else:
            assert isinstance(layer, RowInt8Linear), "named as a quantized linear above"
            tensors[f"{name}.int8"], tensors[f"{name}.scales"] = layer.int8_state()
        if layer.bias is not None:
            tensors[f"{name}.bias"] = layer.bias
    for name, module in model.named_modules():
        if isinstance(module, BlockEmbedding):  # kept in the GGUF's blocks
            tensors[f"gguf:{name}"] = module.blocks
            tensors[f"gguf_type:{name}"] = torch.tensor([module.ggml_type])
    for name, tensor in model.state_dict().items():
        if name.rpartition(".")[0] not in linears:
            # Saved under the plain model's names: the token-by-token wrappers are rebuilt.
            tensors[f"float:{name.replace('.inner.', '.')}"] = tensor
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(building / WEIGHTS))
    for name in _COPIED:
        if (source / name).is_file():
            shutil.copy2(source / name, building / name)
    fingerprint = source_fingerprint(source, kind)
    write_marker(building, MARKER, {"format": FORMAT, "source": fingerprint})
    shutil.rmtree(directory, ignore_errors=True)  # whatever is there failed the check
    building.replace(directory)


def load(directory: Path, progress=None) -> PreTrainedModel:
    """The int8 or int4 model from its runtime form (see ``is_complete`` first). Two threads
    read and pack the linears (fbgemm's prepack releases the GIL); nothing is memory-mapped,
    so the file's pages do not add to the resident set while it loads."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    from specdec.backends.quant.convert import finish_quantized_model
    from specdec.backends.quant.fused import fuse_projections

    config = AutoConfig.from_pretrained(directory)
    with torch.device("meta"):
        model = fuse_projections(AutoModelForCausalLM.from_config(config, dtype=torch.float32))
    reader = _Reader(directory / WEIGHTS)
    linears = sorted({n.rsplit(".", 1)[0] for n in reader.names if n.endswith((".int8", ".int4"))})

    def build(name: str) -> tuple[str, nn.Module]:
        bias = reader.read(f"{name}.bias") if f"{name}.bias" in reader.names else None
        if f"{name}.int4" in reader.names:
            return name, RowInt4Linear.from_packed(reader.read(f"{name}.int4"), bias)
        int8, scales = reader.read(f"{name}.int8"), reader.read(f"{name}.scales")
        return name, RowInt8Linear.from_int8(int8, scales, bias)

    with ThreadPoolExecutor(max_workers=2) as pool:
        for done, (name, layer) in enumerate(pool.map(build, linears), start=1):
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, layer)
            if progress is not None:
                progress("loading the quantized runtime", done, len(linears))
    for name in reader.names:
        if name.startswith("gguf:"):
            module = name.removeprefix("gguf:")
            blocks = reader.read(name, mapped=reader.size(name) > MAP_ABOVE)
            ggml_type = int(reader.read(f"gguf_type:{module}")[0])
            parent, _, child = module.rpartition(".")
            embedding = BlockEmbedding(blocks, ggml_type, config.hidden_size)
            setattr(model.get_submodule(parent) if parent else model, child, embedding)
    floats = {
        name.removeprefix("float:"): reader.read(name, mapped=reader.size(name) > MAP_ABOVE)
        for name in reader.names
        if name.startswith("float:")
    }
    model.load_state_dict(floats, strict=False, assign=True)
    _give_back_freed_memory()
    rebuild_meta_buffers(model, config)
    if (directory / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(directory)
    finish_quantized_model(model)
    model.eval()
    return model


_DTYPES = {
    "I8": torch.int8,
    "I64": torch.int64,
    "U8": torch.uint8,
    "F64": torch.float64,
    "F32": torch.float32,
    "BF16": torch.bfloat16,
}
_NUMPY = {"I64": np.int64, "I8": np.int8, "U8": np.uint8, "F64": np.float64, "F32": np.float32}
MAP_ABOVE = 64 * 1024 * 1024  # float tensors larger than this are mapped, not copied


def _give_back_freed_memory() -> None:
    """Return freed heap pages to the OS: packing frees many 10-20 MB buffers that glibc
    would otherwise keep (about 0.7 GB resident for the 1.5B, measured)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(name).malloc_trim(0)


class _Reader:
    """Tensors of a safetensors file read with positional reads (thread-safe, no mmap)."""

    def __init__(self, path: Path):
        self.path = path
        with open(path, "rb") as handle:
            header_size = int.from_bytes(handle.read(8), "little")
            header = json.loads(handle.read(header_size))
        header.pop("__metadata__", None)
        self.entries, self.base = header, 8 + header_size
        self.names = set(header)

    def size(self, name: str) -> int:
        start, end = self.entries[name]["data_offsets"]
        return end - start

    def read(self, name: str, mapped: bool = False) -> torch.Tensor:
        """A copy in memory, or ``mapped``: pages come from the file as they are touched (an
        embedding table: only the rows of tokens seen), copy-on-write, the file untouched."""
        entry = self.entries[name]
        start, end = entry["data_offsets"]
        if mapped:
            array = np.memmap(
                self.path,
                dtype=_NUMPY[entry["dtype"]],
                mode="c",
                offset=self.base + start,
                shape=tuple(entry["shape"]),
            )
            return torch.from_numpy(array)
        with open(self.path, "rb") as handle:
            handle.seek(self.base + start)
            data = bytearray(end - start)
            assert handle.readinto(data) == len(data), f"{self.path} is truncated"
        if not data:
            return torch.empty(entry["shape"], dtype=_DTYPES[entry["dtype"]])
        return torch.frombuffer(data, dtype=_DTYPES[entry["dtype"]]).reshape(entry["shape"])


def rebuild_meta_buffers(model: nn.Module, config) -> None:
    """Buffers not saved in a state dict (rotary frequencies) are computed again on the CPU."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if any(buffer.is_meta for buffer in child.buffers(recurse=False)):
                setattr(parent, name, type(child)(config=config))
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    assert not left, f"tensors missing from the int8 runtime form: {left[:5]}"


def load_or_build(
    source: Path,
    directory: Path,
    progress=None,
    kind: str = "int8",
    check_source: Callable[[], object] | None = None,
    build: Callable[[], PreTrainedModel] | None = None,
    int4_group: int = 32,
) -> PreTrainedModel:
    """The int8 (int4) model of the model in ``source``: from ``directory`` when it holds a
    complete, undamaged runtime form of this source, else made now and written there.
    ``build`` makes it (``from_gguf.build_form``: ``source`` then holds only the config
    and tokenizer); without it the float32 model in ``source`` is loaded and quantized.
    ``check_source`` is called before the source's weights are read (the model cache checks
    their digests, and converts them again if they are damaged)."""
    from transformers import AutoModelForCausalLM

    make = quantizer(kind, int4_group)
    if _intact(source, directory, kind, progress):
        return load(directory, progress)
    directory.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(directory.with_name(directory.name + ".lock")):
        fingerprint = source_fingerprint(source, kind)
        if is_complete(directory, fingerprint) and not damaged(directory, fingerprint):
            return load(directory, progress)  # another process wrote it while we waited
        if check_source is not None:
            check_source()
        if build is not None:
            model = build()
        else:
            model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
            make(model, progress)
        save(model, source, directory, kind)
        _map_large_floats(model, directory)
    return model


def _map_large_floats(model: nn.Module, directory: Path) -> None:
    """Point the model's large float tensors (embeddings) at the file just written, mapped as
    ``load`` maps them: the same values, and only the rows read are resident (the 1.5B's
    embedding table is 0.93 GB of float32)."""
    reader = _Reader(directory / WEIGHTS)
    for name, module in model.named_modules():
        if isinstance(module, BlockEmbedding) and reader.size(f"gguf:{name}") > MAP_ABOVE:
            module.blocks = reader.read(f"gguf:{name}", mapped=True)
    for name, _ in list(model.named_parameters()):
        stored = f"float:{name.replace('.inner.', '.')}"
        if stored in reader.names and reader.size(stored) > MAP_ABOVE:
            mapped = reader.read(stored, mapped=True)  # comparing would read every page in
            parent, _, attribute = name.rpartition(".")
            setattr(model.get_submodule(parent), attribute, nn.Parameter(mapped, False))
    _give_back_freed_memory()


def _intact(source: Path, directory: Path, kind: str, progress) -> bool:
    fingerprint = source_fingerprint(source, kind)
    if not is_complete(directory, fingerprint):
        return False
    bad = damaged(directory, fingerprint, progress)
    if bad:
        say_rebuilding(directory / bad[0], f"making the {kind} runtime form again")
    return not bad
