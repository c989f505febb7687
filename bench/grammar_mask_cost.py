"""What a grammar mask costs per token on this CPU: llguidance (specdec's grammar engine)
and xgrammar where it is installed, on the default target's tokenizer and vocabulary.

    python bench/grammar_mask_cost.py
    # xgrammar too (not a specdec dependency; it pulls in triton):
    #   pip install --no-deps xgrammar apache-tvm-ffi

A JSON schema with nested objects and arrays; a 47-token document that follows it is
replayed token by token. Prints, per engine: building its form of the tokenizer (once per
process), compiling the grammar, and the median and largest mask time per token.
"""

from __future__ import annotations

import json
import statistics
import time

from specdec.loading import load_tokenizer
from specdec.machine import cpu_kind, cpu_name
from specdec.models import DEFAULT_TARGET

VOCAB = 151936  # the target's logits width (its tokenizer has fewer tokens)
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city", "zip"],
        },
    },
    "required": ["name", "age", "tags", "address"],
}
DOCUMENT = {
    "name": "Ada Lovelace",
    "age": 36,
    "tags": ["math", "poetry", "engines"],
    "address": {"city": "London", "zip": "W1"},
}


def llguidance_cost(tokenizer, token_ids: list[int]) -> tuple[float, float, list[float]]:
    import llguidance
    import llguidance.hf

    started = time.perf_counter()
    ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=VOCAB)
    setup = time.perf_counter() - started
    started = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA))
    matcher = llguidance.LLMatcher(ll_tokenizer, grammar)
    compile_seconds = time.perf_counter() - started
    times = []
    for token_id in token_ids:
        started = time.perf_counter()
        matcher.compute_bitmask()
        times.append(time.perf_counter() - started)
        assert matcher.consume_token(token_id), matcher.get_error()
    return setup, compile_seconds, times


def xgrammar_cost(tokenizer, token_ids: list[int]) -> tuple[float, float, list[float]]:
    import xgrammar

    started = time.perf_counter()
    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=VOCAB)
    compiler = xgrammar.GrammarCompiler(info)
    setup = time.perf_counter() - started
    started = time.perf_counter()
    matcher = xgrammar.GrammarMatcher(compiler.compile_json_schema(json.dumps(SCHEMA)))
    compile_seconds = time.perf_counter() - started
    bitmask = xgrammar.allocate_token_bitmask(1, VOCAB)
    times = []
    for token_id in token_ids:
        started = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask)
        times.append(time.perf_counter() - started)
        assert matcher.accept_token(token_id)
    return setup, compile_seconds, times


def main() -> None:
    tokenizer = load_tokenizer(DEFAULT_TARGET)
    token_ids = tokenizer.encode(json.dumps(DOCUMENT)) + [tokenizer.eos_token_id]
    print(f"CPU: {cpu_name()} ({cpu_kind()}); {len(token_ids)} tokens, vocabulary {VOCAB}")
    for name, cost in (("llguidance", llguidance_cost), ("xgrammar", xgrammar_cost)):
        try:
            setup, compile_seconds, times = cost(tokenizer, token_ids)
        except ImportError:
            print(f"{name}: not installed")
            continue
        print(
            f"{name}: tokenizer {setup:.2f} s, grammar {compile_seconds * 1e3:.1f} ms, "
            f"mask median {statistics.median(times) * 1e3:.3f} ms, "
            f"largest {max(times) * 1e3:.3f} ms"
        )


if __name__ == "__main__":
    main()
