"""Statistical exactness through the whole engine, with two different tiny transformers.

The target's exact marginal of the 2nd generated token is computed by enumerating the 1st:
P(t2 = y) = sum_x P(t1 = x) P(t2 = y | t1 = x). The engine, drafting k = 2 per round with
max_tokens = 3, reaches the 2nd token by every path: accepted draft, recovered token after a
rejection, bonus token after full acceptance, or a later round.
"""

from dataclasses import replace

import numpy as np
import pytest
import torch

from helpers import VOCAB, assert_same_distribution, backend, perturbed_copy, tiny_llama
from specdec import Engine, SamplingParams, SpecConfig
from specdec.drafters import ModelDrafter
from specdec.sampling import logits_to_probs

PROMPT = [3, 1, 4, 1, 5]
DRAWS = 2000


def second_token_marginal(model, params: SamplingParams) -> np.ndarray:
    with torch.inference_mode():
        first = logits_to_probs(model(torch.tensor([PROMPT])).logits[0, -1], params)
        continuations = torch.tensor([PROMPT + [x] for x in range(VOCAB)])
        second = logits_to_probs(model(continuations).logits[:, -1], params)  # [vocab, vocab]
    return (first @ second).numpy()


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(seed=10, init=0.3)
    draft = perturbed_copy(target, noise=0.05, seed=11)
    return target, draft


SETTINGS = {
    "temperature 1": SamplingParams(temperature=1.0, max_tokens=3, ignore_eos=True),
    "temperature 0.8 top-p 0.9": SamplingParams(
        temperature=0.8, top_p=0.9, max_tokens=3, ignore_eos=True
    ),
}


@pytest.fixture(scope="module")
def sampled(pair):
    """Counts of the 2nd token over DRAWS seeded requests, per setting, and the acceptance."""
    target, draft = pair
    engine = Engine(backend(target), ModelDrafter(backend(draft)))
    results = {}
    for name, params in SETTINGS.items():
        counts = np.zeros(VOCAB)
        accepted = drafted = 0
        for seed in range(DRAWS):
            out = engine.generate(PROMPT, replace(params, seed=seed), SpecConfig(k=3))
            counts[out.token_ids[1]] += 1
            accepted += out.stats.accepted_tokens
            drafted += out.stats.drafted_tokens
        results[name] = counts, accepted / drafted
    return results


@pytest.mark.parametrize("name", list(SETTINGS))
def test_second_token_follows_the_target_marginal(pair, sampled, name):
    counts, acceptance_rate = sampled[name]
    assert 0.2 < acceptance_rate < 0.95, "both acceptance and rejection must be exercised"
    assert_same_distribution(counts, second_token_marginal(pair[0], SETTINGS[name]))


def test_the_engine_check_catches_a_wrong_distribution(sampled):
    """Negative control: another model's marginal differs, and the same check says so."""
    counts, _ = sampled["temperature 1"]
    unrelated = second_token_marginal(tiny_llama(seed=99, init=0.3), SETTINGS["temperature 1"])
    with pytest.raises(AssertionError):
        assert_same_distribution(counts, unrelated)
