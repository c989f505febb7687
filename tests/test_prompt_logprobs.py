"""Log-probabilities of the prompt's tokens (``SamplingParams.prompt_logprobs``): against a
full forward pass, the same in parts and after a cached prefix, and bit for bit on the
batch-invariant int8 and int4 runtimes with the values decoding gives the same tokens."""

import copy

import pytest
import torch

from helpers import backend, random_ids
from specdec import Engine, SamplingParams, SpecConfig
from specdec.backends.batched import BatchedModel
from specdec.backends.quant.convert import make_int4_batch_invariant, make_int8_batch_invariant
from specdec.drafters import ModelDrafter
from specdec.engine import Run


@pytest.mark.parametrize("bad", [-1, 21, True, 2.0, "3"])
def test_prompt_logprobs_out_of_range_are_refused(bad):
    with pytest.raises(ValueError, match="prompt_logprobs must be an integer in"):
        SamplingParams(prompt_logprobs=bad)


# 9 tokens: the first round scores the last one; 40: the prefill does (``first_token``)
@pytest.mark.parametrize("length", [9, 40])
def test_prompt_logprobs_are_the_target_models_own(target_model, draft_model, length):
    """Prompt token i's value is log_softmax of the target's raw logits at position i - 1
    (one forward over the prompt); the first token has none. Asking for them changes no
    output token."""
    prompt = random_ids(5, length)
    engine = Engine(backend(target_model), ModelDrafter(backend(draft_model)))
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    scored = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, prompt_logprobs=3)
    out = engine.generate(prompt, scored, SpecConfig(k=3))
    assert out.token_ids == engine.generate(prompt, params, SpecConfig(k=3)).token_ids
    entries = out.prompt_logprobs
    assert entries is not None and len(entries) == length and entries[0] is None
    with torch.no_grad():
        rows = torch.log_softmax(target_model(torch.tensor([prompt])).logits[0].float(), -1)
    for position in range(1, length):
        entry, row = entries[position], rows[position - 1]
        assert entry is not None and entry.token_id == prompt[position]
        assert entry.logprob == pytest.approx(float(row[prompt[position]]), abs=1e-4)
        assert [t for t, _ in entry.top] == torch.topk(row, 3).indices.tolist()
    # only the first chunk carries them
    assert all(chunk.prompt_logprobs is None for chunk in out.chunks[1:])


def test_no_prompt_logprobs_unless_asked(target_model):
    out = Engine(backend(target_model)).generate([3, 4, 5], SamplingParams(max_tokens=4))
    assert out.prompt_logprobs is None
    assert all(chunk.prompt_logprobs is None for chunk in out.chunks)


def test_a_one_token_prompt_has_one_entry_none(target_model):
    out = Engine(backend(target_model)).generate(
        [7], SamplingParams(max_tokens=2, prompt_logprobs=0)
    )
    assert out.prompt_logprobs == [None]


@pytest.fixture(scope="module", params=["int8", "int4"])
def quantized(request, target_model, draft_model):
    convert = {"int8": make_int8_batch_invariant, "int4": make_int4_batch_invariant}
    make = convert[request.param]
    # on copies: the conversion changes a model in place, and these are the session's
    return make(copy.deepcopy(target_model)), make(copy.deepcopy(draft_model))


@pytest.mark.parametrize("k", [0, 4])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_a_scored_text_gets_the_values_its_decoding_gave_bit_for_bit(quantized, k, temperature):
    """Decode with logprobs (plain, or speculative where the values come from verify rows),
    then score prompt + output as a prompt: each output token's value and top list are the
    same floats. A prompt row comes from a pass of up to ``Run.SCORE_ROWS`` rows, a
    decoded one from a step or a verify pass; on these runtimes a row is the same bits in
    any pass."""
    target, draft = quantized
    engine = Engine(backend(target), ModelDrafter(backend(draft)))
    prompt = random_ids(11, 8)
    params = SamplingParams(
        max_tokens=30, temperature=temperature, seed=3, logprobs=5, ignore_eos=True
    )
    out = engine.generate(prompt, params, SpecConfig(k=k))
    if k:
        assert out.stats.accepted_tokens > 0, "no drafts accepted: no verify rows compared"
    text = prompt + out.token_ids
    scored = engine.generate(
        text, SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=5), SpecConfig(k=k)
    ).prompt_logprobs
    assert scored is not None and out.logprobs is not None
    assert scored[len(prompt) :] == out.logprobs


def test_in_parts_and_after_a_held_prefix_the_values_are_the_same(quantized, monkeypatch):
    """A server prefills in parts (``Run.prefill_part`` with a row budget) and reuses a
    prefix a sequence holds; neither changes a value: each part's rows are scored, and a
    prefix held from before (which kept no logits) is scored again."""
    target, draft = quantized
    prompt = random_ids(12, 70)
    params = SamplingParams(max_tokens=3, temperature=0.0, prompt_logprobs=2)
    engine = Engine(backend(target), ModelDrafter(backend(draft)))
    whole = engine.generate(prompt, params, SpecConfig(k=2))
    again = engine.generate(prompt, params, SpecConfig(k=2))  # the target holds the prompt
    assert again.prompt_logprobs == whole.prompt_logprobs
    assert whole.prompt_logprobs is not None and len(whole.prompt_logprobs) == 70
    monkeypatch.setattr(Run, "SCORE_ROWS", 16)  # rows of a pass, too
    for rows in (1, 7, 50):
        run = Engine(backend(target), ModelDrafter(backend(draft))).begin(
            prompt, params, SpecConfig(k=2)
        )
        parts = []
        while not run.prefilled:
            parts.append(run.prefill_part(rows))
        assert all(0 < fed <= 2 * rows for fed in parts)  # target, then the draft's part
        chunks = list(run.rounds())
        assert chunks[0].prompt_logprobs == whole.prompt_logprobs
        assert [t for c in chunks for t in c.token_ids] == whole.token_ids


def test_a_prompt_that_begins_like_one_scored_before_reuses_its_scores(quantized):
    """Sequences of one model share prompt scores as they share keys and values
    (``ModelSequence.prefix_scores``): a prompt that begins like one scored before (another
    choice after a multiple-choice question's context) computes only its own tail, and its
    values are those it gets scored alone, bit for bit; scores with another top are not
    shared."""
    target, _ = quantized
    shared = random_ids(13, 50)
    first, second = shared + random_ids(14, 6), shared + random_ids(15, 9)
    params = SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=3, ignore_eos=True)
    batched = BatchedModel(target)
    fed: list[int] = []
    forward_many = batched.forward_many

    def counted(work, parents=None):
        fed.append(sum(len(tokens) for _, tokens, _ in work))
        return forward_many(work, parents)

    batched.forward_many = counted  # type: ignore[method-assign]
    Engine(batched.sequence()).generate(first, params)
    before = sum(fed)
    out = Engine(batched.sequence()).generate(second, params)
    alone = Engine(BatchedModel(target).sequence()).generate(second, params)
    assert out.prompt_logprobs == alone.prompt_logprobs and out.token_ids == alone.token_ids
    # rows fed: the 9 tokens after the shared 49 (the 50th's score is known), one step
    assert sum(fed) - before == len(second) - len(shared) + 1 + 1
    other_top = SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=2, ignore_eos=True)
    before = sum(fed)
    Engine(batched.sequence()).generate(second, other_top)
    assert sum(fed) - before == len(second) + 1  # scored afresh from an empty cache
