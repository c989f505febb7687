"""The most frequent tokens of a corpus, for a trimmed draft vocabulary (``backends/trim.py``).

``specdec vocab build FILES -o FILE --size N`` counts the target tokenizer's tokens over the
files and keeps the N most frequent, plus the special tokens (EOS, chat markers) that any
output may need. The file records the tokenizer and the vocabulary size it was made for, and
is refused for another.

One file ships for each catalog family that has one (``SHIPPED``): a draft of that family on
the int8 or int4 runtime scores it by default (``runtime.draft_vocabulary``). Its corpus is
``bench/draft_vocab_corpus.py``'s.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from importlib import resources
from pathlib import Path

FORMAT = "specdec-vocab/1"
SHIPPED = {"qwen2.5": "qwen2.5.vocab.json"}  # catalog tokenizer family -> file in specdec/data
AUTO, FULL = "auto", "full"  # --draft-vocab's two words: the shipped file where it pays; none


def shipped(family: str) -> str | None:
    """The path of the vocabulary file shipped for tokenizer ``family``, if one is."""
    name = SHIPPED.get(family)
    return None if name is None else str(resources.files("specdec") / "data" / name)


def count_tokens(texts: Iterable[str], tokenizer) -> Counter:
    counts: Counter = Counter()
    for text in texts:
        counts.update(tokenizer.encode(text))
    return counts


def top_tokens(counts: Counter, size: int, always: Iterable[int] = ()) -> list[int]:
    """The ``size`` most frequent ids (ties by id), plus ``always``."""
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    ranked = sorted(counts, key=lambda t: (-counts[t], t))[:size]
    return sorted(set(ranked) | set(always))


def save(path: Path, token_ids: list[int], tokenizer_name: str, vocab_size: int, meta: dict):
    payload = {
        "format": FORMAT,
        "tokenizer": tokenizer_name,
        "vocab_size": vocab_size,
        "token_ids": token_ids,
        **meta,
    }
    path.write_text(json.dumps(payload))


def read(path: str | Path) -> dict:
    """A vocabulary file's contents; ValueError (one line, naming the file) if it is not
    a readable file made by ``specdec vocab build``."""
    try:
        payload = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: not a readable vocabulary file ({error})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"{path}: not made by 'specdec vocab build'")
    return payload


def load(path: str | Path, vocab_size: int) -> list[int]:
    """The token ids of a vocabulary file made for a model with ``vocab_size`` logits."""
    try:
        payload = read(path)
    except ValueError as error:
        raise ValueError(f"--draft-vocab {error}") from None
    if payload.get("vocab_size") != vocab_size:
        raise ValueError(
            f"--draft-vocab {path}: made for a {payload.get('vocab_size')}-token vocabulary, "
            f"this draft has {vocab_size}"
        )
    return [int(t) for t in payload["token_ids"]]
