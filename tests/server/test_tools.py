"""Tool calls (``tools``, ``tool_choice``; ``server/tools.py``): the calls read from a reply
by hand, streamed text held where a call may begin, and a real server whose tokenizer spells
the call tags as tokens of their own (as Qwen's does), through the openai client on each
runtime: a required call is well formed, the same with speculation and without, streamed
and not, its tags and keys free drafts."""

from __future__ import annotations

import json

import openai
import pytest

from helpers import perturbed_copy, tiny_llama
from servers import MODEL, Running, post
from specdec.backends.quant.convert import make_int4_batch_invariant, make_int8_batch_invariant
from specdec.config import Constraint
from specdec.grammar import Grammar, is_special_token
from specdec.server.tools import (
    CALL_CLOSE,
    CALL_OPEN,
    Function,
    HeldText,
    ToolUse,
    call_grammar,
    read_calls,
)

CHARS = 'abcdefghijklmnopqrstuvwxyz .,\n!{}[]":_'
TEMPLATE = (
    "{% if tools %}tools:{% for t in tools %} {{ t.function.name }}{% endfor %}\n{% endif %}"
    "{% for m in messages %}{{ m.role }}: {{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}"
    "\n{% endfor %}assistant:"
)
UNIT = {
    "type": "object",
    "properties": {"unit": {"enum": ["celsius", "kelvin"]}},
    "required": ["unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "weather", "parameters": UNIT}},
    {"type": "function", "function": {"name": "time", "description": "the time now"}},
]
ASK = [{"role": "user", "content": "what is the weather, in celsius"}]


def tool_tokenizer():
    """Characters, <eos> = 0, and the two tags as tokens of their own; a template that
    shows the tools' names and earlier calls."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<eos>": 0, **{c: i + 1 for i, c in enumerate(CHARS)}}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")
    tokenizer.add_tokens([CALL_OPEN, CALL_CLOSE])
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def weather_call(unit: str) -> str:
    return f'{CALL_OPEN}\n{{"name": "weather", "arguments": {{"unit": "{unit}"}}}}\n{CALL_CLOSE}'


# ---- reading calls, by hand


def test_calls_are_read_from_their_tags_and_the_text_before_is_the_content():
    text = "Let me look.\n" + weather_call("celsius") + "\n" + weather_call("kelvin")
    reply = read_calls(text, ["weather"])
    assert reply is not None and reply.content == "Let me look.\n"
    assert [(c.name, json.loads(c.arguments)) for c in reply.calls] == [
        ("weather", {"unit": "celsius"}),
        ("weather", {"unit": "kelvin"}),
    ]
    assert len({c.id for c in reply.calls}) == 2 and reply.calls[0].id.startswith("call_")


@pytest.mark.parametrize(
    "text",
    [
        "no call here",
        CALL_OPEN + '{"name": "weather", "arguments": {"unit": ' + CALL_CLOSE,  # not JSON
        CALL_OPEN + '{"name": "rain", "arguments": {}}' + CALL_CLOSE,  # not offered
        CALL_OPEN + '{"name": "weather", "arguments": "celsius"}' + CALL_CLOSE,  # not an object
        CALL_OPEN + '["weather"]' + CALL_CLOSE,
        '{"name": "weather", "arguments": {}} and more',
    ],
)
def test_text_that_is_not_a_well_formed_call_of_an_offered_function_stays_text(text):
    assert read_calls(text, ["weather"]) is None


def test_a_reply_that_is_only_a_calls_json_is_read_bare_or_fenced():
    bare = '{"name": "weather", "arguments": {"unit": "kelvin"}}'
    for text in (bare, f"```json\n{bare}\n```\n", f"[{bare}, {bare}]"):
        reply = read_calls(text, ["weather"])
        assert reply is not None and reply.content is None
        assert {c.arguments for c in reply.calls} == {'{"unit": "kelvin"}'}
    assert read_calls(bare, ["weather"], ended=False) is None


def test_a_cut_reply_keeps_its_closed_calls_and_an_ended_one_its_unclosed_last():
    text = weather_call("celsius") + "\n" + CALL_OPEN + '\n{"name": "weather", "arguments": {}}'
    cut = read_calls(text, ["weather"], ended=False)
    assert cut is not None and [json.loads(c.arguments) for c in cut.calls] == [{"unit": "celsius"}]
    ended = read_calls(text, ["weather"], ended=True)
    assert ended is not None and len(ended.calls) == 2
    assert read_calls(CALL_OPEN + '{"name": "weather"', ["weather"], ended=False) is None


@pytest.mark.parametrize(
    "pieces, sent, held",
    [
        (["Hello", " there"], "Hello there", ""),
        (["Hi <to", "ol_call>{x"], "Hi ", "<tool_call>{x"),
        (["Hi <to", "p>"], "Hi <top>", ""),
        (["  ", '{"name"', "..."], "", '  {"name"...'),
        (["```js", "on\n{"], "", "```json\n{"),
        (["```py", "thon\n"], "```python\n", ""),
        (["ok", " {not a call}"], "ok {not a call}", ""),
    ],
)
def test_streamed_text_is_held_from_where_a_call_may_begin(pieces, sent, held):
    stream = HeldText()
    assert "".join(stream.feed(p) for p in pieces) == sent
    assert stream.held == held


def stream_events(pieces: list[str], finish: str = "stop") -> tuple[str, list, str]:
    """(content, tool calls, finish reason) that ``Service.stream`` sends for a reply whose
    rounds emitted ``pieces``, with both functions offered."""
    import asyncio
    import types

    from specdec.engine import Chunk
    from specdec.metrics import SpecStats
    from specdec.server import responses
    from specdec.server.guard import Limits
    from specdec.server.metrics import ServerMetrics
    from specdec.server.service import Service

    scheduler = types.SimpleNamespace(tokenizer=tool_tokenizer(), cancel=lambda job: None)
    service = Service(scheduler, MODEL, 3, "model", 16, Limits(), ServerMetrics(None), None)
    use = ToolUse((Function("weather", UNIT), Function("time", {})), False, True)
    chunks = [
        Chunk([1], text, 0, [], "target", finish if i == len(pieces) - 1 else None, SpecStats())
        for i, text in enumerate(pieces)
    ]

    async def run() -> list[str]:
        job = types.SimpleNamespace(queue=asyncio.Queue(), prompt_ids=[1], submitted=0.0)
        for chunk in chunks[1:]:
            job.queue.put_nowait(chunk)
        events = responses.StreamEvents("id", MODEL, True, None, service.text_of)
        stream = service.stream([job], [chunks[0]], 0.0, events, 1, use)
        return [event async for event in stream]

    content, calls, finish_reason = "", [], None
    for event in asyncio.run(run()):
        if event.startswith("data: {"):
            choice = json.loads(event[len("data: ") :])["choices"][0]
            content += choice["delta"].get("content") or ""
            calls += choice["delta"].get("tool_calls") or []
            finish_reason = choice["finish_reason"] or finish_reason
    return content, calls, finish_reason


@pytest.mark.parametrize(
    "pieces, finish, content, names, finish_reason",
    [
        (
            ["  ", '{"name": "weather", ', '"arguments": {"unit": "kelvin"}}'],
            "stop",
            "",
            ["weather"],
            "tool_calls",
        ),
        (
            ["Sure. <to", "ol_call>\n", '{"name": "time"}\n</tool_call>'],
            "stop",
            "Sure. ",
            ["time"],
            "tool_calls",
        ),
        (["{not", " a call}"], "stop", "{not a call}", [], "stop"),
        (
            ["Hi <to", "ol_call>\n", '{"name": "time"}'],
            "length",
            'Hi <tool_call>\n{"name": "time"}',
            [],
            "length",
        ),
        (["plain", " words <"], "stop", "plain words <", [], "stop"),
    ],
)
def test_a_streamed_reply_sends_its_calls_at_the_end_and_held_text_that_is_none(
    pieces, finish, content, names, finish_reason
):
    got_content, calls, got_finish = stream_events(pieces, finish)
    assert (got_content, got_finish) == (content, finish_reason)
    assert [c["function"]["name"] for c in calls] == names
    assert [c["index"] for c in calls] == list(range(len(names)))


def test_the_calls_grammar_forces_the_tags_the_keys_and_a_named_function():
    """With JSON on one line, everything up to the argument's value is forced; one call
    (not parallel), then only the end. The tags are tokens here, but not special ones: the
    grammar spells them out, and llguidance reads the tokens as their text."""
    tokenizer = tool_tokenizer()
    assert not is_special_token(tokenizer, len(tokenizer), [0], CALL_OPEN)
    functions = (Function("weather", UNIT),)
    grammar = Grammar(call_grammar(functions, False, False), tokenizer, len(tokenizer), [0])
    forced = tokenizer.decode(grammar.forced())
    assert forced == f'{CALL_OPEN}\n{{"name": "weather", "arguments": {{"unit": "'
    grammar.advance(grammar.forced())
    grammar.advance(tokenizer.encode("kelvin"))
    assert tokenizer.decode(grammar.forced()) == f'"}}}}\n{CALL_CLOSE}'
    grammar.advance(grammar.forced())
    assert grammar.done() or grammar._allowed()[0] and int(grammar._allowed().sum()) == 1


def test_the_calls_grammar_spells_the_tags_as_text_where_they_are_not_tokens():
    constraint = call_grammar((Function("weather", UNIT),), True, False)
    assert constraint == Constraint("lark", constraint.source)
    assert '"<tool_call>"' in constraint.source and 'call ("\\n" call)*' in constraint.source
    use = ToolUse((Function("weather", UNIT),), required=False, parallel=True)
    assert use.grammar(True) is None and use.names == ("weather",)


# ---- a real server


@pytest.fixture(scope="module", params=["float32", "int8", "int4"])
def server(request):
    tokenizer = tool_tokenizer()
    target = tiny_llama(seed=3, vocab=len(tokenizer))
    draft = perturbed_copy(target, noise=0.03, seed=4)
    if request.param == "int8":
        target, draft = make_int8_batch_invariant(target), make_int8_batch_invariant(draft)
    if request.param == "int4":
        target, draft = make_int4_batch_invariant(target), make_int4_batch_invariant(draft)
    running = Running(target, draft, tokenizer, max_active=4, max_queue=32)
    yield running
    running.close()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def ask(client, num_speculative_tokens=4, **fields):
    fields = {"model": MODEL, "messages": ASK, "max_tokens": 60, "temperature": 0} | fields
    extra = {"num_speculative_tokens": num_speculative_tokens}
    return client.chat.completions.create(extra_body=extra, **fields)


def streamed(client, **fields) -> tuple[str, list, str]:
    """(content, tool calls, finish reason) of a streamed reply, its deltas put together."""
    content, calls, finish = "", [], None
    for event in ask(client, stream=True, **fields):
        choice = event.choices[0]
        content += choice.delta.content or ""
        calls += choice.delta.tool_calls or []
        finish = choice.finish_reason or finish
    return content, calls, finish


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "weather"}}]
)
def test_a_required_call_is_well_formed_and_the_same_with_speculation_and_without(client, choice):
    fields = {"tools": TOOLS, "tool_choice": choice, "parallel_tool_calls": False}
    speculative = ask(client, num_speculative_tokens=4, **fields)
    plain = ask(client, num_speculative_tokens=0, **fields)
    message = speculative.choices[0].message
    assert speculative.choices[0].finish_reason == "tool_calls"
    assert message.content is None and len(message.tool_calls) == 1
    call = message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    arguments = json.loads(call.function.arguments)
    if choice != "required":
        assert call.function.name == "weather"
    if call.function.name == "weather":
        assert arguments in ({"unit": "celsius"}, {"unit": "kelvin"})
    assert (call.function.name, arguments) == (
        plain.choices[0].message.tool_calls[0].function.name,
        json.loads(plain.choices[0].message.tool_calls[0].function.arguments),
    )
    grammar = speculative.model_extra["spec_stats"]["by_drafter"]["grammar"]
    assert grammar["accepted"] == grammar["drafted"] > 10  # the tags and keys, free
    content, calls, finish = streamed(client, num_speculative_tokens=4, **fields)
    assert (content, finish, len(calls)) == ("", "tool_calls", 1)
    assert calls[0].index == 0 and calls[0].id.startswith("call_")
    assert (calls[0].function.name, calls[0].function.arguments) == (
        call.function.name,
        call.function.arguments,
    )


def test_each_of_n_seeded_choices_makes_its_own_call_streamed_or_not(client):
    """n = 3 with a required call, sampled with a seed: each choice is the request with
    seed + i alone, a call of its own; the stream sends each choice's call under its index."""
    fields = {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}
    fields |= {"temperature": 1.0, "seed": 5}

    def called(message) -> tuple[str, str]:
        (call,) = message.tool_calls
        return call.function.name, call.function.arguments

    whole = ask(client, n=3, **fields)
    alone = [called(ask(client, **(fields | {"seed": 5 + i})).choices[0].message) for i in range(3)]
    assert [called(c.message) for c in whole.choices] == alone
    assert all(c.finish_reason == "tool_calls" for c in whole.choices)
    calls: dict[int, list] = {}
    for event in ask(client, n=3, stream=True, **fields):
        for choice in event.choices:
            calls.setdefault(choice.index, []).extend(choice.delta.tool_calls or [])
    streamed_calls = [calls[i] for i in range(3)]
    assert [(c.function.name, c.function.arguments) for (c,) in streamed_calls] == alone


def test_parallel_calls_are_calls_of_the_offered_functions(client):
    """Parallel calls (the default): each call read back is one of the functions offered
    with JSON arguments; the random model may be cut at max_tokens (closed calls are
    returned then: ``test_a_cut_reply_keeps_its_closed_calls...`` reads them by hand)."""
    reply = ask(client, tools=TOOLS, tool_choice="required", max_tokens=120)
    choice = reply.choices[0]
    calls = choice.message.tool_calls or []
    assert choice.finish_reason in ("tool_calls", "length")
    assert calls or choice.finish_reason == "length"
    for call in calls:
        assert call.function.name in ("weather", "time")
        json.loads(call.function.arguments)


def test_with_tools_offered_a_reply_without_calls_is_text_streamed_or_not(client):
    """The tiny random model calls nothing: its text comes back whole, and streamed text
    held back in case it was a call is sent at the end."""
    whole = ask(client, tools=TOOLS)
    content, calls, finish = streamed(client, tools=TOOLS)
    assert whole.choices[0].message.tool_calls is None
    assert content == whole.choices[0].message.content and not calls
    assert finish == whole.choices[0].finish_reason != "tool_calls"
    none = ask(client, tools=TOOLS, tool_choice="none")
    assert none.choices[0].message.content != whole.choices[0].message.content  # no tools shown


def test_a_conversation_with_earlier_calls_and_their_results_is_served(client):
    history = ASK + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"unit": "celsius"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    reply = ask(client, messages=history, tools=TOOLS, max_tokens=4)
    without_call = ASK + [{"role": "assistant", "content": ""}, history[-1]]
    bare = ask(client, messages=without_call, tools=TOOLS, max_tokens=4)
    shown = '<tool_call>{"name": "weather", "arguments": {"unit": "celsius"}}</tool_call>'
    assert (
        reply.usage.prompt_tokens - bare.usage.prompt_tokens
        == len(shown) - len("<tool_call>" + "</tool_call>") + 2
    )  # the template showed the call: its characters, its two tags a token each
    # the reply's own message, sent back as the openai client gives it, is accepted too
    first = ask(client, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    message = first.choices[0].message.model_dump(exclude_unset=True)
    again = ask(client, messages=ASK + [message, history[-1]], tools=TOOLS, max_tokens=4)
    assert again.usage.prompt_tokens > bare.usage.prompt_tokens


@pytest.mark.parametrize(
    "fields, param, words",
    [
        ({"tool_choice": "required"}, None, "needs tools"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "rain"}}},
            None,
            "no function 'rain'",
        ),
        ({"tools": TOOLS + TOOLS[:1]}, None, "a name of its own"),
        (
            {"tools": TOOLS, "response_format": {"type": "json_object"}},
            None,
            "not both",
        ),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, None, "pattern"),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "c",
                                "type": "function",
                                "function": {"name": "weather", "arguments": "celsius"},
                            }
                        ],
                    }
                ]
            },
            None,
            "JSON object",
        ),
        ({"messages": [{"role": "tool"}]}, None, "content is needed"),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}
                ],
                "tool_choice": "required",
            },
            "tools",
            "type must be a string",
        ),
    ],
)
def test_bad_tools_are_a_400_naming_the_problem(server, fields, param, words):
    body = {"messages": ASK, "max_tokens": 4} | fields
    status, payload = post(server, "/v1/chat/completions", body)
    assert status == 400, payload
    assert words in payload["error"]["message"]
    if param is not None:
        assert payload["error"]["param"] == param
    status, _ = post(server, "/v1/chat/completions", {"messages": ASK, "max_tokens": 2})
    assert status == 200


def test_a_template_that_does_not_show_tools_is_a_400():
    from helpers import char_tokenizer

    tokenizer = char_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    model = tiny_llama(seed=0)
    running = Running(model, perturbed_copy(model, 0.03, 1), tokenizer)
    try:
        status, payload = post(
            running, "/v1/chat/completions", {"messages": ASK, "tools": TOOLS, "max_tokens": 2}
        )
        assert status == 400 and "does not show tools" in payload["error"]["message"]
    finally:
        running.close()


def test_a_gguf_template_shows_tools_as_transformers_renders_them():
    """llama.cpp's tokenizer renders the GGUF's template itself: tools reach it, and its
    ``tojson`` is ``json.dumps`` (not jinja2's, which escapes ``<`` for HTML)."""
    from specdec.backends.llamacpp import LlamaCppTokenizer
    from specdec.prompting import chat_ids

    tokenizer = object.__new__(LlamaCppTokenizer)
    rendered = []
    tokenizer.encode = lambda text: rendered.append(text) or [len(text)]  # type: ignore[method-assign]
    tokenizer.chat_template = (
        "{% for t in tools or [] %}{{ t | tojson }}\n{% endfor %}"
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    tool = {"type": "function", "function": {"name": "f", "description": "x < y"}}
    chat_ids(tokenizer, [{"role": "user", "content": "hi"}], [tool])
    assert rendered[-1] == json.dumps(tool, ensure_ascii=False) + "\nhi"
