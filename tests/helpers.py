"""Tiny models and tokenizers built in code (no downloads), and a chi-square helper."""

from __future__ import annotations

import copy

import numpy as np
import torch
from scipy import stats as scipy_stats
from tokenizers import Tokenizer, decoders, models
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from specdec.backends.hf import HFModel

CHARS = "abcdefghijklmnopqrstuvwxyz .,\n!"
EOS_ID = 0
VOCAB = 1 + len(CHARS)  # 32: "<eos>" then one token per character

# Chi-square tests reject at this level: with fresh random seeds a correct sampler would fail
# about 1 run in 10,000. The seeds are fixed, so the suite itself is deterministic.
SIGNIFICANCE = 1e-4


def char_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer over CHARS with <eos> = 0."""
    vocab = {"<eos>": EOS_ID, **{c: i + 1 for i, c in enumerate(CHARS)}}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")


def tiny_llama(seed: int, vocab: int = VOCAB, layers: int = 2, init: float = 0.5,
               eos: int | None = EOS_ID) -> LlamaForCausalLM:
    """A random float32 Llama. A large ``initializer_range`` makes its distributions peaky
    enough to look like a language model's rather than uniform."""
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        initializer_range=init, eos_token_id=eos, bos_token_id=None, pad_token_id=None,
        tie_word_embeddings=False,
    )
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)  # tests only: model init draws from the global RNG
    model = LlamaForCausalLM(config).eval()
    torch.random.set_rng_state(generator_state)
    return model


def perturbed_copy(model: LlamaForCausalLM, noise: float, seed: int) -> LlamaForCausalLM:
    """A different model that agrees with ``model`` often: weights + noise * N(0, std)."""
    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for weight in draft.parameters():
            scale = noise * float(weight.std()) if weight.numel() > 1 else 0.0
            weight.add_(torch.randn(weight.shape, generator=generator) * scale)
    return draft


def backend(model, tokenizer=None) -> HFModel:
    return HFModel(model, tokenizer)


def assert_same_distribution(counts: np.ndarray, expected_probs: np.ndarray) -> float:
    """Chi-square goodness of fit; cells expected < 5 are pooled. Returns the p-value.

    A token the target gives zero probability must never appear at all.
    """
    counts = np.asarray(counts, dtype=float)
    expected_probs = np.asarray(expected_probs, dtype=float)
    expected_probs = expected_probs / expected_probs.sum()
    impossible = expected_probs == 0
    assert counts[impossible].sum() == 0, f"sampled impossible tokens: {np.nonzero(counts * impossible)}"
    expected = expected_probs * counts.sum()
    small = (expected < 5) & ~impossible
    big = ~small & ~impossible
    observed_cells = list(counts[big]) + ([counts[small].sum()] if small.any() else [])
    expected_cells = list(expected[big]) + ([expected[small].sum()] if small.any() else [])
    p_value = float(scipy_stats.chisquare(observed_cells, expected_cells).pvalue)
    assert p_value > SIGNIFICANCE, f"distribution differs from the target (chi-square p = {p_value:.2e})"
    return p_value
