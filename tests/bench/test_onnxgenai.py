"""ONNX Runtime GenAI as a bench peer (the peers extra): tiny random Qwen2 models converted by
its own model builder, decoded plain, with its n-gram speculation and with a draft model."""

from __future__ import annotations

import pytest

pytest.importorskip("onnxruntime_genai", reason="ONNX Runtime GenAI (the peers extra) is missing")
pytest.importorskip("onnx_ir", reason="ONNX Runtime GenAI's model builder (peers extra) is missing")

from specdec.bench.onnxgenai import (  # noqa: E402
    MARKER,
    OnnxGenAISystem,
    converted_dir,
    pair_dir,
)
from specdec.config import SamplingParams  # noqa: E402


def _available_gib() -> float:
    from pathlib import Path

    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return float("inf")


def _tiny_qwen(path, seed: int, layers: int):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        eos_token_id=511,
        bos_token_id=510,
    )
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache")
    target = _tiny_qwen(root / "hf-target", seed=0, layers=2)
    draft = _tiny_qwen(root / "hf-draft", seed=1, layers=1)
    return root, converted_dir(root, "target", target), converted_dir(root, "draft", draft)


def _system(name, converted):
    root, (target, target_note), (draft, draft_note) = converted
    dirs = {"target": (target, target_note), "pair": (pair_dir(root, target, draft), draft_note)}
    return OnnxGenAISystem(name, lambda role: dirs[role])


def test_conversion_is_cached_and_checked(converted):
    root, (target, note), _ = converted
    assert (target / MARKER).is_file() and "converted once in" in note
    marker = (target / MARKER).stat().st_mtime_ns
    again, _ = converted_dir(root, "target", root / "hf-target")
    assert again == target and (target / MARKER).stat().st_mtime_ns == marker  # not rebuilt
    (target / "model.onnx.data").write_bytes(b"truncated")  # no longer what the marker lists
    rebuilt, _ = converted_dir(root, "target", root / "hf-target")
    assert (rebuilt / MARKER).stat().st_mtime_ns != marker
    assert (rebuilt / "model.onnx.data").stat().st_size > len(b"truncated")


def test_speculation_decodes_what_it_decodes_alone(converted):
    params = SamplingParams(max_tokens=24, temperature=0.0)
    prompt = [5, 17, 99, 5, 17, 99, 5, 17, 99, 5, 17]  # repeats, so lookup has n-grams to use
    plain = _system("onnx-int4", converted).run(prompt, params)
    assert 0 < len(plain.token_ids) <= 24 and plain.peer and plain.stats is None
    for name in ("onnx-int4-lookup", "onnx-int4-model"):
        speculative = _system(name, converted).run(prompt, params)
        assert speculative.token_ids == plain.token_ids, name
        assert speculative.peer and speculative.stats is not None
    assert speculative.stats["drafted_tokens"] > 0  # the draft model always proposes
    assert 0 <= speculative.stats["accepted_tokens"] <= speculative.stats["drafted_tokens"]


def test_a_model_that_cannot_load_is_one_line(tmp_path):
    (tmp_path / "genai_config.json").write_text("{}")
    system = OnnxGenAISystem("onnx-int4", lambda role: (tmp_path, "test"))
    with pytest.raises(ValueError, match="cannot load"):
        system.run([1, 2, 3], SamplingParams(max_tokens=2, temperature=0.0))


@pytest.mark.slow
def test_the_real_pair_decodes_what_the_target_decodes_alone(tmp_path):
    """The catalog pair converted once (about 75 s and 16 GB peak on 2 cores, then cached):
    ONNX Runtime GenAI's speculative decoding with the 0.5B draft gives its own plain text."""
    import json

    from specdec.cli import main
    from specdec.models import CATALOG, DEFAULT_DRAFT, DEFAULT_TARGET, cache_root, status

    for name in (DEFAULT_TARGET, DEFAULT_DRAFT):
        found = status(CATALOG[name], cache_root())
        if not (found.installed or found.gguf_cached):
            pytest.skip(f"{name}'s weight packages are not installed")
    converted = (cache_root() / "onnx" / f"{DEFAULT_TARGET}-int4" / MARKER).is_file()
    if not converted and _available_gib() < 20:
        pytest.skip("converting the 1.5B takes about 16 GB; less memory is free here")
    out = tmp_path / "bench"
    args = ["bench", "--systems", "onnx-int4,onnx-int4-model", "--workloads", "code"]
    args += ["--prompts-per-workload", "1", "--max-tokens", "16", "--repeats", "1"]
    assert main([*args, "--out", str(out)]) == 0
    result = json.loads((out / "results.json").read_text())
    speculative = next(row for row in result["summary"] if row["system"] == "onnx-int4-model")
    assert speculative["reference"] == "onnx-int4" and speculative["identical"] == 1.0
    assert 0 < speculative["acceptance_rate"] <= 1
