"""The int8 and int4 runtime forms made straight from a GGUF file, one decoder layer at a time.

Why: the other way in (``models.ensure_converted``, then ``store.load_or_build``) writes the
whole model as float32 safetensors first and loads it back whole: for the default pair 9 GB
on disk and about 12 GB resident on a first run. Here each GGUF tensor is dequantized when
its layer is reached, the layer's projections are fused and quantized, and its float weights
are freed before the next layer is read: at most one layer's float32 weights (and the output
layer's, for that step) are held at once, and nothing float is written.

Exactness: the tensors are dequantized by gguf-py's ``dequantize`` and passed through
transformers' own per-architecture tensor processor (``TENSOR_PROCESSORS``: Llama's q/k
un-permutation), the same calls transformers' GGUF loader makes, and then quantized by the
same ``convert`` functions: the runtime form is the one the float32 route makes, byte for
byte (``tests/backends/quant/test_from_gguf.py`` compares them).
"""

from __future__ import annotations

import mmap
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import PreTrainedModel

from specdec.backends.quant import convert

_LAYER = re.compile(r"^(.*\.layers\.\d+)\.")  # a decoder layer's parameters share a prefix


class GGUFTensors:
    """The tensors of a GGUF file under the names of ``model``'s parameters (a skeleton on the
    meta device will do), each read and dequantized to float32 when asked for."""

    def __init__(self, path: Path, model: PreTrainedModel, config: dict):
        from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

        from specdec.gguf_file import architecture, tensor_data

        self.file, data = tensor_data(path)
        arch = architecture(path)
        self.processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=config)
        self.mapping = _weights_map(model, arch)  # GGUF name -> ours
        self.tensors = {
            self.mapping[name]: (name, *data[name]) for name in data if name in self.mapping
        }

    def read(self, name: str, start: int = 0, rows: int | None = None) -> torch.Tensor:
        """Parameter ``name`` as float32, as transformers' GGUF loader gives it; ``rows``
        of it from ``start`` (tensors the processor does not change: output, embedding)."""
        from gguf import GGMLQuantizationType, dequantize

        gguf_name, data, ggml_type = self.tensors[name]
        if rows is not None:
            assert gguf_name in ("output.weight", "token_embd.weight"), "read whole, processed"
            data = data[start : start + rows]
        weights = dequantize(data, GGMLQuantizationType(ggml_type))
        _drop_pages(self.file, data)
        processed = self.processor.process(
            weights=weights,
            name=gguf_name,
            tensor_key_mapping=self.mapping,
            parsed_parameters={"config": self.processor.config, "tensors": {}},
        )
        assert processed.name == gguf_name, "dense models keep one tensor a parameter"
        weights = np.ascontiguousarray(processed.weights, dtype=np.float32)
        if not weights.flags.writeable:
            weights = weights.copy()  # a float32 tensor is a view of the mapped file
        return torch.from_numpy(weights)


def _weights_map(model: PreTrainedModel, arch: str) -> dict[str, str]:
    """GGUF tensor name -> parameter name, by gguf-py's name table for ``arch``: what
    transformers' ``get_gguf_hf_weights_map`` gives a dense decoder, which builds the table
    again for every submodule it walks (371 times, 6 s, for the 1.5B)."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    codes = [code for code, name in MODEL_ARCH_NAMES.items() if name == arch]
    if not codes:
        raise ValueError(f"gguf-py does not know the GGUF architecture {arch!r}")
    table = get_tensor_name_map(codes[0], model.config.num_hidden_layers)
    mapping = {}
    for name, _ in model.named_parameters(remove_duplicate=False):
        base, _, suffix = name.rpartition(".")
        gguf_name = table.get_name(base)
        if gguf_name is not None:
            mapping[f"{gguf_name}.{suffix}"] = name
    return mapping


def _drop_pages(file: np.memmap, data: np.ndarray) -> None:
    """Unmap the pages of ``file`` that a tensor's bytes were read from: they stay in the
    page cache, but no longer count as this process's memory (the 1.5B's file would, 1.1 GB)."""
    offset = data.ctypes.data - file.ctypes.data
    start = offset // mmap.PAGESIZE * mmap.PAGESIZE
    if data.nbytes:
        file._mmap.madvise(  # type: ignore[attr-defined]  # numpy's own mapping
            mmap.MADV_DONTNEED, start, offset + data.nbytes - start
        )


PIECE_ROWS = 8192  # rows of the output layer dequantized and quantized at a time


def _pieces(tensors: GGUFTensors, name: str) -> Iterator[torch.Tensor]:
    """Parameter ``name`` as float32 pieces of ``PIECE_ROWS`` rows, in order, the next one
    dequantized on a second thread while the caller quantizes this one. Rows are independent
    in every GGUF block format, so the pieces are the whole's rows."""
    rows = tensors.tensors[name][1].shape[0]
    starts = list(range(0, rows, PIECE_ROWS))
    with ThreadPoolExecutor(max_workers=1) as reader:
        pending = reader.submit(tensors.read, name, 0, PIECE_ROWS)
        for index in range(len(starts)):
            piece = pending.result()
            if index + 1 < len(starts):
                pending = reader.submit(tensors.read, name, starts[index + 1], PIECE_ROWS)
            yield piece


def build_form(
    gguf: Path, model_files: Path, kind: str, progress=None, int4_group: int = 32
) -> PreTrainedModel:
    """The model of ``gguf`` on runtime ``kind`` (int8 or int4), built layer by layer, its
    token embedding kept in the GGUF's blocks (``embedding.BlockEmbedding``) and its output
    layer quantized ``PIECE_ROWS`` rows at a time. ``model_files``: its config.json and
    generation_config.json, as transformers parses them from the GGUF's metadata
    (``models.ensure_model_files``). ``int4_group``: inputs per int4 weight scale of its
    layers (a draft's 128)."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    from specdec.backends.quant.store import rebuild_meta_buffers

    quantized = convert.linear_quantizer(kind, int4_group)
    config = AutoConfig.from_pretrained(model_files)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = GGUFTensors(gguf, model, config.to_dict())
    ends = _ends(model, config)
    _check_every_parameter_is_there(model, tensors, ends)
    groups = _groups(model, tensors, skip=set(ends.values()))
    step = f"quantizing to {kind} (from the GGUF, layer by layer)"
    total = len(groups) + 1
    with ThreadPoolExecutor(max_workers=1) as reader:  # the next group dequantizes meanwhile
        pending = reader.submit(_read_group, tensors, groups[0][1])
        for done, (prefix, _) in enumerate(groups, start=1):
            floats = pending.result()
            if done < len(groups):
                pending = reader.submit(_read_group, tensors, groups[done][1])
            _assign(model, floats)
            del floats
            if prefix is not None:
                convert.quantize_linears(model.get_submodule(prefix), quantized)
            if progress is not None:
                progress(step, done, total)
    _set_ends(model, tensors, ends, kind)
    if progress is not None:
        progress(step, total, total)
    rebuild_meta_buffers(model, config)
    if (model_files / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(model_files)
    convert.finish_quantized_model(model)
    return model.eval()


def _ends(model: PreTrainedModel, config) -> dict[str, str]:
    """The parameter names of the input embedding and of the output layer's weights (the
    embedding's, when they are tied)."""
    embedding = _weight_name(model, model.get_input_embeddings())
    return {
        "embedding": embedding,
        "output": embedding if config.tie_word_embeddings else _output_weight(model),
    }


def _output_weight(model: PreTrainedModel) -> str:
    return _weight_name(model, model.get_output_embeddings())


def _weight_name(model: nn.Module, module: nn.Module) -> str:
    return next(f"{name}.weight" for name, found in model.named_modules() if found is module)


def _set_ends(model: PreTrainedModel, tensors: GGUFTensors, ends: dict[str, str], kind: str):
    """The input embedding as its GGUF blocks; the output layer quantized piece by piece
    (on int4 with a scale per 32 inputs whatever its layers', ``int4.OUTPUT_GROUP``)."""
    from specdec.backends.quant.embedding import BlockEmbedding
    from specdec.backends.quant.int4 import RowInt4Linear, fits
    from specdec.backends.quant.int8 import RowInt8Linear

    head = model.get_output_embeddings()
    bias = None
    if getattr(head, "bias", None) is not None:
        bias = tensors.read(f"{ends['output'].rpartition('.')[0]}.bias")
    pieces = _pieces(tensors, ends["output"])
    if kind == "int4" and fits(head):
        output: nn.Module = RowInt4Linear.from_row_pieces(pieces, bias)
    else:
        output = RowInt8Linear.from_row_pieces(pieces, bias)
    model.set_output_embeddings(output)
    _, data, ggml_type = tensors.tensors[ends["embedding"]]
    blocks = torch.from_numpy(np.array(data))  # a copy: the file's pages are let go
    _drop_pages(tensors.file, data)
    model.set_input_embeddings(BlockEmbedding(blocks, ggml_type, model.config.hidden_size))


def _groups(
    model: nn.Module, tensors: GGUFTensors, skip: set[str]
) -> list[tuple[str | None, list[str]]]:
    """The parameters to read, by decoder layer in order, then the rest (prefix None) but
    ``skip``."""
    layers: dict[str, list[str]] = {}
    rest: list[str] = []
    for name, _ in _parameters(model):
        if name not in tensors.tensors or name in skip:
            continue  # a tied output layer shares the input embedding
        match = _LAYER.match(name)
        (layers.setdefault(match.group(1), []) if match else rest).append(name)
    return [*layers.items(), (None, rest)]


def _parameters(model: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    return model.named_parameters(remove_duplicate=False)


def _check_every_parameter_is_there(
    model: PreTrainedModel, tensors: GGUFTensors, ends: dict[str, str]
) -> None:
    """A parameter with no tensor in the file is refused by name (a tied output layer reads
    the embedding's)."""
    tied = {_output_weight(model)} if ends["output"] == ends["embedding"] else set()
    missing = [n for n, _ in _parameters(model) if n not in tensors.tensors and n not in tied]
    if missing:
        raise ValueError(f"the GGUF file has no tensor for {', '.join(missing[:5])}")


def _read_group(tensors: GGUFTensors, names: list[str]) -> dict[str, torch.Tensor]:
    """The group's tensors, dequantized on two threads (numpy lets go of the GIL)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(names, pool.map(tensors.read, names), strict=True))


def _assign(model: nn.Module, floats: dict[str, torch.Tensor]) -> None:
    for name, tensor in floats.items():
        parent, _, attribute = name.rpartition(".")
        module = model.get_submodule(parent)
        expected = tuple(getattr(module, attribute).shape)
        if tuple(tensor.shape) != expected:
            raise ValueError(
                f"GGUF tensor for {name} has shape {tuple(tensor.shape)}, not {expected}"
            )
        setattr(module, attribute, nn.Parameter(tensor, requires_grad=False))
