"""The runtime forms made straight from a GGUF file are the ones the float32 route makes.

A tiny Llama (q/k permuted in the file, as llama.cpp's converter writes them) and a tiny
Qwen2 (q/k/v biases, a tied output layer) are written as GGUF files with quantized tensors;
the layer-by-layer build must give the same runtime form, byte for byte, as loading the whole
file through transformers' GGUF loader in float32 and quantizing that.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from specdec.backends.hf import HFModel
from specdec.backends.quant import store
from specdec.backends.quant.convert import make_int4_batch_invariant, make_int8_batch_invariant
from specdec.backends.quant.from_gguf import build_form

gguf = pytest.importorskip("gguf")
IDS = [5, 9, 2, 7, 7, 1, 30, 12, 40, 3]


def _tiny(architecture: str):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    sizes = dict(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        bos_token_id=None,
        pad_token_id=None,
        eos_token_id=0,
    )
    torch.manual_seed(3)
    if architecture == "llama":
        return LlamaForCausalLM(LlamaConfig(**sizes, tie_word_embeddings=False))
    return Qwen2ForCausalLM(Qwen2Config(**sizes, tie_word_embeddings=True))


def _permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's q/k permutation (transformers' loader undoes it)."""
    shape = weights.shape
    split = weights.reshape(heads, 2, shape[0] // heads // 2, *shape[1:])
    return split.swapaxes(1, 2).reshape(shape)


def _write_gguf(model, architecture: str, path):
    """``model``'s tensors in a GGUF file: matrices as Q8_0 or Q4_0 (alternately), the rest
    float32."""
    config = model.config
    arch = next(key for key, value in gguf.MODEL_ARCH_NAMES.items() if value == architecture)
    names = gguf.get_tensor_name_map(arch, 2)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    for index, (name, tensor) in enumerate(model.state_dict().items()):
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        base, _, suffix = name.rpartition(".")
        weights = tensor.numpy().astype(np.float32)
        if architecture == "llama" and base.endswith("q_proj"):
            weights = _permute(weights, config.num_attention_heads)
        if architecture == "llama" and base.endswith("k_proj"):
            weights = _permute(weights, config.num_key_value_heads)
        kind = gguf.GGMLQuantizationType.F32
        if weights.ndim == 2:
            kind = (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0)[index % 2]
            weights = gguf.quants.quantize(weights, kind)
        writer.add_tensor(f"{names.get_name(base)}.{suffix}", weights, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _through_float32(model_class, config, path, kind: str):
    """What the float32 route gives: transformers' GGUF loader's tensors, quantized."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    model = model_class(config)
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    missing, _ = model.load_state_dict(tensors, strict=False)
    assert set(missing) <= {"lm_head.weight"}, missing
    model.tie_weights()
    make = make_int4_batch_invariant if kind == "int4" else make_int8_batch_invariant
    return make(model.eval())


@pytest.mark.parametrize("kind", ["int4", "int8"])
@pytest.mark.parametrize("architecture", ["llama", "qwen2"])
def test_a_form_built_from_the_gguf_is_the_float32_routes_byte_for_byte(
    architecture, kind, tmp_path
):
    original = _tiny(architecture)
    path = tmp_path / "tiny.gguf"
    _write_gguf(original, architecture, path)
    files = tmp_path / "files"
    original.config.save_pretrained(files)  # what models.ensure_model_files writes
    expected = _through_float32(type(original), original.config, path, kind)
    built = build_form(path, files, kind)
    store.save(expected, files, tmp_path / "expected", kind)
    store.save(built, files, tmp_path / "built", kind)
    want = load_file(tmp_path / "expected" / store.WEIGHTS)
    got = load_file(tmp_path / "built" / store.WEIGHTS)
    table = want.pop("float:model.embed_tokens.weight")  # kept in its blocks instead:
    assert set(got) - set(want) == {"gguf:model.embed_tokens", "gguf_type:model.embed_tokens"}
    assert all(torch.equal(got[name], want[name]) for name in want)
    assert torch.equal(built.get_input_embeddings().weight, table)  # the same rows
    logits = HFModel(built).forward(IDS)
    assert torch.equal(logits, HFModel(expected).forward(IDS))
    assert torch.isfinite(logits).all()
    loaded = store.load(tmp_path / "built")
    assert torch.equal(HFModel(loaded).forward(IDS), logits)


def test_the_built_form_decodes_like_the_model_it_came_from(tmp_path):
    """Not a copy of a mistake: the int4 form built from the GGUF agrees with the float
    model whose weights were written (top token at most positions, despite two roundings)."""
    original = _tiny("qwen2").eval()
    path = tmp_path / "tiny.gguf"
    _write_gguf(original, "qwen2", path)
    original.config.save_pretrained(tmp_path / "files")
    built = HFModel(build_form(path, tmp_path / "files", "int8"))
    with torch.no_grad():
        reference = original(torch.tensor([IDS])).logits[0]
    agree = (built.forward(IDS).argmax(-1) == reference.argmax(-1)).float().mean()
    assert agree >= 0.8


def test_a_gguf_missing_a_tensor_is_refused_by_name(tmp_path):
    original = _tiny("qwen2")
    path = tmp_path / "tiny.gguf"
    del original.model.layers[1].mlp.up_proj.weight  # the writer skips what is not there
    original.model.layers[1].mlp.up_proj.register_parameter("weight", None)
    _write_gguf(original, "qwen2", path)
    _tiny("qwen2").config.save_pretrained(tmp_path / "files")
    with pytest.raises(ValueError, match=r"no tensor for model\.layers\.1\.mlp\.up_proj"):
        build_form(path, tmp_path / "files", "int4")


def test_an_output_layer_read_in_pieces_is_the_whole(monkeypatch, tmp_path):
    from specdec.backends.quant import from_gguf

    original = _tiny("llama")  # untied: its own output layer
    path = tmp_path / "tiny.gguf"
    _write_gguf(original, "llama", path)
    monkeypatch.setattr(from_gguf, "PIECE_ROWS", 16 * 2)  # 96 rows: 3 pieces
    tensors = from_gguf.GGUFTensors(path, original, original.config.to_dict())
    pieces = list(from_gguf._pieces(tensors, "lm_head.weight"))
    assert [len(p) for p in pieces] == [32, 32, 32]
    assert torch.equal(torch.cat(pieces), tensors.read("lm_head.weight"))


@pytest.mark.parametrize("architecture", ["llama", "qwen2"])
def test_the_config_read_fast_is_the_one_transformers_parses(architecture, tmp_path):
    from transformers import AutoConfig

    from specdec.gguf_file import config_dict

    path = tmp_path / "tiny.gguf"
    _write_gguf(_tiny(architecture), architecture, path)
    fast = AutoConfig.for_model(**config_dict(path)).to_dict()
    slow = AutoConfig.from_pretrained(tmp_path, gguf_file=path.name).to_dict()
    fast.pop("_name_or_path"), slow.pop("_name_or_path")
    assert fast == slow


@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_a_stand_in_has_the_models_shapes_and_decodes_finite_logits(kind):
    """What ``auto`` times: the model's architecture on the runtime, made-up weights."""
    from specdec.backends.quant.stand_in import stand_in
    from specdec.runtime import model_runtime

    config = _tiny("qwen2").config
    model = stand_in(config, kind)
    assert model_runtime(model) == kind
    logits = HFModel(model).forward(IDS)
    assert logits.shape == (len(IDS), config.vocab_size) and torch.isfinite(logits).all()


def test_a_built_form_maps_its_tables_from_the_file_and_decodes_the_same(tmp_path, monkeypatch):
    """After writing the form, its large tables are mapped from the file (here every one:
    the threshold set to 0); the model decodes what it decoded before, and a load too."""
    original = _tiny("qwen2")
    path = tmp_path / "tiny.gguf"
    _write_gguf(original, "qwen2", path)
    files = tmp_path / "files"
    original.config.save_pretrained(files)
    expected = HFModel(build_form(path, files, "int4")).forward(IDS)
    monkeypatch.setattr(store, "MAP_ABOVE", 0)
    calls, read = [], store._Reader.read

    def reading(self, name, mapped=False):
        calls.append((name, mapped))
        return read(self, name, mapped)

    monkeypatch.setattr(store._Reader, "read", reading)
    built = store.load_or_build(
        files, tmp_path / "form", None, "int4", build=lambda: build_form(path, files, "int4")
    )
    assert ("gguf:model.embed_tokens", True) in calls  # the table now comes from the file
    assert torch.equal(HFModel(built).forward(IDS), expected)
    assert torch.equal(HFModel(store.load(tmp_path / "form")).forward(IDS), expected)


def test_the_gguf_leaves_the_cache_once_its_form_is_made(tmp_path, monkeypatch):
    """Issue 49: a catalog model's GGUF is read to make the int4 form, then taken out of the
    cache (the form and the small files are all later runs read); it is assembled again only
    for what reads it, and a later load reads the form alone."""
    from specdec import loading, models

    entry = models.lookup("qwen2.5-coder-0.5b-instruct")
    root = tmp_path / "cache"
    original = _tiny("qwen2")
    files = root / "files" / entry.name
    original.config.save_pretrained(files)
    assembled = []

    def ensure_gguf(entry, root, progress=None):  # as if assembled from the packages
        assembled.append(entry.name)
        path = models.gguf_path(entry, root)
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_gguf(original, "qwen2", path)
        return path

    monkeypatch.setattr(loading, "ensure_gguf", ensure_gguf)
    monkeypatch.setattr(loading, "ensure_model_files", lambda entry, root, progress: files)
    monkeypatch.setattr(loading, "tokenizer_of", lambda files: None)
    first = loading._load_catalog_quantized(entry, "int4", root, None)
    assert assembled == [entry.name]
    assert not models.gguf_path(entry, root).exists()
    assert (models.form_directory(entry, root, "int4") / store.WEIGHTS).is_file()
    again = loading._load_catalog_quantized(entry, "int4", root, None)
    assert assembled == [entry.name]  # the form alone
    assert torch.equal(again.forward(IDS), first.forward(IDS))
