"""Tiny random models and a character tokenizer, built in code: for tests and quick benches.

Nothing is downloaded. A large ``initializer_range`` makes the random distributions peaky
enough to look like a language model's; a perturbed copy of the target makes a draft that
agrees with it often but not always.
"""

from __future__ import annotations

import copy

import torch

CHARS = "abcdefghijklmnopqrstuvwxyz .,\n!"
EOS_ID = 0
VOCAB = 1 + len(CHARS)  # 32: "<eos>" then one token per character


def char_tokenizer():
    """A character-level tokenizer over CHARS with <eos> = 0."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<eos>": EOS_ID, **{c: i + 1 for i, c in enumerate(CHARS)}}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")


def tiny_llama(
    seed: int,
    vocab: int = VOCAB,
    layers: int = 2,
    init: float = 0.5,
    eos: int | None = EOS_ID,
    max_positions: int = 256,
    hidden: int = 32,
    intermediate: int = 64,
):
    """A random float32 Llama with a ``hidden``-wide hidden state (32)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        initializer_range=init,
        eos_token_id=eos,
        bos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)  # model init draws from the global RNG; restored right after
    model = LlamaForCausalLM(config).eval()
    torch.random.set_rng_state(state)
    return model


def perturbed_copy(model, noise: float, seed: int):
    """A different model that agrees with ``model`` often: weights + noise * N(0, std)."""
    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for weight in draft.parameters():
            scale = noise * float(weight.std()) if weight.numel() > 1 else 0.0
            weight.add_(torch.randn(weight.shape, generator=generator) * scale)
    return draft
