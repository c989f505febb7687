"""The llama.cpp runtime on the catalog's real 0.5B GGUF (needs the llamacpp extra).

Marked slow: they load real weights. Token identity between a llama.cpp block pass and
one-token steps is not promised (quantized kernels round a batch differently), so these
check the machinery: rollback, the rows returned, the tokenizer, requantizing, mixed pairs.
"""

import pytest
import torch

pytest.importorskip("llama_cpp", reason="llama-cpp-python (the llamacpp extra) is not installed")

from specdec.backends.compat import check_same_vocabulary  # noqa: E402
from specdec.config import SamplingParams, SpecConfig  # noqa: E402
from specdec.drafters import ModelDrafter  # noqa: E402
from specdec.engine import Engine  # noqa: E402
from specdec.loading import load_backend  # noqa: E402
from specdec.models import CATALOG, cache_root, status  # noqa: E402

pytestmark = pytest.mark.slow
DRAFT = "qwen2.5-coder-0.5b-instruct"


@pytest.fixture(scope="module")
def model():
    found = status(CATALOG[DRAFT], cache_root())
    if not (found.installed or found.gguf_cached):
        pytest.skip(f"{DRAFT}'s weight packages are not installed")
    return load_backend(DRAFT, runtime="llamacpp")


def ids(model, text):
    return model.tokenizer.encode(text)


def test_block_logits_match_steps_and_last_only(model):
    tokens = ids(model, "def add(a, b):\n    return a + b\n\ndef sub(a, b):")
    model.truncate(0)
    block = model.forward(tokens)
    assert block.shape == (len(tokens), model.vocab_size) and block.dtype == torch.float32
    model.truncate(0)
    model.forward(tokens[:-3], last_only=True)
    steps = torch.cat([model.forward([t]) for t in tokens[-3:]])
    assert torch.equal(block[-3:].argmax(-1), steps.argmax(-1))
    assert torch.allclose(block[-3:], steps, atol=0.5), (
        "same positions, same model: near-equal logits"
    )
    model.truncate(0)
    last = model.forward(tokens, last_only=True)
    assert last.shape == (1, model.vocab_size)
    assert torch.allclose(last[0], block[-1], atol=1e-3)


def test_truncate_rolls_the_kv_cache_back(model):
    prefix = ids(model, "import numpy as np\nx = np.")
    model.truncate(0)
    model.forward(prefix, last_only=True)
    clean = model.forward(ids(model, "zeros(3)"))
    model.truncate(len(prefix))
    model.forward(ids(model, "ones(5) + 1"))  # something else after the prefix
    model.truncate(len(prefix))
    again = model.forward(ids(model, "zeros(3)"))
    assert list(model.cached_token_ids) == prefix + ids(model, "zeros(3)")
    assert torch.allclose(clean, again, atol=1e-3), "the discarded tokens left nothing behind"


def test_tokenizer_round_trip_and_chat_template(model):
    text = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)"
    assert model.tokenizer.decode(ids(model, text)) == text
    prompt = model.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False
    )
    assert "<|im_start|>user\nhi<|im_end|>" in prompt and prompt.endswith("<|im_start|>assistant\n")
    assert model.eos_token_ids >= {model.tokenizer.encode("<|im_end|>")[0]}


def test_mixed_pair_passes_the_vocabulary_check_and_decodes():
    target = load_backend(DRAFT, "float32")  # transformers
    draft = load_backend(DRAFT, runtime="llamacpp")
    check_same_vocabulary(target, draft)
    check_same_vocabulary(draft, target)
    prompt = target.tokenizer.encode("def is_prime(n):\n")
    params = SamplingParams(max_tokens=24, temperature=0.0)
    plain = Engine(target).generate(prompt, params, SpecConfig(k=0))
    mixed = Engine(target, ModelDrafter(draft)).generate(prompt, params, SpecConfig(k=4))
    assert mixed.token_ids == plain.token_ids, (
        "a float32 transformers target: exact whatever drafts"
    )
    # the same weights quantized: the llama.cpp draft agrees with the float32 target mostly
    assert mixed.stats.acceptance_rate > 0.5


def test_requantized_types_load_and_agree(tmp_path):
    from specdec.models import ensure_gguf_type

    path = ensure_gguf_type(CATALOG[DRAFT], cache_root(), "q8_0")
    assert path.name.endswith(".q8_0.gguf") and path.stat().st_size > 0
    q8 = load_backend(DRAFT, runtime="llamacpp", gguf_type="q8_0")
    q4 = load_backend(DRAFT, runtime="llamacpp")
    tokens = ids(q4, "for i in range(10):\n    print(")
    agree = (q8.forward(tokens).argmax(-1) == q4.forward(tokens).argmax(-1)).float().mean()
    assert agree > 0.7, "Q8_0 made from the Q4_K_M file predicts much like it"
    with pytest.raises(ValueError, match="GGUF type"):
        ensure_gguf_type(CATALOG[DRAFT], cache_root(), "q2_k")


def test_int8_target_with_llamacpp_q4_0_draft_equals_plain_int8():
    """The default when the extra is installed: the draft on llama.cpp Q4_0, the target in
    batch-invariant int8, so speculative output is plain int8's, token for token."""
    target = load_backend(DRAFT, "int8")
    draft = load_backend(DRAFT, runtime="llamacpp", gguf_type="q4_0")
    engine = Engine(target, ModelDrafter(draft))
    params = SamplingParams(max_tokens=32, temperature=0.0)
    for text in ("def merge_sort(items):\n", "Write a haiku about the sea."):
        prompt = target.tokenizer.encode(text)
        plain = Engine(target).generate(prompt, params, SpecConfig(k=0))
        # A fixed k drafts every round; k=auto may learn that this draft (the target's own
        # size here) does not pay and stop drafting, which is its job, not a failure.
        fixed = engine.generate(prompt, params, SpecConfig(k=4))
        assert fixed.token_ids == plain.token_ids and fixed.stats.drafted_tokens > 0
        assert engine.generate(prompt, params, SpecConfig(k="auto")).token_ids == plain.token_ids


def test_the_self_test_passes_on_this_build(model, tmp_path):
    """The probe ``--draft-runtime auto`` runs before choosing llama.cpp, for real."""
    from specdec.backends.probe import llamacpp_works
    from specdec.models import ensure_gguf

    gguf = ensure_gguf(CATALOG[DRAFT], cache_root())
    result = llamacpp_works(gguf, tmp_path / "probe.json")
    assert result.ok, result.reason


def test_llamacpp_lookup_system_decodes_what_llamacpp_decodes(model, tmp_path):
    """llama.cpp's own prompt-lookup speculation, as a bench system, on the 0.5B: its greedy
    output equals llama.cpp's own plain loop (the reference it is judged against)."""
    import json

    from specdec.cli import main

    out = tmp_path / "bench"
    args = ["bench", "--systems", "llamacpp,llamacpp-lookup", "--workloads", "edit"]
    args += ["--prompts-per-workload", "1", "--max-tokens", "16", "--repeats", "1"]
    args += ["--target", DRAFT, "--draft", DRAFT, "--out", str(out)]
    assert main(args) == 0
    rows = json.loads((out / "results.json").read_text())["summary"]
    lookup = next(row for row in rows if row["system"] == "llamacpp-lookup")
    assert lookup["reference"] == "llamacpp" and lookup["identical"] == 1.0


def test_sequences_share_the_weights_and_keep_their_own_caches(model):
    """Each sequence has its own context over the one loaded model: interleaved passes and
    rollbacks in one leave the other alone, and each gets the logits the model's own context
    gives for the same tokens; a finished sequence's context serves the next one, emptied."""
    a_text = ids(model, "def fib(n):\n    if n < 2:")
    b_text = ids(model, "The quick brown fox")
    model.truncate(0)
    alone_a = model.forward(a_text)
    alone_a_next = model.forward(ids(model, " return n"))
    model.truncate(0)
    alone_b = model.forward(b_text, last_only=True)
    first, second = model.sequence(), model.sequence()
    assert torch.equal(first.forward(a_text), alone_a)
    assert torch.equal(second.forward(b_text, last_only=True), alone_b)
    first.forward(ids(model, " something else"))
    first.truncate(len(a_text))  # a rejected block rolled back
    assert torch.equal(first.forward(ids(model, " return n")), alone_a_next)
    assert list(second.cached_token_ids) == b_text
    contexts = len(model._free)
    del first
    assert len(model._free) == contexts + 1
    third = model.sequence()
    assert len(model._free) == contexts and not third.cached_token_ids
    assert torch.equal(third.forward(a_text), alone_a)


def test_the_server_decodes_each_request_on_its_own_llamacpp_sequence(model):
    """serve --target-runtime llamacpp: concurrent requests, each on a context of its own,
    each gives what the engine gives for it alone (the same k)."""
    from concurrent.futures import ThreadPoolExecutor

    import openai

    from servers import MODEL, Running

    running = Running(model, model, model.tokenizer, max_active=4)
    try:
        assert running.scheduler.batched is None and running.scheduler.max_length == 8192
        prompts = ["def is_prime(n):", "Name three colours:", "import os\nimport", "SELECT"]

        def one(prompt):
            client = openai.OpenAI(base_url=running.url + "/v1", api_key="x", max_retries=0)
            result = client.completions.create(
                model=MODEL,
                prompt=prompt,
                max_tokens=16,
                temperature=0,
                extra_body={"num_speculative_tokens": 3},
            )
            return result.choices[0].text

        with ThreadPoolExecutor(4) as pool:
            texts = list(pool.map(one, prompts))
    finally:
        running.close()
    params = SamplingParams(max_tokens=16, temperature=0.0)
    for prompt, text in zip(prompts, texts, strict=True):
        engine = Engine(model.sequence(), ModelDrafter(model.sequence()))
        expected = engine.generate(model.tokenizer.encode(prompt), params, SpecConfig(k=3))
        assert text == expected.text, prompt
