"""Structured output: one request's grammar (``SamplingParams.constraint``), on llguidance.

llguidance (the grammar engine of vLLM, SGLang and llama.cpp's ``--grammar``) over the
target's tokenizer: JSON schemas, any JSON object, regular expressions and Lark grammars.
Chosen over xgrammar and outlines-core because it needs no other package (xgrammar pulls
in triton, a GPU compiler) and its masks cost far below a decoding step on these CPUs:
on the default target's 151,936-token vocabulary, a median 0.018 ms a token (xgrammar
0.004 ms), against a 28-45 ms step (``bench/grammar_mask_cost.py``).

Exactness: every target row that verification reads is masked by the grammar state after
the tokens before it (the context, then the drafts up to that row), so each emitted token
follows the target's distribution restricted to what the grammar allows and renormalised:
the same as plain constrained decoding. A draft the grammar forbids has probability 0
under its masked row, so verification rejects it whatever drafted it; rows after it are
never reached. Drafts need no mask of their own for this (modified rejection sampling is
exact for any draft distribution, given the one each draft was drawn from), but unmasked
they are accepted less often: a drafter that samples through the request's ``Sampler``
(the model, the heads) draws from its rows masked the same way (``DraftMask``), and
verification gets that masked distribution. The state advances by the emitted tokens only:
drafts are tried and rolled back.

Forced tokens: where the grammar allows one token only, ``forced()`` gives it (and the run
after it); proposed as drafts with q = 1 they are certain to be accepted, at no draft cost.
The drafter drafts on after them in the same round (``DraftMask.follow``: its rows masked
from the state after them), so a forced run costs rows of a pass, not a pass of its own;
the draft model reads a run forced inside its chain as guesses (``DraftMask.forced``).
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
import torch

from specdec.config import Constraint
from specdec.detokenizer import token_bytes

# llguidance's tokenizer takes about a second to build from a 150k vocabulary: one per
# tokenizer object and vocabulary size.
_TOKENIZERS: weakref.WeakKeyDictionary[Any, dict[int, Any]] = weakref.WeakKeyDictionary()


def _ll_tokenizer(tokenizer: Any, vocab_size: int, eos_token_ids: Collection[int]) -> Any:
    import llguidance
    import llguidance.hf

    known = _TOKENIZERS.setdefault(tokenizer, {})
    if vocab_size not in known:
        eos = sorted(eos_token_ids) or None
        try:  # a Hugging Face fast tokenizer llguidance reads itself (Qwen, Llama, ...)
            known[vocab_size] = llguidance.hf.from_tokenizer(tokenizer, vocab_size, eos)
        except ValueError:  # any other: each token's bytes, and its encoder
            known[vocab_size] = llguidance.LLTokenizer(
                llguidance.TokenizerWrapper(_Wrapped(tokenizer, vocab_size)), vocab_size, eos
            )
    return known[vocab_size]


def is_special_token(
    tokenizer: Any, vocab_size: int, eos_token_ids: Collection[int], text: str
) -> bool:
    """Whether ``text`` is one token that llguidance reads as special for this tokenizer: a
    Lark grammar must name it as a token (``<tool_call>``), since a quoted ``"<tool_call>"``
    is its characters, which that token does not match when the output consumes it."""
    added: dict[str, int] = getattr(tokenizer, "get_added_vocab", dict)()
    token_id = added.get(text)
    if token_id is None or token_id >= vocab_size:
        return False
    return bool(_ll_tokenizer(tokenizer, vocab_size, eos_token_ids).is_special_token(token_id))


class _Wrapped:
    """A tokenizer as llguidance's ``TokenizerWrapper`` reads one: every token's bytes."""

    def __init__(self, tokenizer: Any, vocab_size: int):
        self.tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_token_id
        self.bos_token_id = getattr(tokenizer, "bos_token_id", None)
        size = min(vocab_size, len(tokenizer))
        self.special_token_ids = [i for i in tokenizer.all_special_ids if i < size]
        self.tokens = [_piece(tokenizer, i) for i in range(size)]

    def __call__(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))


def _piece(tokenizer: Any, token_id: int) -> bytes:
    if token_id in tokenizer.all_special_ids:  # llguidance wants their names
        return str(tokenizer.convert_ids_to_tokens(token_id)).encode()
    return token_bytes(tokenizer, token_id)


def _grammar_text(constraint: Constraint) -> str:
    from llguidance import LLMatcher

    if constraint.kind == "json_object":
        return LLMatcher.grammar_from_json_schema(json.dumps({"type": "object"}))
    if constraint.kind == "json_schema":
        try:
            json.loads(constraint.source)
        except json.JSONDecodeError as error:
            raise ValueError(f"the JSON schema is not JSON: {error}") from None
        return LLMatcher.grammar_from_json_schema(constraint.source)
    if constraint.kind == "regex":
        return LLMatcher.grammar_from_regex(constraint.source)
    return LLMatcher.grammar_from_lark(constraint.source)


def _message(error: object) -> str:
    """llguidance's message on one line, without the dump of the parser's state after it."""
    lines = []
    for line in str(error).strip().splitlines():
        if line.startswith("<state>"):
            break
        lines.append(line.strip())
    return " ".join(" ".join(lines).split())[:300] or "unknown error"


class Grammar:
    """Where one request's output stands in its grammar."""

    def __init__(
        self,
        constraint: Constraint,
        tokenizer: Any,
        vocab_size: int,
        eos_token_ids: Collection[int] = (),
    ):
        from llguidance import LLMatcher

        if tokenizer is None:
            raise ValueError("structured output needs the target's tokenizer")
        self.vocab_size = vocab_size
        ll_tokenizer = _ll_tokenizer(tokenizer, vocab_size, eos_token_ids)
        self.eos = frozenset(eos_token_ids) | frozenset(ll_tokenizer.eos_tokens)
        try:
            text = _grammar_text(constraint)
        except ValueError as error:  # llguidance's own message names what it could not read
            raise ValueError(f"constraint: {_message(error)}") from None
        self.matcher = LLMatcher(ll_tokenizer, text, log_level=0)
        if self.matcher.is_error():
            raise ValueError(f"constraint: {_message(self.matcher.get_error())}")

    def _allowed(self) -> torch.Tensor:
        """What the grammar allows next  # [vocab] bool. Past its end (its last token or
        an EOS drafted) it allows nothing; that row can only score a token after the
        output's end, which ``advance`` cuts, so it is left unmasked."""
        words = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        self._check()
        bits = torch.from_numpy(np.unpackbits(words, bitorder="little")[: self.vocab_size])
        allowed = bits.bool()
        return allowed if bool(allowed.any()) else torch.ones_like(allowed)

    def _check(self) -> None:
        if self.matcher.is_error():  # e.g. a grammar this vocabulary cannot spell
            error = _message(self.matcher.get_error())
            raise ValueError(f"constraint: the grammar cannot go on: {error}")

    def mask(self, draft_ids: Sequence[int], logits: torch.Tensor) -> tuple[int, torch.Tensor]:
        """``logits``  # [len(draft_ids) + 1, vocab] of the context's last token and the
        drafts, masked row by row: how many drafts to verify and their masked rows. Row i
        is masked by the state after ``draft_ids[:i]``. When draft ``j`` is forbidden, the
        drafts after it are dropped (verification rejects ``j`` for sure and never reaches
        them): ``j + 1`` drafts, ``j + 2`` rows (the last, never read, keeps row ``j``'s
        mask). An EOS draft the grammar allows ends the rows the same way: the output ends
        at it (and llguidance cannot roll an EOS back)."""
        rows = [self._allowed()]
        consumed = 0
        for token_id in draft_ids:
            if not rows[-1][token_id] or token_id in self.eos:
                rows.append(rows[-1])
                break
            self.matcher.consume_token(token_id)
            self._check()
            consumed += 1
            rows.append(self._allowed())
        self.matcher.rollback(consumed)
        allowed = torch.stack(rows)
        masked = logits[: len(rows)].float().masked_fill(~allowed, float("-inf"))
        return len(rows) - 1, masked

    def drafts(self, start: int) -> DraftMask:
        """The mask of a round's drafts from sequence position ``start`` (the context's
        length) on (``sampling.Sampler.draft_mask``); ``DraftMask.end`` rolls back what the
        drafts advanced."""
        return DraftMask(self, start)

    def advance(self, token_ids: Sequence[int]) -> int:
        """Follow the emitted tokens (each drawn from a masked row): how many of them the
        output keeps, all but those after the grammar has ended (the row after its end is
        left unmasked: ``_allowed``)."""
        for i, token_id in enumerate(token_ids):
            if self.matcher.is_stopped():
                return i
            self.matcher.consume_token(token_id)
            self._check()  # allowed by its row's mask: refused only where the grammar is stuck
        return len(token_ids)

    def forced(self) -> list[int]:
        """The tokens the grammar allows alone from here on (none where it offers a choice)."""
        return list(self.matcher.compute_ff_tokens())

    def done(self) -> bool:
        """Whether the grammar is complete and allows nothing more."""
        return bool(self.matcher.is_stopped())


class DraftMask:
    """A round's drafts drawn from rows the grammar masks (q = 0 where it forbids): each
    draft is followed as it is drawn, so the next row is masked by the state after it; a
    member of a chain that starts again from the first draft rolls back. A row it cannot
    say anything of (a draft before it not drawn through it, or past the grammar's end or an
    EOS) is left as the drafter gave it. Exact either way: verification uses the very
    distribution each draft was drawn from, masked or not."""

    def __init__(self, grammar: Grammar, start: int):
        self.grammar, self.start = grammar, start
        self.followed = 0  # drafts consumed by the grammar, from ``start``
        self.ended = False  # an EOS or the grammar's end drawn: nothing more to follow
        self._last: torch.Tensor | None = None  # the last mask given, at ``followed``

    def allowed(self, position: int) -> torch.Tensor | None:
        offset = position - self.start
        if 0 <= offset < self.followed:  # drafting again from an earlier draft
            self.grammar.matcher.rollback(self.followed - offset)
            self.followed, self.ended = offset, False
        self._last = None
        if offset != self.followed or self.ended:
            return None
        self._last = self.grammar._allowed()
        return self._last

    def follow(self, token_ids: Sequence[int]) -> None:
        """Follow drafts the grammar gave (its forced tokens) ahead of the drafter's."""
        for token_id in token_ids:
            position = self.start + self.followed
            if self.allowed(position) is None:
                return
            self.picked(position, token_id)

    def forced(self, position: int) -> list[int]:
        """The tokens the grammar forces from sequence ``position`` on, where the drafts
        before it were followed (none otherwise, nor once an EOS or the grammar's end was
        drawn)."""
        if self.ended or position != self.start + self.followed:
            return []
        return self.grammar.forced()

    def picked(self, position: int, token_id: int) -> None:
        last, self._last = self._last, None
        if last is None or position - self.start != self.followed or not bool(last[token_id]):
            return  # not drawn from the mask: nothing to follow
        if token_id in self.grammar.eos:
            self.ended = True  # llguidance cannot roll an EOS back: never consumed
            return
        self.grammar.matcher.consume_token(token_id)
        self.grammar._check()
        self.followed += 1
        self.ended = self.grammar.done()

    def end(self) -> None:
        """Back to the state at ``start``: verification masks from there."""
        if self.followed:
            self.grammar.matcher.rollback(self.followed)
        self.followed, self.ended, self._last = 0, False, None
