"""Statistical exactness of the verifier, every emitted position counted, with stated power.

Per-position distributions are fixed tables (context-free): the draft's ``[K, V]`` and the
target's ``[K + 1, V]``. A round reaches position i when drafts 0..i-1 were accepted; the
token emitted there (an accepted draft, the recovered token, or at i = K the bonus token)
must follow target_probs[i]. Every position is counted, the bonus position included. Each
check is a chi-square test at SIGNIFICANCE (1e-4).

Power. ``emitted_distributions`` computes in closed form what a verifier emits at each
position and how often it gets there (``test_the_closed_form_is_the_theorem`` checks it gives
the target for the correct verifier). Each MUTANT is a classic bug, injected by handing the
real ``verify_stochastic`` what the buggy code would hand it:

- ``bonus from the wrong row``: the bonus sampled from target_probs[K - 1];
- ``residual for the bonus``: the bonus sampled from norm(max(0, target[K] - draft[K - 1]));
- ``draft probs not renormalised``: drafts sampled from the filtered distribution, verified
  with the filtered but unnormalised one (transformers' assisted generation, 2026);
- ``top-p without renormalisation``: the same filter bug on both sides.

Against a mutant, the count at position i (n_i = DRAWS x P(reach i)) gives a noncentral
chi-square with lambda = n_i * sum((mutant - target)^2 / target), and any mass on a token
the target forbids is caught with probability 1 - (1 - mass)^n_i. With DRAWS = 10,000 and
the drafts a perturbed copy of the target (logits + 0.5 x noise, as a same-family draft
would be), every mutant's best position rejects with probability >= 0.99 (computed in
``test_the_sample_size_has_the_stated_power``; most are 1.000), and
``test_each_mutant_is_caught`` runs each mutant and requires the check to fail.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from scipy import stats

from helpers import SIGNIFICANCE, assert_same_distribution
from specdec.config import SamplingParams
from specdec.sampling import PositionNoise, logits_to_probs, position_noise, race, race_winner
from specdec.verify import verify_coupled, verify_stochastic

VOCAB, K, DRAWS = 8, 3, 10_000
POWER = 0.99


def random_logits(seed: int, rows: int) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 1.5


@dataclass(frozen=True)
class Case:
    params: SamplingParams
    target_logits: torch.Tensor  # [K + 1, V]
    draft_logits: torch.Tensor  # [K, V]

    @property
    def target_probs(self) -> torch.Tensor:
        return logits_to_probs(self.target_logits, self.params)

    @property
    def draft_probs(self) -> torch.Tensor:
        return logits_to_probs(self.draft_logits, self.params)


def make_case(params: SamplingParams, seed: int = 2) -> Case:
    target_logits = random_logits(seed, K + 1)
    return Case(params, target_logits, target_logits[:K] + 0.5 * random_logits(seed + 100, K))


SETTINGS = {
    "temperature 1": SamplingParams(temperature=1.0),
    "temperature 0.7, top-k 3": SamplingParams(temperature=0.7, top_k=3),
    "top-p 0.6": SamplingParams(temperature=1.0, top_p=0.6),
    "temperature 0.8, top-k 5, top-p 0.7": SamplingParams(temperature=0.8, top_k=5, top_p=0.7),
}


def unnormalised(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The filtered distribution before renormalisation: what a filter that forgets to
    divide by the kept mass returns."""
    full = logits_to_probs(logits, SamplingParams(temperature=params.temperature))
    return full * (logits_to_probs(logits, params) > 0)


def correct(case: Case):
    """(drafts sampled from, draft_probs verified with, target_probs verified with)."""
    return case.draft_probs, case.draft_probs, case.target_probs


def bonus_from_the_wrong_row(case: Case):
    target = case.target_probs.clone()
    target[K] = target[K - 1]
    return case.draft_probs, case.draft_probs, target


def residual_for_the_bonus(case: Case):
    target = case.target_probs.clone()
    residual = torch.clamp(target[K] - case.draft_probs[K - 1], min=0.0)
    target[K] = residual / residual.sum()
    return case.draft_probs, case.draft_probs, target


def draft_probs_not_renormalised(case: Case):
    return case.draft_probs, unnormalised(case.draft_logits, case.params), case.target_probs


def top_p_without_renormalisation(case: Case):
    return (
        case.draft_probs,
        unnormalised(case.draft_logits, case.params),
        unnormalised(case.target_logits, case.params),
    )


# Each mutant with the setting where its bug shows (a filter bug needs a filter).
MUTANTS = {
    "bonus from the wrong row": (bonus_from_the_wrong_row, "temperature 1"),
    "residual for the bonus": (residual_for_the_bonus, "temperature 1"),
    "draft probs not renormalised": (
        draft_probs_not_renormalised,
        "temperature 0.8, top-k 5, top-p 0.7",
    ),
    "top-p without renormalisation": (
        top_p_without_renormalisation,
        "temperature 0.8, top-k 5, top-p 0.7",
    ),
}


def emitted_distributions(sampled_from, draft_probs, target_probs):
    """Closed form of what ``verify_stochastic`` emits at each position 0..K, and the
    probability that a round reaches each position."""
    sampled_from, draft_probs, target_probs = (
        np.asarray(a, dtype=float) for a in (sampled_from, draft_probs, target_probs)
    )
    reach, dists, reaches = 1.0, [], []
    for i in range(K):
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(draft_probs[i] > 0, target_probs[i] / draft_probs[i], 1.0)
        accepted = sampled_from[i] * np.minimum(1.0, ratio)  # P(draft = x and accepted)
        residual = np.maximum(0.0, target_probs[i] - draft_probs[i])
        if residual.sum() > 1e-6:
            residual = residual / residual.sum()
        else:
            residual = target_probs[i] / target_probs[i].sum()  # the verifier's fallback
        dists.append(accepted + (1.0 - accepted.sum()) * residual)
        reaches.append(reach)
        reach *= accepted.sum()
    dists.append(target_probs[K] / target_probs[K].sum())  # the bonus
    reaches.append(reach)
    return dists, reaches


def rejection_power(target: np.ndarray, mutant: np.ndarray, n: float) -> float:
    """P(the chi-square check rejects) when n tokens come from ``mutant`` (noncentral
    chi-square; or certain detection of a token the target forbids)."""
    forbidden = target == 0
    caught_by_forbidden = 1.0 - (1.0 - mutant[forbidden].sum()) ** n
    allowed = ~forbidden
    lam = n * float(((mutant[allowed] - target[allowed]) ** 2 / target[allowed]).sum())
    df = int(allowed.sum()) - 1
    critical = stats.chi2.ppf(1.0 - SIGNIFICANCE, df)
    return max(caught_by_forbidden, float(stats.ncx2.sf(critical, df, lam)))


def emitted_counts(sampled_from, draft_probs, target_probs, seed: int, point_mass=False):
    """Counts of the token emitted at each position 0..K over DRAWS rounds."""
    generator = torch.Generator().manual_seed(seed)
    counts = np.zeros((K + 1, VOCAB))
    for _ in range(DRAWS):
        drafts = torch.multinomial(sampled_from, 1, generator=generator).squeeze(1)
        result = verify_stochastic(
            drafts, None if point_mass else draft_probs, target_probs, generator
        )
        for position, token_id in enumerate(result.token_ids):
            counts[position, token_id] += 1
    return counts


def assert_every_position_follows(counts: np.ndarray, target_probs: torch.Tensor) -> None:
    for position in range(K + 1):
        assert counts[position].sum() > 100, f"position {position} is seldom reached"
        assert_same_distribution(counts[position], target_probs[position].numpy())


@pytest.mark.parametrize("name", list(SETTINGS))
def test_every_emitted_position_follows_the_target(name):
    case = make_case(SETTINGS[name])
    counts = emitted_counts(*correct(case), seed=3)
    assert_every_position_follows(counts, case.target_probs)


def test_deterministic_drafter_as_point_mass_follows_the_target():
    """A deterministic drafter (prompt lookup) proposes fixed tokens, here each position's
    most likely one, verified as point masses (q = 1)."""
    case = make_case(SamplingParams())
    always_the_mode = torch.nn.functional.one_hot(case.target_probs[:K].argmax(-1), VOCAB)
    counts = emitted_counts(always_the_mode.float(), None, case.target_probs, 5, point_mass=True)
    assert_every_position_follows(counts, case.target_probs)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_the_closed_form_is_the_theorem(name):
    """The closed form gives exactly the target for the correct verifier, and something
    else for every mutant (else the power computation would be vacuous)."""
    case = make_case(SETTINGS[name])
    dists, reaches = emitted_distributions(*correct(case))
    for position in range(K + 1):
        np.testing.assert_allclose(dists[position], case.target_probs[position], atol=1e-6)
    assert reaches[K] > 0.2, "the bonus position must be reached often"


@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_the_sample_size_has_the_stated_power(mutant):
    make_inputs, setting = MUTANTS[mutant]
    case = make_case(SETTINGS[setting])
    dists, reaches = emitted_distributions(*make_inputs(case))
    target = case.target_probs.numpy().astype(float)
    power = max(rejection_power(target[i], dists[i], DRAWS * reaches[i]) for i in range(K + 1))
    assert power >= POWER, f"{mutant}: power {power:.3f} < {POWER} with {DRAWS} draws"


@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_each_mutant_is_caught(mutant):
    """The injected bug runs through the real verifier; the same check must fail."""
    make_inputs, setting = MUTANTS[mutant]
    case = make_case(SETTINGS[setting])
    counts = emitted_counts(*make_inputs(case), seed=7)
    with pytest.raises(AssertionError, match="differs|impossible"):
        assert_every_position_follows(counts, case.target_probs)


# ---- coupled verification ----------------------------------------------------------


def keyed_samples(probs: torch.Tensor, noise: list[PositionNoise]) -> list[int]:
    """Each row's race against its position's noise, as the engine runs it (``race_winner``)."""
    return [race_winner(row, row_noise) for row, row_noise in zip(probs, noise, strict=True)]


def coupled_counts(case: Case, seed_base: int) -> np.ndarray:
    """Each draw is a request with its own seed: drafts race the draft distribution against
    the positions' noise, the target races its own against the same noise."""
    counts = np.zeros((K + 1, VOCAB))
    draft_probs, target_probs = case.draft_probs, case.target_probs
    for draw in range(DRAWS):
        noise = [PositionNoise(seed_base + draw, i, VOCAB) for i in range(K + 1)]
        drafts = torch.tensor(keyed_samples(draft_probs, noise[:K]))
        result = verify_coupled(drafts, keyed_samples(target_probs, noise))
        for position, token_id in enumerate(result.token_ids):
            counts[position, token_id] += 1
    return counts


@pytest.mark.parametrize("name", ["temperature 1", "temperature 0.8, top-k 5, top-p 0.7"])
def test_coupled_verification_follows_the_target(name):
    case = make_case(SETTINGS[name])
    assert_every_position_follows(coupled_counts(case, seed_base=1_000_000), case.target_probs)


def test_coupled_verification_emits_the_targets_own_keyed_samples():
    """Whatever the drafts, each emitted token is the target's race winner at its position:
    the output cannot depend on the drafter."""
    case = make_case(SETTINGS["temperature 1"])
    for seed in range(200):
        noise = torch.stack([position_noise(seed, i, VOCAB) for i in range(K + 1)])
        plain = race(case.target_probs, noise).tolist()  # the whole rows' races
        keyed = [PositionNoise(seed, i, VOCAB) for i in range(K + 1)]
        samples = keyed_samples(case.target_probs, keyed)
        for drafts in (race(case.draft_probs, noise[:K]), torch.tensor([seed % VOCAB] * K)):
            result = verify_coupled(drafts, samples)
            assert result.token_ids == plain[: len(result.token_ids)]
