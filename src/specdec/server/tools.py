"""Tool calls (OpenAI's ``tools``): the grammar of the calls a request requires, the calls
read back from the model's text, and a stream's text held where a call may begin
(``HeldText``). No server state.

The model's chat template shows it the functions and the form of a call. Qwen2.5's, like
Hermes's (and vLLM's ``hermes`` parser, which reads them), is a JSON object between tags::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

``tool_choice`` "auto": the model writes text, calls or both as it likes, and the calls are
read from its text when it ends (``read_calls``: tagged calls, or a reply that is nothing but
a call's JSON, bare or in a json fence, as the 1.5B default target writes them; text that is
not a well-formed call of an offered function stays text). "required", or one function
named: the output is constrained (an llguidance Lark grammar, ``call_grammar``) to one call
or more, each a JSON object whose ``name`` is an offered function's and whose ``arguments``
follow that function's ``parameters`` schema. The grammar lays the JSON out on one line as
above, so the tags, the keys and a named function's name are forced tokens: free drafts,
accepted with certainty. Exactness is structured output's (``grammar.py``): the calls
follow the target's distribution restricted to what the grammar allows, with speculation or
without.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from specdec.config import Constraint
from specdec.grammar import is_special_token

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"

# JSON on one line with ", " and ": " (Qwen's and Hermes's layout): llguidance's options
COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

FENCE = "```json"
_BARE_STARTS = (CALL_OPEN, FENCE, "{", "[")  # how a reply that is nothing but calls begins

_CALL = re.compile(re.escape(CALL_OPEN) + r"(.*?)(?:" + re.escape(CALL_CLOSE) + r"|\Z)", re.S)


@dataclass(frozen=True)
class Function:
    """A function the request offers: its name and its parameters' JSON schema."""

    name: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ToolUse:
    """What a request lets the model do with its tools: the ``functions`` it may call,
    whether it must (tool_choice "required" or one named), one call or several."""

    functions: tuple[Function, ...]
    required: bool
    parallel: bool

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.functions)

    def grammar(self, tag_tokens: bool) -> Constraint | None:
        """The output's constraint where calls are required (``call_grammar``)."""
        return call_grammar(self.functions, self.parallel, tag_tokens) if self.required else None


@dataclass(frozen=True)
class ToolCall:
    """A call the model made: OpenAI's ``tool_calls`` entry (``arguments`` is JSON text)."""

    id: str
    name: str
    arguments: str

    def to_dict(self) -> dict:
        function = {"name": self.name, "arguments": self.arguments}
        return {"id": self.id, "type": "function", "function": function}


@dataclass(frozen=True)
class Reply:
    """A reply read for calls: the text before the first call (None if there is none), the
    calls, in order."""

    content: str | None
    calls: tuple[ToolCall, ...]


def call_schema(functions: Sequence[Function]) -> dict:
    """The JSON schema of one call of any of ``functions``."""
    options = [
        {
            "type": "object",
            "properties": {"name": {"const": f.name}, "arguments": f.parameters},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for f in functions
    ]
    one = options[0] if len(options) == 1 else {"anyOf": options}
    return one | {"x-guidance": COMPACT}


def call_grammar(functions: Sequence[Function], parallel: bool, tag_tokens: bool) -> Constraint:
    """The output a request with ``tool_choice`` "required" (or one named function) must
    follow: one call (``parallel`` False) or more, one a line, then the end.
    ``tag_tokens``: the tags are special tokens of the tokenizer (Qwen's), which the grammar
    names as tokens (``grammar.is_special_token``); otherwise it spells them out."""
    if not functions:
        raise ValueError("tool_choice needs at least one function in tools")
    open_tag, close_tag = (
        (CALL_OPEN, CALL_CLOSE) if tag_tokens else (json.dumps(CALL_OPEN), json.dumps(CALL_CLOSE))
    )
    calls = 'call ("\\n" call)*' if parallel else "call"
    return Constraint(
        "lark",
        f"start: {calls}\n"
        f'call: {open_tag} "\\n" body "\\n" {close_tag}\n'
        f"body: %json {json.dumps(call_schema(functions))}\n",
    )


def tags_are_tokens(tokenizer: Any, vocab_size: int, eos_token_ids: Collection[int]) -> bool:
    """Whether both tags are special tokens of the tokenizer (``call_grammar``'s
    ``tag_tokens``; the first ask builds llguidance's form of the tokenizer, about a second
    for Qwen's)."""
    return all(
        is_special_token(tokenizer, vocab_size, eos_token_ids, tag)
        for tag in (CALL_OPEN, CALL_CLOSE)
    )


def reply_of(text: str, use: ToolUse | None, finish: str) -> tuple[Reply | None, str]:
    """A whole reply's calls (None: it is text) and its finish reason: "tool_calls" where
    it ended ("stop") with calls; a reply cut at max_tokens keeps "length" and its closed
    calls (``read_calls``)."""
    reply = read_calls(text, use.names, ended=finish == "stop") if use is not None else None
    return reply, "tool_calls" if reply is not None and finish == "stop" else finish


def read_calls(text: str, names: Sequence[str], ended: bool = True) -> Reply | None:
    """The calls in ``text``, or None where there are none or one is not a JSON object with
    a ``name`` among ``names`` and ``arguments`` an object: then the text is the reply, as
    vLLM's hermes parser leaves it. Calls are ``CALL_OPEN`` JSON ``CALL_CLOSE``; in a reply
    that ``ended`` (not cut at max_tokens) the last close tag may be missing, and a reply
    that is nothing but a call's JSON (or a list of them, bare or in a json code fence, as
    small models write them) is read too. A cut reply's unclosed last call is left out."""
    start = text.find(CALL_OPEN)
    if start < 0:
        calls = _bare_calls(text, names) if ended else None
        return Reply(None, calls) if calls else None
    read = []
    for match in _CALL.finditer(text, start):
        if match.group(0).endswith(CALL_CLOSE) or ended:
            read.append(_json(match.group(1)))
    calls = _calls(read, names)
    before = text[:start]
    return Reply(before if before.strip() else None, calls) if calls else None


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _bare_calls(text: str, names: Sequence[str]) -> tuple[ToolCall, ...] | None:
    body = text.strip()
    if body.startswith(FENCE) and body.endswith("```"):
        body = body[len(FENCE) : -3]
    found = _json(body)
    return _calls(found if isinstance(found, list) else [found], names)


def _calls(found: list[Any], names: Sequence[str]) -> tuple[ToolCall, ...] | None:
    """``found`` (parsed JSON values) as calls, or None unless every one is a call."""
    calls = []
    for call in found:
        if (
            not isinstance(call, dict)
            or call.get("name") not in names
            or not isinstance(call.get("arguments", {}), dict)
        ):
            return None
        arguments = json.dumps(call.get("arguments", {}), ensure_ascii=False)
        calls.append(ToolCall(f"call_{uuid.uuid4().hex[:24]}", call["name"], arguments))
    return tuple(calls) or None


class HeldText:
    """A streamed reply that may call tools: its text goes out as it comes, up to where a
    call may begin (``CALL_OPEN``, or what could be its start); from there on it is held, to
    be read as calls when the reply ends (``read_calls``). A reply that begins as a bare
    call may (``{``, ``[`` or a json fence) is held from its start."""

    def __init__(self) -> None:
        self.held = ""
        self.calling = False  # a call may have begun: everything from there is held
        self.sent = False  # some text went out

    def feed(self, text: str) -> str:
        """The part of ``text`` (after what was held) that can go out now as text."""
        if self.calling:
            self.held += text
            return ""
        text = self.held + text
        head = text.lstrip()
        if not self.sent and any(head.startswith(s) for s in _BARE_STARTS):
            self.calling, self.held = True, text
            return ""
        if not self.sent and any(s.startswith(head) for s in _BARE_STARTS):
            self.held = text  # too early to say
            return ""
        at = text.find(CALL_OPEN)
        if at >= 0:
            self.calling, self.held = True, text[at:]
            return self._send(text[:at])
        longest = min(len(text), len(CALL_OPEN) - 1)
        keep = next((n for n in range(longest, 0, -1) if text.endswith(CALL_OPEN[:n])), 0)
        self.held = text[len(text) - keep :]
        return self._send(text[: len(text) - keep])

    def _send(self, text: str) -> str:
        self.sent = self.sent or bool(text)
        return text
