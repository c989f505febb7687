"""Greedy speculative output equals plain greedy output, token for token, in float32."""

import pytest

from helpers import backend, tiny_llama
from specdec import Engine, SamplingParams, SpecConfig
from specdec.drafters import ModelDrafter

PROMPTS = {
    "one token": [5],
    "short": [8, 5, 12, 12, 15],
    "long": [(7 * i + 3) % 31 + 1 for i in range(40)],
}


@pytest.fixture(scope="module")
def engines(target_model, draft_model):
    plain = Engine(backend(target_model))
    speculative = Engine(backend(target_model), ModelDrafter(backend(draft_model)))
    return plain, speculative


@pytest.mark.parametrize("k", range(1, 9))
@pytest.mark.parametrize("prompt", list(PROMPTS))
def test_greedy_equals_plain(engines, k, prompt):
    plain, speculative = engines
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    expected = plain.generate(PROMPTS[prompt], params)
    out = speculative.generate(PROMPTS[prompt], params, SpecConfig(k=k))
    assert out.token_ids == expected.token_ids
    assert len(out.token_ids) == 48 and out.finish_reason == "length"
    assert out.stats.accepted_tokens > 0, "the pair should agree sometimes, or nothing is tested"
    assert out.stats.rounds < expected.stats.rounds


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 7, 13])
@pytest.mark.parametrize("k", [3, 5])
def test_max_tokens_cut_mid_round(engines, k, max_tokens):
    plain, speculative = engines
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    out = speculative.generate(PROMPTS["short"], params, SpecConfig(k=k))
    assert out.token_ids == plain.generate(PROMPTS["short"], params).token_ids
    assert len(out.token_ids) == max_tokens


def test_identical_draft_accepts_everything(target_model):
    """A draft that IS the target: every draft accepted, every round ends with a bonus."""
    plain = Engine(backend(target_model))
    same = Engine(backend(target_model), ModelDrafter(backend(tiny_llama(seed=0))))
    params = SamplingParams(max_tokens=41, temperature=0.0, ignore_eos=True)
    out = same.generate(PROMPTS["short"], params, SpecConfig(k=4))
    assert out.token_ids == plain.generate(PROMPTS["short"], params).token_ids
    assert out.stats.acceptance_rate == 1.0
    assert out.stats.rounds == 9 and out.stats.mean_accepted_length == pytest.approx(41 / 9)


def test_eos_inside_an_accepted_block_ends_the_output(target_model, draft_model):
    """Declare a token that greedy decoding produces to be EOS: both paths stop at its first
    occurrence, and in some configuration it arrives as an accepted draft mid-block."""
    params = SamplingParams(max_tokens=48, temperature=0.0)
    reference = Engine(backend(target_model)).generate(PROMPTS["long"], params)
    ended_mid_block = 0
    for eos in sorted(set(reference.token_ids[2:]))[:6]:
        plain_target = backend(target_model)
        plain_target.eos_token_ids = frozenset({eos})
        expected = Engine(plain_target).generate(PROMPTS["long"], params)
        for k in (2, 4, 6):
            target = backend(target_model)
            target.eos_token_ids = frozenset({eos})
            engine = Engine(target, ModelDrafter(backend(draft_model)))
            out = engine.generate(PROMPTS["long"], params, SpecConfig(k=k))
            assert out.token_ids == expected.token_ids
            assert out.token_ids[-1] == eos and eos not in out.token_ids[:-1]
            assert out.finish_reason == "stop"
            last = out.chunks[-1]
            ended_mid_block += last.num_from_draft == len(last.token_ids)
    assert ended_mid_block > 0, "no case put EOS among accepted drafts"


def test_engine_reuses_a_cached_prefix_and_stays_exact(engines):
    plain, speculative = engines
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    first = speculative.generate(PROMPTS["long"], params, SpecConfig(k=4))
    # Same prompt again, then a prompt that shares a prefix: caches are reused and cut back.
    again = speculative.generate(PROMPTS["long"], params, SpecConfig(k=4))
    other = speculative.generate(PROMPTS["long"][:25], params, SpecConfig(k=3))
    assert first.token_ids == again.token_ids == plain.generate(PROMPTS["long"], params).token_ids
    assert other.token_ids == plain.generate(PROMPTS["long"][:25], params).token_ids
