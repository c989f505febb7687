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


# ---- the exponential race with the noise of a few tokens (race_winner) ------------------


def race_rows():
    """Distributions of every shape a request produces: sharp and flat softmaxes of a
    151,936-token row, top-k and top-p cuts, a trimmed draft's zeros, a point mass, equal
    probabilities, short rows."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(151_936, generator=generator) * 4
    rows = {
        f"temperature {t}": logits_to_probs(logits[None], SamplingParams(temperature=t))[0]
        for t in (0.2, 0.7, 1.0, 3.0)
    }
    rows["top-k 40"] = logits_to_probs(logits[None], SamplingParams(temperature=1, top_k=40))[0]
    rows["top-p 0.9"] = logits_to_probs(logits[None], SamplingParams(temperature=1, top_p=0.9))[0]
    trimmed = torch.zeros(151_936)
    trimmed[::5] = torch.softmax(logits[::5], 0)
    rows["trimmed"] = trimmed
    rows["point mass"] = torch.zeros(151_936).index_fill_(0, torch.tensor([77]), 1.0)
    rows["uniform"] = torch.full((151_936,), 1 / 151_936)
    rows["few tokens"] = torch.tensor([0.1, 0.0, 0.6, 0.3])
    rows["one token"] = torch.tensor([1.0])
    return rows


@pytest.mark.parametrize("name", list(race_rows()))
def test_the_race_winner_is_the_whole_rows_race_winner(name):
    """The same token as the exponential race over the whole noise row, seed by seed and
    position by position (what keeps coupled sampling's text), in float32 and float64."""
    from specdec.sampling import PositionNoise, race, race_winner

    probs = race_rows()[name]
    for seed, position in [(0, 0), (1, 5), (2**63 + 7, 1000), (12345, 99_999)] + [
        (s, s) for s in range(3, 40)
    ]:
        noise = PositionNoise(seed, position, probs.shape[0])
        expected = int(race(probs, noise.row()))
        assert race_winner(probs, noise) == expected, (seed, position)
        assert race_winner(probs.double(), noise) == expected, (seed, position)


def test_a_tokens_noise_is_the_rows_and_ties_go_to_the_first_token():
    """``at`` gives the row's very numbers; equal scores: the lower token id, as argmax."""
    import numpy as np

    from specdec.sampling import PositionNoise, race, race_winner

    noise = PositionNoise(5, 3, 151_936)
    index = np.array([0, 7, 151_935, 42, 7])
    assert torch.equal(torch.from_numpy(noise.at(index)), noise.row()[index])
    tied = PositionNoise(5, 3, 6)
    tied.uniform = np.array([0.5, 0.25, 0.5, 0.5, 0.9, 0.25])
    probs = torch.tensor([0.1, 0.2, 0.2, 0.2, 0.1, 0.2])  # tokens 1 and 5 score the same
    assert race_winner(probs, tied) == int(race(probs, tied.row())) == 1


def test_coupled_picks_are_the_race_over_the_whole_row():
    """``Sampler.pick`` in coupled mode: the race's winner at that position, its noise
    kept for the verifier until the position is settled."""
    from specdec.sampling import position_noise, race

    sampler = Sampler(SamplingParams(temperature=0.8, seed=11), coupled=True)
    logits = torch.randn(151_936, generator=torch.Generator().manual_seed(1))
    for position in (0, 1, 2):
        token, probs = sampler.pick(logits, position)
        assert probs is not None
        assert token == int(race(probs, position_noise(11, position, 151_936)))
    assert sorted(sampler._noise) == [0, 1, 2]
    sampler.settle(2)
    assert sorted(sampler._noise) == [2]


def test_sample_follows_the_distribution_and_never_picks_a_zero():
    """The inverse distribution function: chi-square over 20,000 draws of a row with zeros
    between its tokens (significance 1e-4), none of them a zero-probability token; a
    uniform that rounds up to the total still lands on the last token with mass."""
    from scipy.stats import chisquare

    probs = torch.tensor([0.0, 0.05, 0.0, 0.5, 0.15, 0.0, 0.3, 0.0])
    generator = make_generator(7)
    counts = torch.bincount(
        torch.tensor([sample(probs, generator) for _ in range(20_000)]), minlength=8
    )
    assert counts[probs == 0].sum() == 0
    kept = probs > 0
    expected = probs[kept].double() / probs[kept].double().sum() * 20_000
    assert chisquare(counts[kept].double().numpy(), expected.numpy()).pvalue > 1e-4


@pytest.mark.parametrize(("uniform", "expected"), [(0.0, 1), (1.0, 2)])
def test_sample_at_the_ends_of_the_unit_interval(monkeypatch, uniform, expected):
    """A uniform of 0 picks the first token with mass, one that rounds up to the total the
    last: never a zero-probability token before or after them."""
    probs = torch.tensor([0.0, 0.25, 0.75, 0.0])
    drawn = torch.tensor([uniform], dtype=torch.float64)
    monkeypatch.setattr(torch, "rand", lambda *args, **kwargs: drawn)
    assert sample(probs, make_generator(0)) == expected


def test_argmax_rows_is_torchs_argmax_ties_nans_and_infinities_included():
    from specdec.sampling import argmax_rows

    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(6, 1000, generator=generator)
    rows[1, 10] = rows[1, 700] = rows[1].max() + 1.0  # a tie: the first wins
    rows[2, 300] = float("nan")  # a NaN counts as the largest
    rows[3] = float("-inf")  # nothing finite: the first
    rows[4, 999] = float("inf")
    rows[5, :500] = rows[5, 500:]  # every value twice
    for tensor in (rows, rows.double(), rows.bfloat16()):
        assert argmax_rows(tensor) == tensor.argmax(dim=-1).tolist()
    assert argmax_rows(rows[0]) == [int(rows[0].argmax())]
