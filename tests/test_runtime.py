"""One runtime value for every command: parsing, the older spellings, and clear refusals."""

import argparse

import pytest

from specdec.bench.systems import RuntimePair
from specdec.runtime import Runtime, parse_runtime, runtime_value


@pytest.mark.parametrize(
    "text, expected",
    [
        ("int8", Runtime("transformers", "int8")),
        ("int4", Runtime("transformers", "int4")),
        ("bfloat16", Runtime("transformers", "bfloat16")),
        ("float32", Runtime("transformers", "float32")),
        ("llamacpp:q4_0", Runtime("llamacpp", "q4_0")),
        ("LlamaCpp:Q8_0", Runtime("llamacpp", "q8_0")),
        ("q4_k_m", Runtime("llamacpp", "q4_k_m")),  # the bench's short form
        ("transformers", Runtime("transformers", "float32")),  # --dtype float32 below
        ("llamacpp", Runtime("llamacpp", "f16")),  # --gguf-type f16 below
    ],
)
def test_every_spelling_names_one_runtime(text, expected):
    assert parse_runtime(text, dtype="float32", gguf_type="f16") == expected


@pytest.mark.parametrize(
    "text", ["", "fp16", "llamacpp:int8", "llamacpp:q9", "int3", "llamacpp:int4"]
)
def test_unknown_runtimes_are_refused_with_the_valid_values(text):
    with pytest.raises(ValueError, match="llamacpp:TYPE"):
        parse_runtime(text)
    with pytest.raises(argparse.ArgumentTypeError):
        runtime_value(text)


def test_names_round_trip():
    for text in ("int8", "int4", "bfloat16", "float32", "llamacpp:q4_0", "llamacpp:bf16"):
        assert parse_runtime(parse_runtime(text).name).name == text
    assert runtime_value("auto") == "auto"


def test_the_bench_reads_the_same_values():
    assert RuntimePair.parse("int8/llamacpp:q4_0") == RuntimePair.parse("int8/q4_0")
    assert RuntimePair.parse("llamacpp:q8_0").target == "q8_0"
    with pytest.raises(ValueError, match="unknown runtime"):
        RuntimePair.parse("int8/llamacpp:zz")


def test_a_draft_on_int4_loads_the_drafts_own_form(monkeypatch):
    """``Runtime.load(draft=True)`` asks int4 for a scale per 128 inputs (``DRAFT_GROUP``);
    a target, or a draft on another runtime, for the model's own form."""
    from specdec.backends.quant.int4 import DRAFT_GROUP

    calls = []
    monkeypatch.setattr("specdec.loading.load_backend", lambda *a, **k: calls.append(k))
    parse_runtime("int4").load("a-model", draft=True)
    parse_runtime("int4").load("a-model")
    parse_runtime("int8").load("a-model", draft=True)
    assert calls[0].get("int4_group") == DRAFT_GROUP
    assert "int4_group" not in calls[1] and "int4_group" not in calls[2]
