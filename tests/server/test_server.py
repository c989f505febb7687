"""A real uvicorn server on a loopback port, driven by the official openai client and raw HTTP."""

import http.client
import json
import re
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import openai
import pytest

from helpers import VOCAB, backend, fim_tokenizer, perturbed_copy, tiny_llama
from servers import MODEL, Running, alone, post
from specdec import Engine, SamplingParams, SpecConfig
from specdec.backends.quant.convert import make_int4_batch_invariant
from specdec.backends.quant.int4 import RowInt4Linear
from specdec.backends.quant.int8 import RowInt8Linear
from specdec.config import Constraint
from specdec.drafters import ModelDrafter
from specdec.prompting import chat_ids, fim_ids
from specdec.server.schemas import CompletionRequest
from specdec.server.service import Service


def test_completion_equals_the_engine_alone(client, models):
    result = client.completions.create(
        model=MODEL, prompt="hello world", max_tokens=20, temperature=0
    )
    expected = alone(models, "hello world", 20, k=3)
    assert result.choices[0].text == expected.text
    assert result.choices[0].finish_reason in ("stop", "length")
    assert result.usage.completion_tokens == len(expected.token_ids)
    assert result.usage.prompt_tokens == len("hello world")
    stats = result.model_extra["spec_stats"]
    assert stats["drafted_tokens"] > 0 and 0 <= stats["acceptance_rate"] <= 1


def test_streamed_completion_equals_the_whole(client):
    whole = client.completions.create(model=MODEL, prompt="stream", max_tokens=24, temperature=0)
    pieces = list(
        client.completions.create(
            model=MODEL, prompt="stream", max_tokens=24, temperature=0, stream=True
        )
    )
    assert "".join(p.choices[0].text for p in pieces) == whole.choices[0].text
    assert pieces[-1].choices[0].finish_reason in ("stop", "length")
    assert pieces[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_chat_completion_streaming_and_not(client):
    messages = [{"role": "user", "content": "say hi"}]
    whole = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16, temperature=0
    )
    assert whole.choices[0].message.role == "assistant"
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=16, temperature=0, stream=True
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks)
        == whole.choices[0].message.content
    )


def test_speculation_fields_per_request(client, models):
    for drafter, k in (("none", 0), ("lookup", 2), ("lookup+model", "auto"), ("model", 5)):
        result = client.completions.create(
            model=MODEL,
            prompt="abcabcabc",
            max_tokens=15,
            temperature=0,
            extra_body={"drafter": drafter, "num_speculative_tokens": k},
        )
        assert (
            result.choices[0].text == alone(models, "abcabcabc", 15, k=3).text
        )  # greedy: same text
        if drafter == "none" or k == 0:
            assert result.model_extra["spec_stats"]["drafted_tokens"] == 0


def test_completion_logprobs_equal_the_engine_alone(client, models):
    """The server's logprobs are the engine's own values (the same floats), in OpenAI's
    completions shape, streamed or not, and usage carries the request's speculation."""
    kwargs = dict(model=MODEL, prompt="hello world", max_tokens=20, temperature=0, logprobs=3)
    result = client.completions.create(**kwargs)
    expected = alone(models, "hello world", 20, k=3, logprobs=3)
    logprobs = result.choices[0].logprobs
    assert logprobs.token_logprobs == [e.logprob for e in expected.logprobs]
    assert "".join(logprobs.tokens) == result.choices[0].text == expected.text
    assert all(len(top) == 3 for top in logprobs.top_logprobs)
    offsets = [len("".join(logprobs.tokens[:i])) for i in range(len(logprobs.tokens))]
    assert logprobs.text_offset == offsets and len(offsets) == len(expected.token_ids)
    streamed = list(client.completions.create(**kwargs, stream=True))
    parts = [p.choices[0].logprobs for p in streamed if p.choices[0].logprobs is not None]
    assert [lp for part in parts for lp in part.token_logprobs] == logprobs.token_logprobs
    assert [o for part in parts for o in part.text_offset] == logprobs.text_offset
    speculation = result.usage.model_extra["speculation"]
    stats = result.model_extra["spec_stats"]
    assert speculation["drafted_tokens"] == stats["drafted_tokens"] > 0
    assert speculation["mean_accepted_length"] == stats["mean_accepted_length"] >= 1


def test_chat_logprobs_streamed_and_not(client, models):
    messages = [{"role": "user", "content": "say hi"}]
    kwargs = dict(
        model=MODEL, messages=messages, max_tokens=16, temperature=0, logprobs=True, top_logprobs=2
    )
    whole = client.chat.completions.create(**kwargs)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens
    assert "".join(entry.token for entry in content) == whole.choices[0].message.content
    assert all(bytes(e.bytes).decode() == e.token and len(e.top_logprobs) == 2 for e in content)
    assert all(e.top_logprobs[0].token == e.token for e in content)  # greedy: the argmax
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    streamed = [
        e
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]
    plain = client.chat.completions.create(
        **kwargs, extra_body={"num_speculative_tokens": 0}
    )  # no drafts: on int8 and int4 the same floats (each row is computed alone)
    assert plain.usage.model_extra["speculation"]["drafted_tokens"] == 0
    if models[0].get_output_embeddings().__class__.__name__.startswith("Row"):
        assert [e.logprob for e in plain.choices[0].logprobs.content] == [
            e.logprob for e in content
        ]


def test_penalties_and_bias_equal_the_engine_alone(client, models):
    """OpenAI's presence_penalty, frequency_penalty and logit_bias and the repetition_penalty
    extension: the text is the engine's with them, greedy and seeded, streamed or not, with
    speculation and without; a -100 bias bans its token."""
    banned = models[2].convert_tokens_to_ids("l")
    fields = dict(presence_penalty=0.6, frequency_penalty=0.4, repetition_penalty=1.3)
    body = dict(model=MODEL, prompt="seeded", max_tokens=24, logit_bias={str(banned): -100})
    extra = {"repetition_penalty": fields.pop("repetition_penalty")}
    for seed, temperature in ((None, 0.0), (5, 0.9)):
        expected = alone(
            models, "seeded", 24, k=3, seed=seed, temperature=temperature,
            logit_bias={banned: -100}, repetition_penalty=1.3, **fields,
        )  # fmt: skip
        assert "l" not in expected.text
        kwargs = dict(body, seed=seed, temperature=temperature, **fields)
        whole = client.completions.create(**kwargs, extra_body=extra)
        assert whole.choices[0].text == expected.text
        streamed = client.completions.create(**kwargs, extra_body=extra, stream=True)
        assert "".join(part.choices[0].text for part in streamed) == expected.text
        plain = client.completions.create(
            **kwargs, extra_body={**extra, "num_speculative_tokens": 0}
        )
        assert plain.choices[0].text == expected.text
        if seed is None:
            assert expected.text != alone(models, "seeded", 24, k=3).text, "no change tested"


def test_n_choices_are_the_request_with_seed_plus_i_streamed_or_not(client, models):
    """n > 1: choice i of a seeded request is the request alone with seed + i; the stream
    sends every choice's text, logprobs and finish under its index, the usage (summed over
    the choices) once, on the last event."""
    kwargs = dict(model=MODEL, prompt="seeded", max_tokens=16, temperature=0.9, seed=11)
    whole = client.completions.create(**kwargs, n=3, logprobs=1)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    expected = [alone(models, "seeded", 16, k=3, seed=11 + i, temperature=0.9) for i in range(3)]
    assert [c.text for c in whole.choices] == [e.text for e in expected]
    assert len({c.text for c in whole.choices}) > 1, "choices drawn with distinct seeds"
    assert whole.usage.completion_tokens == sum(len(e.token_ids) for e in expected)
    events = list(client.completions.create(**kwargs, n=3, logprobs=1, stream=True))
    for i, choice in enumerate(whole.choices):
        mine = [e.choices[0] for e in events if e.choices and e.choices[0].index == i]
        assert "".join(c.text for c in mine) == choice.text
        assert [c.finish_reason for c in mine if c.finish_reason] == [choice.finish_reason]
        streamed = [lp for c in mine if c.logprobs for lp in c.logprobs.token_logprobs]
        offsets = [o for c in mine if c.logprobs for o in c.logprobs.text_offset]
        assert streamed == choice.logprobs.token_logprobs
        assert offsets == choice.logprobs.text_offset
    with_usage = [e for e in events if e.usage is not None]
    assert len(with_usage) == 1 and with_usage[0] is events[-1]
    assert events[-1].usage.completion_tokens == whole.usage.completion_tokens


def two_choices(client, chat: bool, seed: int):
    """A sampled request of 2 choices, "hello" as a chat message or a prompt: the
    client's call and its fields."""
    kwargs: dict = dict(model=MODEL, max_tokens=12, temperature=0.9, seed=seed, n=2)
    if chat:
        kwargs["messages"] = [{"role": "user", "content": "hello"}]
        return client.chat.completions.create, kwargs
    kwargs["prompt"] = "hello"
    return client.completions.create, kwargs


@pytest.mark.parametrize("chat", [False, True])
def test_include_usage_sends_the_usage_in_a_last_event_of_its_own(client, chat):
    """``stream_options.include_usage`` (OpenAI's): every event carries ``usage`` null
    but one more after the choices' last, with no choices, whose usage is the one the
    request gets unstreamed (its tokens, summed over the n choices), ``spec_stats`` with it;
    without it, the usage rides on the last choice's finish, the events before without it."""
    create, kwargs = two_choices(client, chat, seed=3)
    whole = create(**kwargs)
    options = {"include_usage": True}
    with create(**kwargs, stream=True, stream_options=options) as stream:
        events = list(stream)
    last = events[-1]
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert last.choices == [] and last.usage is not None
    assert [getattr(last.usage, n) for n in counts] == [getattr(whole.usage, n) for n in counts]
    assert last.model_extra["spec_stats"]["drafted_tokens"] >= 0
    assert all(e.choices and e.usage is None and "usage" in e.model_fields_set for e in events[:-1])
    finishes = [c.finish_reason for e in events[:-1] for c in e.choices if c.finish_reason]
    assert sorted(finishes) == sorted(c.finish_reason for c in whole.choices)
    with create(**kwargs, stream=True, stream_options={"include_usage": False}) as stream:
        plain = list(stream)
    assert plain[-1].choices and plain[-1].usage is not None  # on the last finish, as before
    assert [getattr(plain[-1].usage, n) for n in counts] == [
        getattr(whole.usage, n) for n in counts
    ]
    assert all(e.usage is None and "usage" not in e.model_fields_set for e in plain[:-1])


@pytest.mark.parametrize("chat", [False, True])
def test_continuous_usage_stats_counts_each_choice_as_it_grows(client, chat):
    """vLLM's ``stream_options.continuous_usage_stats`` (with ``include_usage``): every
    event of a choice carries that choice's prompt tokens and its completion tokens so far
    (never fewer than before; a chat's first, role-only event 0; its finish all of that
    choice's), and the request's usage still comes last, alone; without include_usage it
    changes nothing."""
    create, kwargs = two_choices(client, chat, seed=5)
    whole = create(**kwargs)
    options = {"include_usage": True, "continuous_usage_stats": True}
    with create(**kwargs, stream=True, stream_options=options) as stream:
        events = list(stream)
    assert events[-1].choices == [] and events[-1].usage.total_tokens == whole.usage.total_tokens
    prompt = whole.usage.prompt_tokens  # one prompt, its n choices
    counts: dict[int, list[int]] = {0: [], 1: []}
    finishes: dict[int, int] = {}
    for event in events[:-1]:
        (choice,) = event.choices
        usage = event.usage
        assert usage.prompt_tokens == prompt
        assert usage.total_tokens == prompt + usage.completion_tokens
        counts[choice.index].append(usage.completion_tokens)
        if choice.finish_reason is not None:
            finishes[choice.index] = usage.completion_tokens
    for index, seen in counts.items():
        assert seen == sorted(seen) and seen[-1] == finishes[index], seen
        assert (seen[0] == 0) if chat else (seen[0] > 0)
    assert sum(finishes.values()) == whole.usage.completion_tokens
    with create(**kwargs, stream=True, stream_options={"continuous_usage_stats": True}) as stream:
        alone_ = list(stream)
    assert all(e.usage is None for e in alone_[:-1]) and alone_[-1].usage is not None


def test_echo_gives_the_prompt_and_its_logprobs_before_each_completion(client, models):
    """echo: each choice's text begins with the prompt; with logprobs its tokens come first,
    their values the engine's ``prompt_logprobs`` (the first null), then the completion's;
    the same streamed, and from the prompt given as token ids (as lm-evaluation-harness
    sends it to score a text: echo, logprobs 1, max_tokens 1)."""
    prompt = "hello world, hello there"
    kwargs = dict(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, logprobs=2, echo=True)
    whole = client.completions.create(**kwargs)
    expected = alone(models, prompt, 12, k=3, logprobs=2, prompt_logprobs=2)
    choice = whole.choices[0]
    assert choice.text == prompt + expected.text
    logprobs = choice.logprobs
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    scored = [e.logprob for e in expected.prompt_logprobs[1:]]
    assert logprobs.token_logprobs[1:] == scored + [e.logprob for e in expected.logprobs]
    assert all(len(top) == 2 for top in logprobs.top_logprobs[1:])
    assert "".join(logprobs.tokens) == choice.text  # one character a token
    offsets = [len("".join(logprobs.tokens[:i])) for i in range(len(logprobs.tokens))]
    assert logprobs.text_offset == offsets
    assert whole.usage.prompt_tokens == len(prompt)
    streamed = list(client.completions.create(**kwargs, stream=True))
    parts = [p.choices[0] for p in streamed if p.choices]
    assert "".join(p.text for p in parts) == choice.text
    assert parts[0].text == prompt  # the echo first, on its own
    values = [v for p in parts if p.logprobs for v in p.logprobs.token_logprobs]
    assert values == logprobs.token_logprobs
    assert [o for p in parts if p.logprobs for o in p.logprobs.text_offset] == offsets
    _, _, tokenizer = models
    ids = tokenizer.encode(prompt)
    by_ids = client.completions.create(**{**kwargs, "prompt": ids})
    assert by_ids.choices[0].text == choice.text
    assert by_ids.choices[0].logprobs.token_logprobs == logprobs.token_logprobs
    one = client.completions.create(**{**kwargs, "prompt": [ids], "max_tokens": 1, "logprobs": 1})
    assert one.choices[0].logprobs.token_logprobs[: len(ids)] == [None] + scored
    bare = client.completions.create(**{**kwargs, "logprobs": None})
    assert bare.choices[0].text == choice.text and bare.choices[0].logprobs is None
    sampled = client.completions.create(**{**kwargs, "temperature": 0.9, "seed": 5, "n": 2})
    for i, each in enumerate(sampled.choices):
        assert each.text.startswith(prompt)
        assert (
            each.text[len(prompt) :]
            == alone(models, prompt, 12, k=3, seed=5 + i, temperature=0.9).text
        )
        assert each.logprobs.token_logprobs[: len(ids)] == [None] + scored


def test_several_prompts_are_each_completed_as_alone_in_order(server, client, models):
    """A list of prompts (OpenAI's batch, as lm-evaluation-harness sends its requests):
    each completed as it would be alone, choice index = the prompt's place x n + its own,
    usage the prompts' tokens summed; streamed the same; as ids with echo, logprobs and
    max_tokens 1 (a batch of texts scored) each choice its own prompt's values; best_of
    per prompt; more completions than the server holds, or an empty prompt, a 400."""
    prompts = ["hello world", "abcabc", "the cat"]
    kwargs = dict(model=MODEL, prompt=prompts, max_tokens=10, temperature=0.8, seed=3, n=2)
    whole = client.completions.create(**kwargs)
    assert [c.index for c in whole.choices] == list(range(6))
    for index, choice in enumerate(whole.choices):
        place, i = divmod(index, 2)
        expected = alone(models, prompts[place], 10, k=3, seed=3 + i, temperature=0.8)
        assert choice.text == expected.text, index
    assert whole.usage.prompt_tokens == sum(len(p) for p in prompts)
    texts: dict[int, str] = {}
    streamed = list(client.completions.create(**kwargs, stream=True))
    for event in streamed:
        for part in event.choices:
            texts[part.index] = texts.get(part.index, "") + part.text
    assert [texts[i] for i in range(6)] == [c.text for c in whole.choices]
    assert streamed[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    _, _, tokenizer = models
    ids = [tokenizer.encode(p) for p in prompts]
    scored = client.completions.create(
        model=MODEL, prompt=ids, echo=True, logprobs=1, max_tokens=1, temperature=0
    )
    for place, choice in enumerate(scored.choices):
        expected = alone(models, prompts[place], 1, k=3, logprobs=1, prompt_logprobs=1)
        assert choice.text == prompts[place] + expected.text
        values = [e.logprob for e in expected.prompt_logprobs[1:] + expected.logprobs]
        assert choice.logprobs.token_logprobs == [None] + values
    best = client.completions.create(
        model=MODEL, prompt=prompts[:2], max_tokens=6, temperature=1.0, seed=21, best_of=3
    )
    for place, choice in enumerate(best.choices):
        made = [
            alone(models, prompts[place], 6, k=3, seed=21 + i, temperature=1.0, logprobs=0)
            for i in range(3)
        ]
        means = [sum(e.logprob for e in out.logprobs) / len(out.logprobs) for out in made]
        assert choice.text == made[means.index(max(means))].text
    assert len(best.choices) == 2
    status, body = post(server, "/v1/completions", {"prompt": ["x"] * 20, "n": 2})
    assert status == 400 and body["error"]["param"] == "n", body
    for empty in (["x", ""], [], [[]]):
        status, body = post(server, "/v1/completions", {"prompt": empty})
        assert status == 400 and "prompt is empty" in body["error"]["message"], body


def test_prompt_logprobs_in_vllms_form(server, models):
    """vLLM's prompt_logprobs: on each choice of a completion (and on a chat completion),
    per prompt token null (the first) or {token id: {logprob, rank, decoded_token}} for the
    token itself and the most likely ones: the engine's values; not streamed."""
    prompt = "hello there, hello"
    _, _, tokenizer = models
    expected = alone(models, prompt, 4, k=3, prompt_logprobs=2)
    status, body = post(
        server, "/v1/completions", {"prompt": prompt, "max_tokens": 4, "temperature": 0,
                                    "n": 2, "prompt_logprobs": 2}
    )  # fmt: skip
    assert status == 200, body
    ids = tokenizer.encode(prompt)
    for choice in body["choices"]:
        shown = choice["prompt_logprobs"]
        assert shown[0] is None and len(shown) == len(ids)
        pairs = zip(shown[1:], expected.prompt_logprobs[1:], ids[1:], strict=True)
        for values, entry, token_id in pairs:
            own = values[str(token_id)]
            assert own["logprob"] == entry.logprob and own["rank"] == entry.rank >= 1
            assert own["decoded_token"] == tokenizer.decode([token_id])
            for place, (top_id, logprob) in enumerate(entry.top, start=1):
                assert values[str(top_id)]["logprob"] == logprob
                assert top_id == token_id or values[str(top_id)]["rank"] == place
    status, plain = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 4})
    assert "prompt_logprobs" not in plain["choices"][0]  # only where asked for
    messages = [{"role": "user", "content": "hi"}]
    status, chat = post(
        server, "/v1/chat/completions", {"messages": messages, "max_tokens": 2,
                                         "prompt_logprobs": 0}
    )  # fmt: skip
    assert status == 200 and chat["prompt_logprobs"][0] is None, chat
    assert len(chat["prompt_logprobs"]) == chat["usage"]["prompt_tokens"]
    assert all(len(values) == 1 for values in chat["prompt_logprobs"][1:])
    status, error = post(
        server, "/v1/completions", {"prompt": prompt, "stream": True, "prompt_logprobs": 1}
    )
    assert status == 400 and "not streamed" in error["error"]["message"]


def test_echo_with_max_tokens_0_scores_the_prompt_and_generates_nothing(client, models):
    """OpenAI's way to score a text: echo with max_tokens 0 gives the prompt and its tokens'
    logprobs (the engine's ``prompt_logprobs``), no completion, finish "length" and no
    completion tokens; the same streamed, for each of n choices, and from token ids.
    Without echo, max_tokens 0 is a 400."""
    prompt = "hello world, hello there"
    expected = alone(models, prompt, 1, k=0, prompt_logprobs=3)
    scored = [None] + [e.logprob for e in expected.prompt_logprobs[1:]]
    kwargs = dict(model=MODEL, prompt=prompt, max_tokens=0, echo=True, logprobs=3)
    whole = client.completions.create(**kwargs, n=2, temperature=0.8)
    for index, choice in enumerate(whole.choices):
        assert choice.index == index and choice.text == prompt
        assert choice.finish_reason == "length"
        assert choice.logprobs.token_logprobs == scored
        assert all(len(top) == 3 for top in choice.logprobs.top_logprobs[1:])
    assert whole.usage.completion_tokens == 0 and whole.usage.prompt_tokens == len(prompt)
    assert whole.model_extra["spec_stats"]["drafted_tokens"] == 0
    assert whole.model_extra["spec_stats"]["generated_tokens"] == 0
    streamed = list(client.completions.create(**kwargs, stream=True))
    parts = [p.choices[0] for p in streamed if p.choices]
    assert "".join(p.text for p in parts) == prompt
    assert [v for p in parts if p.logprobs for v in p.logprobs.token_logprobs] == scored
    assert parts[-1].finish_reason == "length" and streamed[-1].usage.completion_tokens == 0
    _, _, tokenizer = models
    by_ids = client.completions.create(**{**kwargs, "prompt": tokenizer.encode(prompt)})
    assert by_ids.choices[0].text == prompt
    assert by_ids.choices[0].logprobs.token_logprobs == scored
    bare = client.completions.create(**{**kwargs, "logprobs": None})
    assert bare.choices[0].text == prompt and bare.choices[0].logprobs is None
    with pytest.raises(openai.BadRequestError, match="max_tokens 0 goes with echo"):
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=0)
    with pytest.raises(openai.BadRequestError, match="min_tokens must be 0"):
        client.completions.create(**kwargs, extra_body={"min_tokens": 2})


def test_tokenize_gives_the_ids_the_completions_give_and_detokenize_their_text(
    server, client, models
):
    """vLLM's /tokenize: a prompt's ids are the tokenizer's, their count the completion's
    prompt_tokens; a conversation's the chat completion's; /detokenize gives the text back;
    /tokenizer_info the special tokens and chat template; bad ids, a foreign model, both a
    prompt and messages are 400s."""
    _, _, tokenizer = models
    prompt = "tokens, please"
    status, body = post(server, "/tokenize", {"prompt": prompt, "return_token_strs": True})
    assert status == 200, body
    assert body["tokens"] == tokenizer.encode(prompt) and body["count"] == len(body["tokens"])
    assert "".join(body["token_strs"]) == prompt  # one character a token here
    served = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    assert served.usage.prompt_tokens == body["count"]
    models_list = client.models.list().data[0]
    assert body["max_model_len"] == models_list.model_extra["max_model_len"]
    assert client.models.retrieve(MODEL) == models_list  # OpenAI's retrieve
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.models.retrieve("other/model")
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    status, chat = post(server, "/tokenize", {"messages": messages})
    assert status == 200 and chat["token_strs"] is None, chat
    replied = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    assert replied.usage.prompt_tokens == chat["count"]
    assert chat["tokens"] == chat_ids(tokenizer, messages)
    status, back = post(server, "/detokenize", {"tokens": body["tokens"]})
    assert status == 200 and back == {"prompt": prompt}
    assert post(server, "/detokenize", {"tokens": []}) == (200, {"prompt": ""})
    with urllib.request.urlopen(server.url + "/tokenizer_info", timeout=30) as response:
        info = json.loads(response.read())
    assert info["eos_token"] == tokenizer.eos_token and info["chat_template"]
    assert info["chat_template"] == tokenizer.chat_template
    assert info["model_max_length"] == body["max_model_len"]
    refused = [
        ("/detokenize", {"tokens": [0, 10**9]}, "tokens"),
        ("/detokenize", {"tokens": [0], "model": "other"}, "model"),
        ("/tokenize", {"prompt": "x", "messages": messages}, None),
        (
            "/tokenize",
            {"messages": messages, "continue_final_message": True, "add_generation_prompt": True},
            None,
        ),
    ]
    for path, request, param in refused:
        status, error = post(server, path, request)
        assert status == 400, (path, request, error)
        assert param is None or error["error"]["param"] == param, error


def test_continue_final_message_goes_on_with_the_last_message(server, client, models):
    """vLLM's continue_final_message: the prompt ends inside the last message (the
    template's own rendering, cut after its text; /tokenize gives the same ids) and the
    reply is what the engine alone makes from there; echo begins its content with that
    message's text, streamed and not; with add_generation_prompt false the reply is in the
    last message's role. Both endings at once, or echo with tools, are 400s."""
    target, draft, tokenizer = models
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hel"}]
    ids = chat_ids(tokenizer, messages, opens_turn=False, continues=True)
    assert ids != chat_ids(tokenizer, messages) and tokenizer.decode(ids).endswith("hel")
    status, tokenized = post(
        server, "/tokenize", {"messages": messages, "continue_final_message": True}
    )
    assert status == 200 and tokenized["tokens"] == ids, tokenized
    engine = Engine(backend(target, tokenizer), ModelDrafter(backend(draft)))
    expected = engine.generate(
        ids, SamplingParams(max_tokens=10, temperature=0.0), SpecConfig(k=3)
    ).text
    kwargs = dict(model=MODEL, messages=messages, max_tokens=10, temperature=0)
    going_on = {"continue_final_message": True}
    reply = client.chat.completions.create(**kwargs, extra_body=going_on)
    assert reply.usage.prompt_tokens == len(ids)
    assert reply.choices[0].message.content == expected
    echoed = client.chat.completions.create(**kwargs, extra_body=going_on | {"echo": True})
    assert echoed.choices[0].message.content == "hel" + expected
    assert echoed.choices[0].message.role == "assistant"
    events = list(
        client.chat.completions.create(**kwargs, extra_body=going_on | {"echo": True}, stream=True)
    )
    assert events[0].choices[0].delta.role == "assistant"
    streamed = "".join(e.choices[0].delta.content or "" for e in events if e.choices)
    assert streamed == "hel" + expected
    as_user = messages[:1]  # the conversation as it stands, a user's message last
    user_ids = chat_ids(tokenizer, as_user, opens_turn=False)
    mine = client.chat.completions.create(
        model=MODEL,
        messages=as_user,
        max_tokens=10,
        temperature=0,
        extra_body={"add_generation_prompt": False, "echo": True},
    )
    alone_user = engine.generate(
        user_ids, SamplingParams(max_tokens=10, temperature=0.0), SpecConfig(k=3)
    ).text
    assert mine.choices[0].message.role == "user"
    assert mine.choices[0].message.content == "hi" + alone_user
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    both = {"add_generation_prompt": True}
    for extra, field in [
        (going_on | both, "continue_final_message"),
        ({"echo": True, "tools": [tool]}, "echo"),
    ]:
        status, body = post(server, "/v1/chat/completions", kwargs | extra)
        assert status == 400 and body["error"]["param"] == field, body
    status, body = post(server, "/tokenize", {"messages": messages} | going_on | both)
    assert status == 400 and body["error"]["param"] == "continue_final_message", body
    fine = going_on | {"add_generation_prompt": False, "echo": True, "tools": [tool]}
    fine["tool_choice"] = "none"
    assert post(server, "/v1/chat/completions", kwargs | fine)[0] == 200


def test_best_of_returns_the_n_completions_most_likely_per_token(client, models):
    """best_of: that many completions are made (choice i the request with seed + i alone);
    the n with the highest mean log-probability per token come back, best first, and the
    usage counts every one made. Logprobs only where asked for."""
    kwargs = dict(model=MODEL, prompt="seeded", max_tokens=10, temperature=1.0, seed=21)
    made = [
        alone(models, "seeded", 10, k=3, seed=21 + i, temperature=1.0, logprobs=0) for i in range(4)
    ]

    def mean(out):
        return sum(e.logprob for e in out.logprobs) / len(out.logprobs)

    ranked = sorted(made, key=mean, reverse=True)
    assert len({round(mean(out), 6) for out in made}) == 4, "a tie: nothing ranked"
    assert ranked[0] is not made[0], "the best is the first made: the ranking is not tested"
    one = client.completions.create(**kwargs, best_of=4)
    assert [c.text for c in one.choices] == [ranked[0].text]
    assert one.choices[0].logprobs is None and one.choices[0].index == 0
    assert one.usage.completion_tokens == sum(len(out.token_ids) for out in made)
    two = client.completions.create(**kwargs, best_of=4, n=2, logprobs=1)
    assert [c.index for c in two.choices] == [0, 1]
    assert [c.text for c in two.choices] == [out.text for out in ranked[:2]]
    values = [e.logprob for e in ranked[1].logprobs]
    assert two.choices[1].logprobs.token_logprobs == values
    assert client.completions.create(**kwargs, best_of=1).choices[0].text == made[0].text


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"best_of": 2, "n": 3}, "best_of must be >= n (3), got 2"),
        ({"best_of": 2, "stream": True}, "best_of > n is not streamed"),
        ({"best_of": 0}, "best_of"),
        ({"best_of": 129}, "best_of"),
    ],
)
def test_bad_best_of_is_a_400_naming_it(server, fields, message):
    status, body = post(server, "/v1/completions", {"prompt": "hi", **fields})
    assert status == 400 and body["error"]["param"] == "best_of", body
    assert message in body["error"]["message"]


@pytest.mark.parametrize("runtime", ["float32", "int4"])
def test_suffix_fills_in_the_middle_with_the_models_markers(runtime):
    """suffix: the completion is what goes between the prompt and the suffix, asked with the
    tokenizer's fill-in-the-middle markers (prefix, suffix, middle), exactly what the engine
    gives for those ids alone; streamed the same; with echo, or on a tokenizer without
    markers (the other tests' server), a 400 naming the field."""
    tokenizer = fim_tokenizer()
    target = tiny_llama(seed=0, vocab=VOCAB + 3)
    draft = perturbed_copy(target, noise=0.03, seed=1)
    if runtime == "int4":
        target, draft = make_int4_batch_invariant(target), make_int4_batch_invariant(draft)
    running = Running(target, draft, tokenizer, max_active=4, max_queue=8, prefill_rows=8)
    try:
        client = openai.OpenAI(base_url=running.url + "/v1", api_key="x", max_retries=0)
        kwargs = dict(model=MODEL, prompt="def f(a", suffix="return b\n", temperature=0)
        whole = client.completions.create(**kwargs, max_tokens=16)
        ids = fim_ids(tokenizer, "def f(a", "return b\n")
        engine = Engine(backend(target, tokenizer), ModelDrafter(backend(draft)))
        expected = engine.generate(
            ids, SamplingParams(max_tokens=16, temperature=0), SpecConfig(k=3)
        )
        assert whole.choices[0].text == expected.text
        assert whole.usage.prompt_tokens == len(ids)
        streamed = client.completions.create(**kwargs, max_tokens=16, stream=True)
        assert "".join(p.choices[0].text for p in streamed if p.choices) == expected.text
        prefix_ids = tokenizer.encode("def f(a")
        by_ids = client.completions.create(**{**kwargs, "prompt": prefix_ids}, max_tokens=16)
        assert by_ids.choices[0].text == expected.text
        status, body = post(running, "/v1/completions", {**kwargs, "echo": True})
        assert status == 400 and body["error"]["param"] == "echo", body
    finally:
        running.close()


def test_a_fill_in_the_middle_drafts_with_prompt_lookup_in_front_by_default():
    """The text after the cursor is in the prompt: a request with a suffix and no drafter
    of its own gets lookup in front of the server's; one that names its drafter keeps it."""
    service = SimpleNamespace(default_drafter="model")
    fill = CompletionRequest(prompt="def f(", suffix="return x")
    assert Service.recipe(service, fill) == "lookup+model"  # type: ignore[arg-type]
    named = CompletionRequest(prompt="def f(", suffix="return x", drafter="model")
    assert Service.recipe(service, named) == "model"  # type: ignore[arg-type]
    assert Service.recipe(service, CompletionRequest(prompt="hi")) == "model"  # type: ignore[arg-type]


def test_suffix_without_fim_markers_is_a_400(server):
    status, body = post(server, "/v1/completions", {"prompt": "ab", "suffix": "cd"})
    assert status == 400 and body["error"]["param"] == "suffix", body
    assert "fill in the middle" in body["error"]["message"]


def test_a_predicted_output_drafts_and_the_answer_stays_the_engines(client, models):
    """prediction (OpenAI's predicted outputs): the answer is the engine's alone, greedy and
    seeded, streamed or not; where it follows the prediction its tokens are accepted
    drafts, counted in usage.completion_tokens_details, and the request takes fewer rounds."""
    messages = [{"role": "user", "content": "say hi"}]
    kwargs = dict(model=MODEL, messages=messages, max_tokens=40, temperature=0)
    extra = {"num_speculative_tokens": 4}  # "auto" learns from timings: drafts would vary
    free = client.chat.completions.create(**kwargs, extra_body=extra)
    answer = free.choices[0].message.content
    predicted = answer[:10] + "xyz" + answer[13:]  # the answer with a change
    for parts in (predicted, [{"type": "text", "text": predicted}]):
        prediction = {"type": "content", "content": parts}
        out = client.chat.completions.create(**kwargs, prediction=prediction, extra_body=extra)
        assert out.choices[0].message.content == answer
        details = out.usage.completion_tokens_details
        assert details.accepted_prediction_tokens > len(answer) // 2
        assert details.rejected_prediction_tokens > 0, (answer, details)  # at the change
        assert out.model_extra["spec_stats"]["rounds"] < free.model_extra["spec_stats"]["rounds"]
    streamed = client.chat.completions.create(
        **kwargs, prediction=prediction, extra_body=extra, stream=True
    )
    chunks = list(streamed)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answer
    sampled = {**kwargs, "temperature": 0.9, "seed": 3}
    alone_sampled = client.chat.completions.create(**sampled, extra_body=extra)
    with_prediction = client.chat.completions.create(
        **sampled, prediction=prediction, extra_body=extra
    )
    assert with_prediction.choices[0].message.content == alone_sampled.choices[0].message.content
    plain = client.chat.completions.create(
        **kwargs, prediction=prediction, extra_body={"num_speculative_tokens": 0}
    )
    assert plain.choices[0].message.content == answer
    assert plain.usage.completion_tokens_details.accepted_prediction_tokens == 0


def test_ignore_eos_and_stop_token_ids_are_the_engines(client, models):
    """vLLM's ignore_eos runs to max_tokens; stop_token_ids end the output at the first
    one, left out of the text; both as the engine alone, streamed or not."""
    kwargs = dict(model=MODEL, prompt="hello", max_tokens=30, temperature=0)
    free = client.completions.create(**kwargs, extra_body={"ignore_eos": True})
    expected = alone(models, "hello", 30, k=3, ignore_eos=True)
    assert free.choices[0].text == expected.text and free.usage.completion_tokens == 30
    stop_id = expected.token_ids[9]
    extra = {"ignore_eos": True, "stop_token_ids": [stop_id]}
    cut = client.completions.create(**kwargs, extra_body=extra)
    first = expected.token_ids.index(stop_id)
    assert cut.choices[0].text == expected.text[:first]  # one character a token
    assert cut.choices[0].finish_reason == "stop" and cut.usage.completion_tokens == first + 1
    streamed = client.completions.create(**kwargs, extra_body=extra, stream=True)
    assert "".join(p.choices[0].text for p in streamed if p.choices) == expected.text[:first]
    held = client.completions.create(**kwargs, extra_body={**extra, "min_tokens": first + 5})
    alone_held = alone(models, "hello", 30, k=3, ignore_eos=True, stop_token_ids=(stop_id,),
                       min_tokens=first + 5)  # fmt: skip
    assert held.choices[0].text == alone_held.text
    assert held.usage.completion_tokens == len(alone_held.token_ids) > first + 5


def test_n_chat_choices_greedy_are_all_the_one_answer(client, models):
    messages = [{"role": "user", "content": "say hi"}]
    kwargs = dict(model=MODEL, messages=messages, max_tokens=12, temperature=0, n=2)
    whole = client.chat.completions.create(**kwargs)
    one = client.chat.completions.create(**{**kwargs, "n": 1})
    assert [c.message.content for c in whole.choices] == [one.choices[0].message.content] * 2
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    for i in range(2):
        deltas = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == i]
        assert deltas[0].delta.role == "assistant"
        assert "".join(d.delta.content or "" for d in deltas) == one.choices[0].message.content


def test_guided_regex_equals_the_engine_alone_and_forces_drafts(client, models):
    """A regular expression (vLLM's guided_regex): the text matches it, is what the engine
    gives alone, streamed or not; the forced characters are free drafts."""
    pattern = "(hello|help), (world|word)!"
    extra = {"guided_regex": pattern}
    kwargs = dict(model=MODEL, prompt="say", max_tokens=40, temperature=0, extra_body=extra)
    result = client.completions.create(**kwargs)
    target, draft, tokenizer = models
    params = SamplingParams(max_tokens=40, temperature=0, constraint=Constraint("regex", pattern))
    engine = Engine(backend(target, tokenizer), ModelDrafter(backend(draft)))
    expected = engine.generate(tokenizer.encode("say"), params, SpecConfig(k=3))
    assert result.choices[0].text == expected.text and re.fullmatch(pattern, expected.text)
    assert result.model_extra["spec_stats"]["by_drafter"]["grammar"]["accepted"] >= 4
    streamed = client.completions.create(**kwargs, stream=True)
    assert "".join(part.choices[0].text for part in streamed) == expected.text


def test_sampling_with_seed_and_stop(client, models):
    kwargs = dict(model=MODEL, prompt="seeded", max_tokens=20, temperature=0.8, seed=7)
    first, second = (client.completions.create(**kwargs) for _ in range(2))
    assert first.choices[0].text == second.choices[0].text
    assert first.choices[0].text == alone(models, "seeded", 20, k=3, seed=7, temperature=0.8).text
    for prompt in ("hello world", "the cat", "abc", "zzz", "quick brown fox"):
        text = (
            client.completions.create(model=MODEL, prompt=prompt, max_tokens=30, temperature=0)
            .choices[0]
            .text
        )
        if len(text) >= 8:
            break
    stop = text[5:7]
    stopped = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=30, temperature=0, stop=[stop]
    )
    assert (
        stopped.choices[0].text == text[: text.index(stop)]
        and stopped.choices[0].finish_reason == "stop"
    )


def test_models_health_and_metrics(client, server):
    assert [m.id for m in client.models.list().data] == [MODEL]
    with urllib.request.urlopen(server.url + "/health") as response:
        assert json.loads(response.read())["status"] == "ok"
    client.completions.create(model=MODEL, prompt="metrics", max_tokens=8, temperature=0)
    with urllib.request.urlopen(server.url + "/metrics") as response:
        text = response.read().decode()
    for name in (
        "specdec_drafted_tokens_total",
        "specdec_accepted_tokens_total",
        "specdec_acceptance_rate",
        "specdec_mean_accepted_length_bucket",
        'specdec_seconds_total{phase="drafter"}',
        "specdec_request_latency_seconds_bucket",
        "specdec_time_to_first_token_seconds_bucket",
        "specdec_chunk_gap_seconds_bucket",
        "specdec_tokens_per_second_bucket",
        "specdec_queue_length",
    ):
        assert name in text, name


def test_the_gaps_between_a_requests_chunks_are_counted(client, server):
    """specdec_chunk_gap_seconds: one observation per chunk after the first, streamed or
    not, each at most the request's own time."""

    def gaps() -> tuple[float, float]:
        with urllib.request.urlopen(server.url + "/metrics") as response:
            lines = response.read().decode().splitlines()
        count = next(line for line in lines if line.startswith("specdec_chunk_gap_seconds_count"))
        total = next(line for line in lines if line.startswith("specdec_chunk_gap_seconds_sum"))
        return float(count.split()[-1]), float(total.split()[-1])

    for stream in (False, True):
        before = gaps()
        began = time.perf_counter()
        common = {"model": MODEL, "prompt": "gaps between chunks", "temperature": 0}
        if stream:
            pieces = list(client.completions.create(max_tokens=12, stream=True, **common))
            rounds = pieces[-1].model_extra["spec_stats"]["rounds"]
        else:
            rounds = client.completions.create(max_tokens=12, **common).model_extra["spec_stats"][
                "rounds"
            ]
        elapsed = time.perf_counter() - began
        after = gaps()
        assert rounds >= 2 and after[0] - before[0] == rounds - 1, (stream, rounds)
        assert 0 <= after[1] - before[1] <= elapsed


@pytest.mark.parametrize(
    "body, param",
    [
        (b"{not json", None),
        ({"model": "gpt-9", "prompt": "hi"}, "model"),
        ({"prompt": "hi", "max_tokens": -1}, "max_tokens"),
        ({"prompt": "hi", "temperature": 3.5}, "temperature"),
        ({"prompt": "hi", "top_p": 0}, "top_p"),
        ({"prompt": "hi", "n": 0}, "n"),
        ({"prompt": "hi", "n": 129}, "n"),
        ({"prompt": "hi", "n": 37}, "n"),  # more than the 4 + 32 requests it holds at once
        ({"prompt": ""}, "prompt"),
        ({"prompt": "a" * 400, "max_tokens": 4}, "prompt"),
        ({"prompt": "hi", "drafter": "oracle"}, "drafter"),
        ({"prompt": "hi", "num_speculative_tokens": -3}, "num_speculative_tokens"),
    ],
)
def test_bad_input_gives_an_openai_error_and_the_server_keeps_serving(server, body, param):
    status, payload = post(server, "/v1/completions", body)
    assert status == 400, payload
    assert set(payload["error"]) >= {"message", "type", "param", "code"}
    if param:
        assert param in (payload["error"]["param"] or "") or param in payload["error"]["message"]
    status, _ = post(server, "/v1/completions", {"prompt": "still here", "max_tokens": 2})
    assert status == 200


def test_the_int8_and_int4_servers_batch_and_the_float_one_takes_turns(server, models):
    quantized = isinstance(models[0].lm_head, RowInt8Linear | RowInt4Linear)
    assert (server.scheduler.batched is not None) == quantized
    assert (server.scheduler.draft_batched is not None) == quantized


def test_sixteen_parallel_streams_each_equal_their_request_alone(server, models):
    # 11 to 56 characters: from the 8th on, long enough to take the first token from the
    # prefill (``Run.FIRST_TOKEN_FROM_PREFILL``), in the batched path too
    prompts = [f"parallel {chr(97 + i)} {'x' * (3 * i)}" for i in range(16)]

    def one(i):
        client = openai.OpenAI(
            base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120
        )
        temperature, seed = (0.0, None) if i % 2 == 0 else (0.9, 100 + i)
        stream = client.completions.create(
            model=MODEL,
            prompt=prompts[i],
            max_tokens=24,
            stream=True,
            temperature=temperature,
            seed=seed,
        )
        return "".join(piece.choices[0].text for piece in stream)

    started = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        texts = list(pool.map(one, range(16)))
    elapsed = time.perf_counter() - started
    for i, text in enumerate(texts):
        temperature, seed = (0.0, None) if i % 2 == 0 else (0.9, 100 + i)
        assert (
            text == alone(models, prompts[i], 24, k=3, seed=seed, temperature=temperature).text
        ), i
    assert elapsed < 120
    if server.scheduler.batched is not None:  # passes scored several requests at once
        with urllib.request.urlopen(server.url + "/metrics") as metrics:
            lines = metrics.read().decode().splitlines()
        single = next(
            line for line in lines if line.startswith('specdec_batch_requests_bucket{le="1.0"}')
        )
        total = next(line for line in lines if line.startswith("specdec_batch_requests_count"))
        assert float(single.split()[-1]) < float(total.split()[-1])
        # "parallel " begins every prompt: later requests copied it from earlier ones' caches
        reused = next(line for line in lines if line.startswith("specdec_prefix_reused_tokens_"))
        assert float(reused.split()[-1]) > 0


def test_a_full_queue_answers_503_and_a_disconnect_frees_the_slot(models):
    running = Running(*models, max_active=1, max_queue=0)
    try:
        connection = http.client.HTTPConnection("127.0.0.1", running.port, timeout=30)
        body = json.dumps(
            {"prompt": "long", "max_tokens": 200, "stream": True, "temperature": 0.9, "seed": 1}
        )
        connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200
        response.fp.readline()  # the first event: the long request holds the only slot
        status, payload = post(running, "/v1/completions", {"prompt": "x", "max_tokens": 2})
        assert status == 503 and payload["error"]["code"] == "queue_full"
        connection.close()  # the client goes away mid-stream
        deadline = time.time() + 30
        while True:
            status, _ = post(running, "/v1/completions", {"prompt": "x", "max_tokens": 2})
            if status == 200:
                break
            assert time.time() < deadline, "the abandoned request never freed its slot"
            time.sleep(0.1)
        with urllib.request.urlopen(running.url + "/metrics") as metrics:
            assert 'specdec_requests_total{status="disconnected"} 1.0' in metrics.read().decode()
    finally:
        running.close()


def test_a_seeded_request_gives_the_same_text_whatever_else_the_server_does(server, models):
    """The reproducibility contract through the server: the same seeded request, sent
    6 times at once among other traffic with k=auto, gives one text: plain decoding's."""
    target, _, tokenizer = models
    body = {
        "prompt": "reproduce",
        "max_tokens": 24,
        "temperature": 0.9,
        "seed": 77,
        "num_speculative_tokens": "auto",
    }

    def one(i):
        if i % 2:
            other = {"prompt": f"noise {i}", "max_tokens": 16, "temperature": 0.7, "seed": i}
            post(server, "/v1/completions", other)
        return post(server, "/v1/completions", body)[1]["choices"][0]["text"]

    with ThreadPoolExecutor(8) as pool:
        texts = set(pool.map(one, range(12)))
    plain = Engine(backend(target, tokenizer)).generate(
        tokenizer.encode("reproduce"), SamplingParams(max_tokens=24, temperature=0.9, seed=77)
    )
    assert texts == {plain.text}
