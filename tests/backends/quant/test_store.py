"""The int8 runtime's on-disk form: the same model, bit for bit; damaged entries rebuilt."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import perturbed_copy, tiny_llama
from specdec import Engine, SamplingParams, SpecConfig
from specdec.backends.quant import store as int8_cache
from specdec.drafters import ModelDrafter
from specdec.loading import load_hf

IDS = [5, 9, 2, 7, 7, 1, 30, 12]


def entry(cache):
    (found,) = [path for path in cache.iterdir() if path.is_dir()]
    return found


def test_a_cached_load_is_the_same_model_bit_for_bit(model_dir, tmp_path):
    cache = tmp_path / "cache"
    built = load_hf(model_dir, "int8", int8_cache=cache)  # quantized now, written
    loaded = load_hf(model_dir, "int8", int8_cache=cache)  # from the runtime form
    assert (entry(cache) / int8_cache.MARKER).is_file()
    fresh = load_hf(model_dir, "int8")  # no cache at all
    expected = fresh.forward(IDS)
    for model in (built, loaded):
        assert torch.equal(model.forward(IDS), expected)
    assert loaded.eos_token_ids == fresh.eos_token_ids
    block = loaded.forward([3, 4, 5, 6])
    loaded.truncate(len(IDS))
    steps = torch.cat([loaded.forward([t]) for t in (3, 4, 5, 6)])
    assert torch.equal(block, steps), "the loaded model is batch-invariant too"


def test_greedy_speculation_on_cached_models_equals_plain(model_dir, tmp_path):
    draft_dir = tmp_path / "draft"
    perturbed_copy(tiny_llama(seed=0), noise=0.03, seed=1).save_pretrained(draft_dir)
    cache = tmp_path / "cache"
    for _ in range(2):  # built, then loaded
        target = load_hf(model_dir, "int8", int8_cache=cache)
        draft = load_hf(draft_dir, "int8", int8_cache=cache)
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    plain = Engine(load_hf(model_dir, "int8")).generate(IDS, params)
    out = Engine(target, ModelDrafter(draft)).generate(IDS, params, SpecConfig(k=4))
    assert out.token_ids == plain.token_ids and out.stats.accepted_tokens > 0


def damage_truncate(directory):
    weights = directory / int8_cache.WEIGHTS
    weights.write_bytes(weights.read_bytes()[:-100])


def damage_marker(directory):
    (directory / int8_cache.MARKER).unlink()


def damage_format(directory):
    marker = json.loads((directory / int8_cache.MARKER).read_text())
    marker["format"] = -1
    (directory / int8_cache.MARKER).write_text(json.dumps(marker))


@pytest.mark.parametrize("damage", [damage_truncate, damage_marker, damage_format])
def test_a_damaged_entry_is_detected_and_rebuilt(model_dir, tmp_path, damage):
    cache = tmp_path / "cache"
    expected = load_hf(model_dir, "int8", int8_cache=cache).forward(IDS)
    damage(entry(cache))
    assert not int8_cache.is_complete(entry(cache), int8_cache.source_fingerprint(model_dir))
    assert torch.equal(load_hf(model_dir, "int8", int8_cache=cache).forward(IDS), expected)
    assert int8_cache.is_complete(entry(cache), int8_cache.source_fingerprint(model_dir))


def test_a_changed_source_model_is_quantized_again(model_dir, tmp_path):
    cache = tmp_path / "cache"
    old = load_hf(model_dir, "int8", int8_cache=cache).forward(IDS)
    tiny_llama(seed=5).save_pretrained(model_dir)  # other weights in the same directory
    new = load_hf(model_dir, "int8", int8_cache=cache).forward(IDS)
    assert not torch.equal(old, new)
    assert torch.equal(new, load_hf(model_dir, "int8").forward(IDS))


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_byte_flipped_in_place_is_detected_and_rebuilt(model_dir, tmp_path, kind, capsys):
    """Issue 45.5: the marker recorded sizes only, so a form damaged in place (one tensor's
    bytes XOR-ed, the size unchanged) loaded silently and decoded other text."""
    cache = tmp_path / "cache" / "int8"
    expected = load_hf(model_dir, kind, int8_cache=cache).forward(IDS)
    directory = entry(cache.with_name(kind))
    weights = directory / int8_cache.WEIGHTS
    data = bytearray(weights.read_bytes())
    for at in range(len(data) - 4096, len(data) - 4000):  # inside the last tensor's bytes
        data[at] ^= 0x5A
    weights.write_bytes(bytes(data))
    capsys.readouterr()
    assert torch.equal(load_hf(model_dir, kind, int8_cache=cache).forward(IDS), expected)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"making the {kind} runtime form again" in err
    fingerprint = int8_cache.source_fingerprint(model_dir, kind)
    assert int8_cache.damaged(directory, fingerprint) == []
