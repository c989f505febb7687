"""Log-probabilities of emitted tokens (``SamplingParams.logprobs``): by hand, against a
full forward pass, and bit for bit between speculative and plain decoding on the
batch-invariant int8 and int4 runtimes."""

import copy
import math

import pytest
import torch

from helpers import backend, random_ids
from specdec import Engine, SamplingParams, SpecConfig
from specdec.backends.quant.convert import make_int4_batch_invariant, make_int8_batch_invariant
from specdec.drafters import ModelDrafter
from specdec.logprobs import TokenLogprob, token_logprobs


def test_token_logprobs_by_hand():
    logits = torch.tensor([[0.0, math.log(3.0), 0.0, -1e9], [2.0, 2.0, 2.0, 2.0]])
    first, second = token_logprobs(logits, [2, 3], top=2)
    # row 0: probabilities 1/5, 3/5, 1/5, ~0
    assert first.token_id == 2 and first.logprob == pytest.approx(math.log(1 / 5), abs=1e-6)
    assert first.top[0][0] == 1 and first.top[0][1] == pytest.approx(math.log(3 / 5), abs=1e-6)
    assert first.top[1][1] == pytest.approx(math.log(1 / 5), abs=1e-6)
    assert second.logprob == pytest.approx(math.log(1 / 4), abs=1e-6)
    assert token_logprobs(logits, [0], top=0) == [TokenLogprob(0, first.top[1][1], (), 2)]
    assert (first.rank, second.rank) == (2, 1)  # 1 + the tokens more likely (ties share)


@pytest.mark.parametrize("bad", [-1, 21, True, 2.0, "3"])
def test_logprobs_out_of_range_are_refused(bad):
    with pytest.raises(ValueError, match="logprobs must be an integer in"):
        SamplingParams(logprobs=bad)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_logprobs_are_the_target_models_own(target_model, draft_model, temperature):
    """Each token's value is log_softmax of the target's raw logits at its position (one
    forward over the whole text), whatever the temperature and top-k; the top list is that
    row's most likely tokens, and the emitted token can be in it."""
    prompt = random_ids(3, 6)
    params = SamplingParams(
        max_tokens=20, temperature=temperature, top_k=5, seed=2, logprobs=4, ignore_eos=True
    )
    engine = Engine(backend(target_model), ModelDrafter(backend(draft_model)))
    out = engine.generate(prompt, params, SpecConfig(k=3))
    assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids) == 20
    with torch.no_grad():
        logits = target_model(torch.tensor([prompt + out.token_ids])).logits[0]
    rows = torch.log_softmax(logits[len(prompt) - 1 : -1].float(), dim=-1)
    for row, entry, token_id in zip(rows, out.logprobs, out.token_ids, strict=True):
        assert entry.token_id == token_id
        assert entry.logprob == pytest.approx(float(row[token_id]), abs=1e-4)
        expected_top = torch.topk(row, 4).indices.tolist()
        assert [t for t, _ in entry.top] == expected_top
        assert all(a >= b for (_, a), (_, b) in zip(entry.top, entry.top[1:], strict=False))
    if temperature == 0.0:
        assert all(entry.top[0][0] == entry.token_id for entry in out.logprobs)


def test_no_logprobs_unless_asked(target_model):
    out = Engine(backend(target_model)).generate([3, 4], SamplingParams(max_tokens=5))
    assert out.logprobs is None and all(chunk.logprobs is None for chunk in out.chunks)


def test_a_stop_string_cuts_the_logprobs_with_the_tokens(target_model, tokenizer):
    engine = Engine(backend(target_model, tokenizer))
    free = engine.generate([3, 4], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))
    assert len(free.text) > 8
    stop = free.text[5:7]
    out = engine.generate(
        [3, 4],
        SamplingParams(max_tokens=30, temperature=0, stop=(stop,), logprobs=2, ignore_eos=True),
    )
    assert out.finish_reason == "stop" and len(out.token_ids) < len(free.token_ids)
    assert [e.token_id for e in out.logprobs] == out.token_ids


@pytest.mark.parametrize("convert", [make_int8_batch_invariant, make_int4_batch_invariant])
@pytest.mark.parametrize("k", [1, 4, "auto"])
def test_speculative_logprobs_equal_plain_bit_for_bit(target_model, draft_model, convert, k):
    """On the batch-invariant runtimes a verify pass's rows are the plain steps' rows, so
    the values (and the top lists) are the same floats, greedy and with coupled sampling."""
    # on copies: the conversion changes a model in place, and these are the session's
    target, draft = convert(copy.deepcopy(target_model)), convert(copy.deepcopy(draft_model))
    plain = Engine(backend(target))
    speculative = Engine(backend(target), ModelDrafter(backend(draft)))
    for params in (
        SamplingParams(max_tokens=40, temperature=0.0, logprobs=20, ignore_eos=True),
        SamplingParams(max_tokens=40, temperature=0.9, seed=4, logprobs=3, ignore_eos=True),
    ):
        prompt = random_ids(7, 9)
        expected = plain.generate(prompt, params)
        out = speculative.generate(prompt, params, SpecConfig(k=k, verification="auto"))
        if k != "auto":  # auto may learn not to draft on this pair
            assert out.stats.accepted_tokens > 0, "no drafts accepted: nothing compared"
        assert out.token_ids == expected.token_ids
        assert out.logprobs == expected.logprobs
