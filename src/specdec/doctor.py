"""``specdec doctor``: whether the int8 and int4 runtimes' promise holds on this machine
(what the machine is: ``machine``).

The promise (``backends/quant/int8.py``): a block pass scores every position bit for bit as
one-token steps do, whatever the thread count. The check builds a random model at the
default target's layer sizes (hidden 1536, intermediate 8960; two layers, a small
vocabulary, so it takes seconds), converts it to the int8 runtime and compares blocks of
2..45 tokens with the same tokens fed one at a time, at several thread counts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

REAL_SIZES = {"hidden_size": 1536, "intermediate_size": 8960, "heads": 12, "kv_heads": 2}
# Verify passes, and passes of many rows (batched serving; the int4 kernel's AMX pieces).
BLOCK_SIZES = (2, 3, 5, 8, 9, 10, 12, 16, 45)


@dataclass(frozen=True)
class InvarianceResult:
    threads: int
    blocks: int
    mismatched: int  # blocks whose logits differ from the steps' in any bit

    @property
    def ok(self) -> bool:
        return self.mismatched == 0


def real_size_int8_model(layers: int = 2, vocab: int = 2048, seed: int = 0):
    """A random Qwen2 at the 1.5B's layer sizes, on the int8 runtime."""
    from specdec.backends.quant.convert import make_int8_batch_invariant

    return make_int8_batch_invariant(real_size_model(layers, vocab, seed))


def real_size_model(layers: int = 2, vocab: int = 2048, seed: int = 0):
    """A random float32 Qwen2 at the 1.5B's layer sizes."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=REAL_SIZES["hidden_size"],
        intermediate_size=REAL_SIZES["intermediate_size"],
        num_hidden_layers=layers,
        num_attention_heads=REAL_SIZES["heads"],
        num_key_value_heads=REAL_SIZES["kv_heads"],
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)  # model init draws from the global RNG; restored right after
    model = Qwen2ForCausalLM(config).eval()
    torch.random.set_rng_state(state)
    return model


def check_block_equals_steps(model, threads: int, seed: int = 0) -> InvarianceResult:
    """Blocks of BLOCK_SIZES tokens after a 20-token prefix vs the same tokens one by one."""
    from specdec.backends.hf import HFModel

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        generator = torch.Generator().manual_seed(seed)
        vocab = model.config.vocab_size
        mismatched = 0
        for size in BLOCK_SIZES:
            ids = torch.randint(0, vocab, (20 + size,), generator=generator).tolist()
            backend = HFModel(model)
            backend.forward(ids[:20])
            block = backend.forward(ids[20:])
            backend.truncate(20)
            steps = torch.cat([backend.forward([t]) for t in ids[20:]])
            mismatched += not torch.equal(block, steps)
        return InvarianceResult(threads, len(BLOCK_SIZES), mismatched)
    finally:
        torch.set_num_threads(before)


def thread_counts() -> list[int]:
    """1, 2, 3, 4, 8 and this machine's own count."""
    return sorted({1, 2, 3, 4, 8, torch.get_num_threads(), os.cpu_count() or 1})


def same_text_line(checked: dict[str, bool]) -> str:
    """Where a greedy or seeded request gives plain decoding's text, from the block == steps
    verdicts of the runtimes checked here (``runtime.SAME_TEXT_AS_PLAIN`` promises it)."""
    verdicts = ", ".join(
        f"{name} {'yes' if ok else 'NO (its check failed above)'}" for name, ok in checked.items()
    )
    return (
        "same text as plain decoding (greedy, or sampling with a seed) whatever k, -k auto and "
        f"the drafter: {verdicts or 'no runtime checked'}; bfloat16, float32 and llama.cpp: "
        "not promised (a verify pass can round differently from steps; the distribution is "
        "the target's all the same)\n"
    )
