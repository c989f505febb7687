"""OpenAI's response bodies from a request's chunks: pure functions, no server state."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from specdec.detokenizer import token_bytes
from specdec.drafters.prediction import PREDICTION
from specdec.engine import Chunk
from specdec.logprobs import TokenLogprob
from specdec.metrics import SpecStats
from specdec.server.tools import ToolCall, ToolUse, reply_of


def usage(prompt_tokens: int, choices: list[list[Chunk]]) -> dict:
    """OpenAI's token counts (the completion's summed over its choices), and the request's
    speculation (an extension, as vLLM and SGLang report it per request): drafted and
    accepted tokens, acceptance rate, mean accepted length (tokens a round, the target's own
    included; ``metrics.py`` defines them), over all its choices; and OpenAI's counts of a
    predicted output's tokens accepted and rejected as drafts (0 without one)."""
    completion = sum(len(c.token_ids) for chunks in choices for c in chunks)
    stats = merged_stats(choices)
    predicted = stats.by_drafter.get(PREDICTION, {"drafted": 0, "accepted": 0})
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
        "completion_tokens_details": {
            "accepted_prediction_tokens": predicted["accepted"],
            "rejected_prediction_tokens": predicted["drafted"] - predicted["accepted"],
        },
        "speculation": {
            "drafted_tokens": stats.drafted_tokens,
            "accepted_tokens": stats.accepted_tokens,
            "acceptance_rate": stats.acceptance_rate,
            "mean_accepted_length": stats.mean_accepted_length,
        },
    }


def merged_stats(choices: list[list[Chunk]]) -> SpecStats:
    """The request's stats: its one choice's, or every counter summed over its choices."""
    if len(choices) == 1:
        return choices[0][-1].stats
    return SpecStats.merged([chunks[-1].stats for chunks in choices])


def best(choices: list[list[Chunk]], n: int, keep_logprobs: bool) -> list[list[Chunk]]:
    """``best_of``: the ``n`` completions with the highest mean log-probability per token
    (OpenAI's "best"; the raw model's values, ``logprobs.py``), best first, an earlier one
    first on a tie and one with no tokens last; their logprobs dropped unless the request
    asked for them (they were taken to rank)."""

    def mean(chunks: list[Chunk]) -> float:
        values = [e.logprob for c in chunks for e in c.logprobs or []]
        return sum(values) / len(values) if values else -math.inf

    ranked = sorted(choices, key=mean, reverse=True)[:n]  # sorted is stable
    if keep_logprobs:
        return ranked
    return [[replace(chunk, logprobs=None) for chunk in chunks] for chunks in ranked]


def spec_stats(choices: list[list[Chunk]]) -> dict:
    """The ``spec_stats`` extension: ``SpecStats.to_dict`` of ``merged_stats``."""
    return merged_stats(choices).to_dict()


class TokenText:
    """A token's text and UTF-8 bytes as OpenAI's logprobs show them, remembered."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self._known: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        if token_id not in self._known:
            raw = token_bytes(self.tokenizer, token_id)
            self._known[token_id] = (raw.decode("utf-8", errors="replace"), list(raw))
        return self._known[token_id]


def chat_logprobs(entries: list[TokenLogprob], text_of: TokenText) -> dict:
    """Chat's ``logprobs``: ``{"content": [{token, logprob, bytes, top_logprobs}]}``."""

    def one(token_id: int, logprob: float) -> dict:
        text, raw = text_of(token_id)
        return {"token": text, "logprob": logprob, "bytes": raw}

    content = [
        one(e.token_id, e.logprob) | {"top_logprobs": [one(t, lp) for t, lp in e.top]}
        for e in entries
    ]
    return {"content": content, "refusal": None}


@dataclass(frozen=True)
class Echo:
    """A prompt each choice of a completion repeats before its text (``echo``): its text,
    its first token (the one with no log-probability: null in the lists) and, with
    ``logprobs``, its ``prompt_logprobs`` (scored once, by the first choice)."""

    text: str
    first_id: int
    scored: Sequence[TokenLogprob | None] | None = None

    def entries(self) -> list[Position] | None:
        """The prompt's positions for ``logprobs`` (None: none asked for)."""
        if self.scored is None:
            return None
        return [(self.first_id, None)] + [(e.token_id, e) for e in self.scored[1:] if e is not None]


def prompt_only(chunk: Chunk) -> Chunk:
    """A scoring request's one chunk (``echo`` with ``max_tokens`` 0) without the token its
    prompt's pass gave: nothing generated, the output cut at its length."""
    return replace(
        chunk,
        token_ids=[],
        text="",
        num_from_draft=0,
        rejected_ids=[],
        finish_reason="length",
        stats=replace(chunk.stats, generated_tokens=0),
        logprobs=None if chunk.logprobs is None else [],
    )


# One prompt's ``prompt_logprobs`` (the first None), as the engine gives them.
Scored = Sequence[TokenLogprob | None]


def vllm_prompt_logprobs(scored: Scored, text_of: TokenText) -> list[dict | None]:
    """vLLM's ``prompt_logprobs``: for each prompt token, null (the first) or {token id:
    {logprob, rank, decoded_token}} for the token itself, then the most likely ones."""

    def one(token_id: int, logprob: float, rank: int | None) -> dict:
        return {"logprob": logprob, "rank": rank, "decoded_token": text_of(token_id)[0]}

    out: list[dict | None] = []
    for entry in scored:
        if entry is None:
            out.append(None)
            continue
        values = {str(entry.token_id): one(entry.token_id, entry.logprob, entry.rank)}
        for place, (token_id, logprob) in enumerate(entry.top, start=1):
            values.setdefault(str(token_id), one(token_id, logprob, place))
        out.append(values)
    return out


# A token of completions' logprobs: its id and values, None for an echoed prompt's first.
Position = tuple[int, TokenLogprob | None]


def completion_logprobs(
    entries: Sequence[TokenLogprob],
    text_of: TokenText,
    offset: int,
    echoed: Sequence[Position] = (),
) -> dict:
    """Completions' ``logprobs``: parallel lists of tokens, their log-probabilities, the
    top tokens of each position and each token's offset in the text (from ``offset``);
    an ``echoed`` prompt's positions before ``entries``."""
    positions: list[Position] = [*echoed, *((e.token_id, e) for e in entries)]
    tokens = [text_of(token_id)[0] for token_id, _ in positions]
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": [None if e is None else e.logprob for _, e in positions],
        "top_logprobs": [
            None if e is None else {text_of(t)[0]: lp for t, lp in e.top} for _, e in positions
        ],
        "text_offset": offsets,
    }


def completion_body(
    choices: list[list[Chunk]],
    prompt_tokens: int,
    response_id: str,
    model_name: str,
    chat: bool,
    replica: str | None,
    text_of: TokenText,
    use: ToolUse | None = None,
    echoes: Sequence[Echo | None] = (),
    made: list[list[Chunk]] | None = None,
    prompt_scores: Sequence[Scored | None] = (),
    role: str = "assistant",
) -> dict:
    """A whole completion (``chat.completion`` or ``text_completion``), one choice per
    chunk list, with ``usage`` (and its speculation) and the ``spec_stats`` extension;
    ``logprobs`` when asked for. With tools (``use``), the calls in a reply are its
    ``tool_calls`` (the text before them its content; ``tools.reply_of``) and a reply that
    ended finishes with "tool_calls". ``echoes``: the prompt each choice's text and logprobs
    begin with (``echo``; None, or none given: no echo). ``made``: every completion made,
    where ``best_of`` returns some (the usage and stats count them all, as OpenAI bills
    them). ``prompt_scores``: each choice's prompt's ``prompt_logprobs`` where the request
    asked for them (vLLM's extension: on each choice of a completion, on a chat
    completion itself). ``role``: a chat reply's (``ChatCompletionRequest.reply_role``)."""
    body: dict[str, Any] = {
        "id": response_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": [
            _choice(index, chunks, chat, text_of, use, echoes[index] if echoes else None, role)
            for index, chunks in enumerate(choices)
        ],
        "usage": usage(prompt_tokens, made or choices),
        "spec_stats": spec_stats(made or choices),
        "system_fingerprint": replica,
    }
    shown = [None if s is None else vllm_prompt_logprobs(s, text_of) for s in prompt_scores]
    if shown and chat:  # one conversation
        body["prompt_logprobs"] = shown[0]
    elif shown:
        for choice, values in zip(body["choices"], shown, strict=True):
            choice["prompt_logprobs"] = values
    return body


def _choice(
    index: int,
    chunks: list[Chunk],
    chat: bool,
    text_of: TokenText,
    use: ToolUse | None,
    echo: Echo | None,
    role: str = "assistant",
) -> dict:
    text = "".join(c.text for c in chunks)
    finish = chunks[-1].finish_reason or "length"
    entries = None if chunks[0].logprobs is None else [e for c in chunks for e in c.logprobs or []]
    if chat:  # an echo (no tools with it) begins the content; its tokens have no logprobs
        logprobs = None if entries is None else chat_logprobs(entries, text_of)
        content = text if echo is None else echo.text + text
        message: dict[str, Any] = {"role": role, "content": content}
        reply, finish = reply_of(text, use, finish)
        if reply is not None:
            message = {
                "role": "assistant",
                "content": reply.content,
                "tool_calls": [call.to_dict() for call in reply.calls],
            }
        return {"index": index, "message": message, "finish_reason": finish, "logprobs": logprobs}
    echoed = None if echo is None else echo.entries()
    logprobs = None
    if entries is not None:
        logprobs = completion_logprobs(entries, text_of, 0, echoed or ())
    text = text if echo is None else echo.text + text
    return {"index": index, "text": text, "finish_reason": finish, "logprobs": logprobs}


class StreamEvents:
    """The server-sent events of one streamed completion, all with one id and time."""

    def __init__(
        self,
        response_id: str,
        model_name: str,
        chat: bool,
        replica: str | None,
        text_of: TokenText,
        echoes: Sequence[Echo | None] = (),
        usage_apart: bool = False,
        running_usage: Sequence[int] | None = None,
        role: str = "assistant",
    ):
        """``echoes``: the prompt each choice repeats first (``echo``; None: none).
        ``usage_apart``: OpenAI's ``stream_options.include_usage``: every event has
        ``usage`` null, and the usage comes in an event of its own, with no choices, last
        (``usage``); without it the usage rides on the last choice's finish.
        ``running_usage``: each choice's prompt tokens, for vLLM's
        ``stream_options.continuous_usage_stats`` (with ``usage_apart``): a choice's every
        event carries its own counts so far (``count`` adds its tokens as they come).
        ``role``: a chat reply's, told in its first delta."""
        self.response_id, self.model_name, self.chat = response_id, model_name, chat
        self.replica, self.created = replica, int(time.time())
        self.text_of, self.echoes = text_of, list(echoes)
        self.usage_apart = usage_apart
        self.running_usage = None if running_usage is None else list(running_usage)
        self.made: dict[int, int] = {}  # each choice's completion tokens so far
        self.role = role
        # of each choice's next token's text in its completion (completions' logprobs)
        self.offsets: dict[int, int] = {}

    def event(
        self,
        text: str | None,
        finish: str | None,
        first_delta: bool = False,
        extra: dict | None = None,
        entries: list[TokenLogprob] | None = None,
        index: int = 0,
    ) -> str:
        """One ``data:`` event of choice ``index``: a delta of ``text`` (a chat stream's
        first one also says the role), the ``logprobs`` of its tokens (``entries``),
        ``finish`` on its last, with ``extra`` fields (usage, spec_stats)."""
        if self.chat:
            delta = {"role": self.role, "content": ""} if first_delta else {}
            delta |= {"content": text} if text else {}
            logprobs = None if entries is None else chat_logprobs(entries, self.text_of)
            choice = {"index": index, "delta": delta, "finish_reason": finish}
        else:
            logprobs = None
            if entries is not None:
                offset = self.offsets.get(index, 0)
                logprobs = completion_logprobs(entries, self.text_of, offset)
                self.offsets[index] = offset + sum(len(token) for token in logprobs["tokens"])
            choice = {"index": index, "text": text or "", "finish_reason": finish}
        return self._data(choice | {"logprobs": logprobs}, extra)

    def echoed(self, index: int = 0) -> str:
        """Choice ``index``'s echoed prompt (before its first delta), and its tokens'
        logprobs where asked for."""
        echo = self.echo_of(index)
        assert echo is not None, "an echoing completion"
        if self.chat:  # the last message's text, without logprobs
            return self._data(
                {"index": index, "delta": {"content": echo.text}, "finish_reason": None}
            )
        logprobs = None
        echoed = echo.entries()
        if echoed is not None:
            logprobs = completion_logprobs([], self.text_of, 0, echoed)
            self.offsets[index] = sum(len(token) for token in logprobs["tokens"])
        choice = {"index": index, "text": echo.text, "finish_reason": None}
        return self._data(choice | {"logprobs": logprobs})

    def echo_of(self, index: int) -> Echo | None:
        """The prompt choice ``index`` repeats first, if any."""
        return self.echoes[index] if self.echoes else None

    def calls(self, calls: tuple[ToolCall, ...], index: int = 0) -> str:
        """A chat stream's delta of choice ``index``'s whole tool calls (OpenAI's shape,
        each with its index)."""
        deltas = [{"index": i} | call.to_dict() for i, call in enumerate(calls)]
        return self._data({"index": index, "delta": {"tool_calls": deltas}, "finish_reason": None})

    def count(self, index: int, tokens: int) -> None:
        """Choice ``index`` made ``tokens`` more (``running_usage``'s counts)."""
        self.made[index] = self.made.get(index, 0) + tokens

    def usage(self, extra: dict) -> str:
        """With ``usage_apart``, the stream's last event: no choices, the usage (and the
        other ``extra`` fields)."""
        return self._data(None, extra)

    def _data(self, choice: dict | None, extra: dict | None = None) -> str:
        usage: dict[str, dict | None] = {"usage": None} if self.usage_apart else {}
        if self.running_usage is not None and choice is not None:
            prompt, made = self.running_usage[choice["index"]], self.made.get(choice["index"], 0)
            usage["usage"] = {
                "prompt_tokens": prompt,
                "completion_tokens": made,
                "total_tokens": prompt + made,
            }
        payload = {
            "id": self.response_id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model_name,
            "choices": [] if choice is None else [choice],
            "system_fingerprint": self.replica,
            **usage,
            **(extra or {}),
        }
        return f"data: {json.dumps(payload)}\n\n"


def error_event(body: dict) -> str:
    return f"data: {json.dumps(body)}\n\n"


DONE = "data: [DONE]\n\n"
