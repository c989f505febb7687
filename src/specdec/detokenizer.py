"""Incremental text for a stream of token ids, with stop strings.

Text that might still change is held back: a trailing U+FFFD (a multi-byte character
split across tokens) and a suffix that could be the start of a stop string.
"""

from __future__ import annotations

from typing import Any

_INCOMPLETE = "\ufffd"


class Detokenizer:
    def __init__(
        self,
        tokenizer: Any | None,
        stop: tuple[str, ...] = (),
        stop_token_ids: tuple[int, ...] = (),
        min_tokens: int = 0,
    ):
        """``stop_token_ids``: tokens that end an output and stand for no text there (as
        EOS, a special token, does). ``min_tokens``: a stop string ends the output only
        where it ends past the text of the first ``min_tokens`` tokens (vLLM's rule)."""
        if stop and tokenizer is None:
            raise ValueError("stop strings need a tokenizer: pass one to the target backend")
        self.tokenizer = tokenizer
        self.stop = stop
        self.stop_token_ids = frozenset(stop_token_ids)
        self.min_tokens = min_tokens
        self._floor: int | None = None  # the first min_tokens tokens' text length, once known
        self.emitted_chars = 0

    def decode(self, token_ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        if token_ids and token_ids[-1] in self.stop_token_ids:  # only the last can be one
            token_ids = token_ids[:-1]
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def update(self, token_ids: list[int], num_new: int) -> tuple[int, str, bool]:
        """``token_ids``: all generated ids, the last ``num_new`` of them new.

        Returns (how many ids to keep, text to emit now, whether a stop string ended it).
        """
        text = self.decode(token_ids)
        stop_at = self._find_stop(text, token_ids)
        if stop_at is not None:
            keep = self._tokens_through_stop(token_ids, num_new)
            return keep, self._emit(text[:stop_at]), True
        return len(token_ids), self._emit(text[: self._visible_end(text)]), False

    def flush(self, token_ids: list[int]) -> str:
        """Everything not yet emitted, at the end of the output."""
        return self._emit(self.decode(token_ids))

    def _emit(self, visible: str) -> str:
        delta = visible[self.emitted_chars :]
        self.emitted_chars = max(self.emitted_chars, len(visible))
        return delta

    def _find_stop(self, text: str, token_ids: list[int]) -> int | None:
        """Where the first stop string in ``text`` (of ``token_ids``) begins, of those that
        end past the first ``min_tokens`` tokens' text."""
        if not self.stop or len(token_ids) <= self.min_tokens:
            return None
        if self._floor is None:  # those tokens stay what they are once written
            self._floor = len(self.decode(token_ids[: self.min_tokens])) if self.min_tokens else 0
        floor = self._floor
        found = (text.find(s, max(floor - len(s) + 1, 0)) for s in self.stop)
        hits = [pos for pos in found if pos >= 0]
        return min(hits) if hits else None

    def _tokens_through_stop(self, token_ids: list[int], num_new: int) -> int:
        """The fewest ids whose text already contains a stop string."""
        for keep in range(len(token_ids) - num_new + 1, len(token_ids) + 1):
            prefix = token_ids[:keep]
            if self._find_stop(self.decode(prefix), prefix) is not None:
                return keep
        return len(token_ids)

    def _visible_end(self, text: str) -> int:
        end = len(text.rstrip(_INCOMPLETE))
        hold = 0
        for stop in self.stop:
            # The longest proper prefix of a stop string that ends the text may yet complete it.
            for length in range(min(len(stop) - 1, end), hold, -1):
                if text[end - length : end] == stop[:length]:
                    hold = length
                    break
        return end - hold


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, character -> byte: printable bytes stand for
    themselves, the others for the characters from U+0100 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b], extra = chr(256 + extra), extra + 1
    return {char: b for b, char in chars.items()}


_BYTE_LEVEL = _byte_level_alphabet()


def token_bytes(tokenizer: Any, token_id: int) -> bytes:
    """The UTF-8 bytes one token stands for, as OpenAI's logprobs give them: a byte-level
    BPE token (Qwen, Llama 3, GPT-2) may be part of a character, which its decoded text
    cannot show; any other token is its decoded text. A special token (EOS) stands for
    nothing, as in the output's text."""
    if token_id in getattr(tokenizer, "all_special_ids", ()):
        return b""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if type(getattr(backend, "decoder", None)).__name__ == "ByteLevel":
        piece = tokenizer.convert_ids_to_tokens(token_id)
        if isinstance(piece, str) and all(char in _BYTE_LEVEL for char in piece):
            return bytes(_BYTE_LEVEL[char] for char in piece)
    return tokenizer.decode([token_id]).encode("utf-8")
