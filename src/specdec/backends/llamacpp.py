"""llama.cpp runtime (llama-cpp-python, the optional ``llamacpp`` extra) behind ``Backend``.

A GGUF file loads directly, no conversion. ``Llama.eval`` appends to its KV cache and, with
``logits_all``, keeps logits for every evaluated position; lowering ``n_tokens`` is
llama-cpp-python's own rollback (its next ``eval`` removes the cache beyond it), so
``truncate(n)`` is exactly that.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch


class LlamaCppTokenizer:
    """encode/decode over llama.cpp's own tokenizer (what the engine's text path needs)."""

    def __init__(self, llama):
        self.llama = llama
        self.eos_token_id = llama.token_eos()
        self.chat_template = llama.metadata.get("tokenizer.chat_template")  # the GGUF's own

    def encode(self, text: str) -> list[int]:
        return self.llama.tokenize(text.encode("utf-8"), add_bos=False, special=True)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tokenize: bool = True):
        """The GGUF's chat template, rendered with jinja2 as transformers does."""
        import jinja2

        template = jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(self.chat_template)
        text = template.render(messages=messages, add_generation_prompt=add_generation_prompt)
        return self.encode(text) if tokenize else text

    def __len__(self) -> int:
        return int(self.llama.n_vocab())

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.llama.detokenize(list(token_ids), special=not skip_special_tokens).decode("utf-8", errors="replace")


class LlamaCppModel:
    def __init__(self, gguf_path: str | Path, n_ctx: int = 2048, n_threads: int = 2, tokenizer=None,
                 eos_token_ids: Sequence[int] = ()):
        try:
            from llama_cpp import Llama
        except ImportError:
            raise ValueError("the llama.cpp runtime needs llama-cpp-python: pip install -e '.[llamacpp]'") from None
        # logits_all: a verify pass needs the logits of every position, not just the last.
        self.llama = Llama(model_path=str(gguf_path), n_ctx=n_ctx, n_threads=n_threads,
                           n_threads_batch=n_threads, n_batch=512, logits_all=True, verbose=False)
        self.vocab_size = int(self.llama.n_vocab())
        self.tokenizer = tokenizer or LlamaCppTokenizer(self.llama)
        self.eos_token_ids = frozenset({int(self.llama.token_eos()), *eos_token_ids})
        self.max_length = n_ctx
        self._cached_ids: list[int] = []

    @property
    def cached_token_ids(self) -> Sequence[int]:
        return self._cached_ids

    def forward(self, token_ids: Sequence[int]) -> torch.Tensor:
        assert len(token_ids) > 0, "forward needs at least one token"
        start = self.llama.n_tokens
        assert start == len(self._cached_ids), "llama.cpp state and our token list disagree"
        self.llama.eval(list(token_ids))
        logits = self.llama.scores[start : start + len(token_ids), : self.vocab_size]
        self._cached_ids.extend(int(t) for t in token_ids)
        return torch.from_numpy(logits.copy()).float()

    def truncate(self, n: int) -> None:
        assert 0 <= n <= len(self._cached_ids), f"cannot keep {n} of {len(self._cached_ids)}"
        self.llama.n_tokens = n  # llama-cpp-python's rollback: the next eval drops the rest
        del self._cached_ids[n:]
