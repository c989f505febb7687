"""On the runtimes whose block passes equal their steps (int8, int4), a greedy or seeded
request gives plain decoding's text whatever k=auto chooses, and k=auto's choices depend on
the clock: here the clock is made erratic, so the choices differ run by run, and the text
must not."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from helpers import backend, perturbed_copy, tiny_llama
from specdec import Engine, SamplingParams, SpecConfig
from specdec.drafters import ModelDrafter

PROMPT = [7, 1, 30, 12, 4, 4, 9]


@pytest.fixture(scope="module", params=["int8", "int4"])
def pair(request):
    from specdec.backends.quant.convert import make_int4_batch_invariant, make_int8_batch_invariant

    make = make_int8_batch_invariant if request.param == "int8" else make_int4_batch_invariant
    target = tiny_llama(seed=0)
    return make(target), make(perturbed_copy(target, noise=0.03, seed=1))


def erratic_clock(seed: int):
    """A perf_counter that advances by random amounts: draft and pass costs as noisy as a
    shared machine's, and different for every seed."""
    rng, now = random.Random(seed), [0.0]

    def perf_counter() -> float:
        now[0] += rng.expovariate(1.0) * 0.01
        return now[0]

    return SimpleNamespace(perf_counter=perf_counter)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=48, temperature=0.9, top_k=12, seed=5, ignore_eos=True),
    ],
    ids=["greedy", "seeded"],
)
def test_k_auto_never_changes_the_text(pair, params, monkeypatch):
    target, draft = pair
    plain = Engine(backend(target)).generate(PROMPT, params).token_ids
    choices = set()
    for clock in range(6):
        monkeypatch.setattr("specdec.engine.time", erratic_clock(clock))
        engine = Engine(backend(target), ModelDrafter(backend(draft)))
        out = engine.generate(PROMPT, params, SpecConfig(k="auto", max_k=6))
        assert out.token_ids == plain, f"clock {clock}"
        choices.add(tuple(sorted(out.stats.k_per_round.items())))
    assert len(choices) > 1, "the clock never changed k's choices: nothing was tested"
