import pytest
import torch

from specdec.config import SamplingParams
from specdec.sampling import Sampler, logits_to_probs, make_generator, sample

LOGITS = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.1]]))


def test_temperature_one_is_softmax():
    assert torch.allclose(logits_to_probs(LOGITS, SamplingParams()), LOGITS.exp())


def test_greedy_is_one_hot_on_the_argmax():
    assert logits_to_probs(LOGITS, SamplingParams(temperature=0)).tolist() == [[1.0, 0, 0, 0]]


def test_low_temperature_sharpens():
    cold = logits_to_probs(LOGITS, SamplingParams(temperature=0.5))
    expected = torch.tensor([0.5, 0.25, 0.15, 0.1]) ** 2
    assert torch.allclose(cold[0], expected / expected.sum())


def test_top_k_keeps_k_tokens_renormalised():
    probs = logits_to_probs(LOGITS, SamplingParams(top_k=2))
    assert torch.allclose(probs[0], torch.tensor([2 / 3, 1 / 3, 0, 0]))


@pytest.mark.parametrize(
    "top_p, kept", [(0.5, 1), (0.6, 2), (0.75, 2), (0.76, 3), (0.9, 3), (0.91, 4)]
)
def test_top_p_keeps_the_smallest_set_reaching_the_mass(top_p, kept):
    probs = logits_to_probs(LOGITS, SamplingParams(top_p=top_p))
    assert int((probs[0] > 0).sum()) == kept
    assert torch.isclose(probs[0].sum(), torch.tensor(1.0))


def test_filters_apply_to_every_row_independently():
    logits = torch.stack([LOGITS[0], LOGITS[0].flip(0)])
    probs = logits_to_probs(logits, SamplingParams(top_k=1))
    assert probs.tolist() == [[1.0, 0, 0, 0], [0, 0, 0, 1.0]]


def test_generator_is_explicit_and_seeded():
    probs = torch.full((50,), 0.02)
    draws = lambda: [sample(probs, make_generator(7)) for _ in range(3)]  # noqa: E731
    assert draws() == draws()
    state = torch.random.get_rng_state()
    Sampler(SamplingParams(seed=1)).pick(torch.zeros(50))
    assert torch.equal(state, torch.random.get_rng_state()), "the global RNG was touched"


def test_sampler_pick_returns_the_distribution_it_sampled_from():
    token, probs = Sampler(SamplingParams(top_k=2, seed=0)).pick(LOGITS[0])
    assert token in (0, 1) and torch.allclose(probs, torch.tensor([2 / 3, 1 / 3, 0, 0]))
    token, probs = Sampler(SamplingParams(temperature=0)).pick(LOGITS[0])
    assert token == 0 and probs is None


def test_tiny_temperatures_give_the_argmax_not_nan():
    logits = torch.tensor([[1.0, 3.0, 2.0], [0.5, 0.5, -1.0]])
    for temperature in (1e-30, 1e-20, 1e-6):
        probs = logits_to_probs(logits, SamplingParams(temperature=temperature))
        assert torch.isfinite(probs).all()
        assert torch.equal(probs[0], torch.tensor([0.0, 1.0, 0.0]))
        assert torch.equal(probs[1], torch.tensor([0.5, 0.5, 0.0]))  # a tie is shared


@pytest.mark.parametrize("temperature", [1e-300, 1e-45, 1e-40, 2.0**-127])
def test_temperatures_float32_cannot_divide_by_are_greedy(temperature):
    # Issue 45.1: 1e-300 is 0 in float32, so the argmax logit was 0 / 0 = NaN (every
    # seeded token became id 0; unseeded sampling raised).
    params = SamplingParams(temperature=temperature, seed=1)
    assert params.greedy and params.temperature == 0.0
    logits = torch.tensor([[1.0, 3.0, 2.0]])
    assert logits_to_probs(logits, params).tolist() == [[0.0, 1.0, 0.0]]
    assert Sampler(params).pick(logits[0]) == (1, None)
    assert not SamplingParams(temperature=2.0**-126).greedy  # float32's smallest normal


def test_every_bit_of_a_seed_counts():
    # Issue 45.2: torch's manual_seed keeps the low 32 bits (s and s + 2**32 gave one stream).
    def draws(seed):
        return torch.rand(4, generator=make_generator(seed)).tolist()

    for seed in (0, 1, 12345, 2**40 + 3):
        assert draws(seed) == draws(seed)
        assert draws(seed) != draws(seed + 2**32)
        assert draws(seed) != draws(seed + 2**63)
        assert make_generator(seed + 2**32).initial_seed() == seed + 2**32
    assert draws(-1) == draws(2**64 - 1)  # seeds are taken modulo 2**64
    probs = torch.full((1000,), 1e-3)
    assert [sample(probs, make_generator(5)) for _ in range(2)] != [
        sample(probs, make_generator(5 + 2**32)) for _ in range(2)
    ]


def test_a_seeded_generator_restores_like_any_other():
    generator = make_generator(2**33 + 7)
    state = generator.get_state()
    first = torch.rand(5, generator=generator)
    again = torch.Generator()
    again.set_state(state)
    assert torch.equal(torch.rand(5, generator=again), first)
