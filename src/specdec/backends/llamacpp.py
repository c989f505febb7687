"""llama.cpp runtime (llama-cpp-python, the optional ``llamacpp`` extra) behind ``Backend``.

A GGUF file loads directly, no conversion. ``forward`` drives llama-cpp-python's context
and batch objects itself (``Llama.eval`` with ``logits_all`` would copy logits for every
prompt position and compute the output layer for them): each batch asks for the rows the
caller needs. Rollback is llama-cpp-python's own: lower ``n_tokens``, and the next decode
first removes the KV cells beyond it (``llama_memory_seq_rm``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch


class LlamaCppTokenizer:
    """encode/decode over llama.cpp's own tokenizer (what the engine's text path needs)."""

    def __init__(self, llama):
        self.llama = llama
        self.eos_token_id = llama.token_eos()
        self.chat_template = llama.metadata.get("tokenizer.chat_template")  # the GGUF's own

    def encode(self, text: str) -> list[int]:
        return self.llama.tokenize(text.encode("utf-8"), add_bos=False, special=True)

    def apply_chat_template(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tokenize: bool = True,
        tools: list[dict] | None = None,
        continue_final_message: bool = False,
    ):
        """The GGUF's chat template, rendered with jinja2 as transformers does (a sandbox,
        ``raise_exception`` for a template's own refusals: jinja2 ``TemplateError``, and its
        ``tojson``: JSON as ``json.dumps`` writes it, not HTML-escaped as jinja2's own);
        ``continue_final_message``: cut after the last message's text (as transformers did
        before its field markers: the text's last place, else its stripped text's)."""
        import json

        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        if not self.chat_template:
            raise ValueError("this GGUF has no chat template: use raw completion")

        def raise_exception(message: str):
            raise jinja2.TemplateError(message)

        def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(
                value,
                ensure_ascii=ensure_ascii,
                indent=indent,
                separators=separators,
                sort_keys=sort_keys,
            )

        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        environment.globals["raise_exception"] = raise_exception
        environment.filters["tojson"] = tojson
        template = environment.from_string(self.chat_template)
        text = template.render(
            messages=messages, tools=tools, add_generation_prompt=add_generation_prompt
        )
        if continue_final_message:
            if add_generation_prompt:
                raise ValueError(
                    "continue_final_message and add_generation_prompt exclude each other"
                )
            text = _cut_after(text, messages[-1].get("content") or "")
        return self.encode(text) if tokenize else text

    def __len__(self) -> int:
        return int(self.llama.n_vocab())

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.llama.detokenize(list(token_ids), special=not skip_special_tokens).decode(
            "utf-8", errors="replace"
        )


def _cut_after(rendered: str, final: str) -> str:
    """``rendered`` up to the end of the last place it holds ``final`` (a template may strip
    a message: then of its stripped text); a template that shows neither is a ValueError."""
    if not final.strip():
        raise ValueError("continue_final_message: the last message has no text to continue")
    for text in (final, final.strip()):
        at = rendered.rfind(text)
        if text and at >= 0:
            return rendered[: at + len(text)]
    raise ValueError(
        "continue_final_message: the chat template does not show the last message's text"
    )


class _LlamaCppCache:
    """One llama.cpp context: a sequence's KV cache, extended and cut back in place."""

    def __init__(self, ctx, batch, n_batch: int, vocab_size: int):
        self._ctx, self._batch, self._n_batch = ctx, batch, n_batch
        self.vocab_size = vocab_size
        self._cached_ids: list[int] = []

    @property
    def cached_token_ids(self) -> Sequence[int]:
        return self._cached_ids

    def forward(self, token_ids: Sequence[int], last_only: bool = False) -> torch.Tensor:
        """One ``llama_decode`` per batch of up to n_batch tokens, logits for every position
        (a verify pass) or only the last (a prefill or a draft step)."""
        assert len(token_ids) > 0, "forward needs at least one token"
        ids = [int(t) for t in token_ids]
        ctx, n_past = self._ctx, len(self._cached_ids)
        ctx.kv_cache_seq_rm(-1, n_past, -1)  # what truncate left in the cache goes now
        rows = []
        for start in range(0, len(ids), self._n_batch):
            chunk = ids[start : start + self._n_batch]
            self._batch.set_batch(batch=chunk, n_past=n_past, logits_all=not last_only)
            ctx.decode(self._batch)
            if not last_only or start + self._n_batch >= len(ids):
                n_out = 1 if last_only else len(chunk)
                logits = np.ctypeslib.as_array(ctx.get_logits(), shape=(n_out * self.vocab_size,))
                rows.append(logits.reshape(n_out, self.vocab_size).copy())
            n_past += len(chunk)
        self._cached_ids.extend(ids)
        self._forwarded(ids, n_past)
        return torch.from_numpy(np.concatenate(rows))

    def _forwarded(self, ids: list[int], n_past: int) -> None:
        pass

    def truncate(self, n: int) -> None:
        assert 0 <= n <= len(self._cached_ids), f"cannot keep {n} of {len(self._cached_ids)}"
        del self._cached_ids[n:]  # the next forward drops the cells beyond n


class LlamaCppModel(_LlamaCppCache):
    """A GGUF model on llama.cpp, one sequence, its KV cache extended and cut back in place.
    ``sequence()`` gives more sequences over the same loaded weights (a server's requests),
    each with a context of its own."""

    def __init__(
        self,
        gguf_path: str | Path,
        n_ctx: int = 8192,
        n_threads: int | None = None,
        tokenizer=None,
        eos_token_ids: Sequence[int] = (),
    ):
        try:
            from llama_cpp import Llama
        except ImportError:
            raise ValueError(
                "the llama.cpp runtime needs llama-cpp-python: pip install -e '.[llamacpp]'"
            ) from None
        threads = n_threads or os.cpu_count() or 1
        # logits_all stays off: forward asks llama.cpp for the rows it needs, batch by batch.
        self.llama = Llama(
            model_path=str(gguf_path),
            n_ctx=n_ctx,
            n_threads=threads,
            n_threads_batch=threads,
            n_batch=512,
            logits_all=False,
            verbose=False,
        )
        super().__init__(
            self.llama._ctx, self.llama._batch, self.llama.n_batch, int(self.llama.n_vocab())
        )
        self.tokenizer = tokenizer or LlamaCppTokenizer(self.llama)
        self.eos_token_ids = frozenset({int(self.llama.token_eos()), *eos_token_ids})
        self.max_length: int | None = n_ctx
        self._free: list = []  # contexts of finished sequences, cleared, for the next ones

    def _forwarded(self, ids: list[int], n_past: int) -> None:
        self.llama.input_ids[n_past - len(ids) : n_past] = ids  # llama-cpp-python's bookkeeping
        self.llama.n_tokens = n_past

    def truncate(self, n: int) -> None:
        super().truncate(n)
        self.llama.n_tokens = n  # llama-cpp-python's own eval drops the rest too

    def sequence(self) -> LlamaCppSequence:
        """A new, empty sequence over these weights with a context (KV cache) of its own,
        made like this model's (same window, threads and batch size); a finished
        sequence's context is reused."""
        return LlamaCppSequence(self)

    def _context(self):
        if self._free:
            return self._free.pop()
        from llama_cpp._internals import LlamaBatch, LlamaContext

        llama = self.llama
        ctx = LlamaContext(model=llama._model, params=llama.context_params, verbose=False)
        batch = LlamaBatch(n_tokens=llama.n_batch, embd=0, n_seq_max=1, verbose=False)
        return ctx, batch


class LlamaCppSequence(_LlamaCppCache):
    """One more sequence of a ``LlamaCppModel``: the same weights, its own context. Its
    logits are what the model's own context gives for the same tokens (the same code and
    settings; tested)."""

    def __init__(self, model: LlamaCppModel):
        self._model = model
        self._owned = model._context()
        ctx, batch = self._owned
        ctx.kv_cache_clear()
        super().__init__(ctx, batch, model._n_batch, model.vocab_size)
        self.tokenizer, self.eos_token_ids = model.tokenizer, model.eos_token_ids
        self.max_length: int | None = model.max_length

    def __del__(self):
        with contextlib.suppress(Exception):  # at interpreter shutdown there is no one to tell
            self._model._free.append(self._owned)  # the context goes back for the next one
