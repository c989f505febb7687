"""Statistical exactness of the verifier: emitted tokens follow the target distribution.

Per-position distributions are fixed tables (context-free), so the token emitted at
position i, whenever the round reaches it, must follow target_probs[i]. Drafts are sampled
from draft_probs, as the theorem requires. Each test is a chi-square test at SIGNIFICANCE.
"""

import numpy as np
import pytest
import torch

from helpers import SIGNIFICANCE, assert_same_distribution
from specdec.config import SamplingParams
from specdec.sampling import logits_to_probs
from specdec.verify import verify_stochastic

VOCAB, K, DRAWS = 8, 3, 8_000


def random_logits(seed: int, rows: int) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 1.5


def emitted_counts(draft_probs, target_probs, seed, draft_probs_for_verify=None, point_mass=False):
    """Counts of the 1st emitted token and of the 2nd (when the round emits one)."""
    generator = torch.Generator().manual_seed(seed)
    first, second = np.zeros(VOCAB), np.zeros(VOCAB)
    verify_with = draft_probs if draft_probs_for_verify is None else draft_probs_for_verify
    for _ in range(DRAWS):
        drafts = torch.multinomial(draft_probs, 1, generator=generator).squeeze(1)
        result = verify_stochastic(
            drafts, None if point_mass else verify_with, target_probs, generator
        )
        first[result.token_ids[0]] += 1
        if len(result.token_ids) > 1:
            second[result.token_ids[1]] += 1
    return first, second


SETTINGS = {
    "temperature 1": SamplingParams(temperature=1.0),
    "temperature 0.7, top-k 3": SamplingParams(temperature=0.7, top_k=3),
    "top-p 0.8": SamplingParams(temperature=1.0, top_p=0.8),
    "temperature 1.3, top-k 5, top-p 0.9": SamplingParams(temperature=1.3, top_k=5, top_p=0.9),
}


@pytest.mark.parametrize("name", list(SETTINGS))
def test_emitted_tokens_follow_the_target(name):
    params = SETTINGS[name]
    draft_probs = logits_to_probs(random_logits(1, K), params)
    target_probs = logits_to_probs(random_logits(2, K + 1), params)
    first, second = emitted_counts(draft_probs, target_probs, seed=3)
    assert_same_distribution(first, target_probs[0].numpy())
    assert_same_distribution(second, target_probs[1].numpy())


def test_deterministic_drafter_as_point_mass_follows_the_target():
    target_probs = logits_to_probs(random_logits(4, K + 1), SamplingParams())
    always_token_2 = torch.zeros(K, VOCAB)
    always_token_2[:, 2] = 1.0
    first, second = emitted_counts(always_token_2, target_probs, seed=5, point_mass=True)
    assert_same_distribution(first, target_probs[0].numpy())
    assert_same_distribution(second, target_probs[1].numpy())


def test_the_check_catches_draft_probs_that_miss_the_filter():
    """Negative control, the bug DESIGN.md warns about: drafts sampled from the top-k
    filtered distribution but verified against the unfiltered one. The test must fail."""
    params = SamplingParams(temperature=0.7, top_k=2)
    draft_logits = random_logits(1, K)
    sampled_from = logits_to_probs(draft_logits, params)
    unfiltered = logits_to_probs(draft_logits, SamplingParams(temperature=0.7))
    target_probs = logits_to_probs(random_logits(2, K + 1), params)
    first, _ = emitted_counts(sampled_from, target_probs, seed=6, draft_probs_for_verify=unfiltered)
    with pytest.raises(AssertionError, match="differs|impossible"):
        assert_same_distribution(first, target_probs[0].numpy())
    assert SIGNIFICANCE < 1e-3
