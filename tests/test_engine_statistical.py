"""Statistical exactness through the whole engine, every drafter, both verifications.

Two different tiny transformers (the draft a perturbed copy of the target). The target's
exact marginals of the first three generated tokens are computed by enumeration:
P(t3 = z) = sum_{x, y} P(x) P(y | x) P(z | x, y). The engine drafts k = 2 with
max_tokens = 3, so the first round can emit all three tokens and the third is then the
bonus token: positions 0, 1 and 2 are reached by every path (accepted draft, recovered
token, bonus token, a later round) and all three are counted.

Sample size: with DRAWS = 2,000 requests per case and V = 32 cells (df <= 31), the
chi-square test at 1e-4 rejects with probability >= 0.99 whenever the emitted distribution
is off by Cohen's effect size w = sqrt(sum (mutant - target)^2 / target) >= 0.2 (noncentral
chi-square, lambda = DRAWS * w^2 = 80, power 0.991;
``test_the_sample_size_detects_the_stated_effect``
recomputes it). The verifier-level tests (``test_verify_statistical.py``) carry the power
calculation against each classic bug; here ``test_a_wrong_bonus_row_is_caught`` injects one
of them into the engine and requires the check to fail.

A long prompt's first token comes from the prefill's own pass (``Run.first_token``) and
rounds follow it; this prompt is short, so the cases above check the first round drafting
the first token, and ``test_the_first_token_from_the_prefill_keeps_every_position_exact``
lowers the threshold to check the long path, with a negative control of its own.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy import stats

import specdec.engine
from helpers import (
    SIGNIFICANCE,
    VOCAB,
    assert_same_distribution,
    backend,
    perturbed_copy,
    tiny_heads,
    tiny_llama,
)
from specdec import Engine, SamplingParams, SpecConfig
from specdec.drafters import (
    FallbackDrafter,
    ModelDrafter,
    NGramDrafter,
    NGramModel,
    PredictionDrafter,
    PromptLookupDrafter,
)
from specdec.metrics import SpecStats
from specdec.sampling import logits_to_probs
from specdec.verify import verify_stochastic

START = [3, 1, 4, 1, 5]
DRAWS = 2000
POSITIONS = 3
EFFECT = 0.2

SETTINGS = {
    "temperature 1": SamplingParams(temperature=1.0, max_tokens=3, ignore_eos=True),
    "temperature 0.7, top-k 5": SamplingParams(
        temperature=0.7, top_k=5, max_tokens=3, ignore_eos=True
    ),
    "temperature 0.8, top-p 0.9": SamplingParams(
        temperature=0.8, top_p=0.9, max_tokens=3, ignore_eos=True
    ),
    "temperature 0.7, top-k 8, top-p 0.9": SamplingParams(
        temperature=0.7, top_k=8, top_p=0.9, max_tokens=3, ignore_eos=True
    ),
}


def marginals(model, prompt: list[int], params: SamplingParams) -> list[np.ndarray]:
    """The target's exact distribution of generated tokens 1, 2 and 3."""
    with torch.inference_mode():
        first = logits_to_probs(model(torch.tensor([prompt])).logits[0, -1], params)
        pairs = torch.tensor([prompt + [x] for x in range(VOCAB)])
        second = logits_to_probs(model(pairs).logits[:, -1], params)  # [x, y]
        triples = torch.tensor([prompt + [x, y] for x in range(VOCAB) for y in range(VOCAB)])
        third = logits_to_probs(model(triples).logits[:, -1], params)  # [x * V + y, z]
    joint_xy = (first[:, None] * second).reshape(-1)  # P(x, y)
    return [first.numpy(), (first @ second).numpy(), (joint_xy @ third).numpy()]


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(seed=10, init=0.3)
    return target, perturbed_copy(target, noise=0.05, seed=11)


@pytest.fixture(scope="module")
def prompt(pair):
    """START, the target's greedy continuation of it, START again: prompt lookup then
    proposes that continuation, which the target finds likely (drafts get accepted)."""
    greedy = Engine(backend(pair[0])).generate(START, SamplingParams(temperature=0, max_tokens=4))
    return START + greedy.token_ids + START


@pytest.fixture(scope="module")
def make_drafter(pair, prompt):
    target, draft = pair
    # An n-gram model built from the target's own samples after the prompt: its drafts are
    # plausible to the target, often but not always accepted.
    params = SamplingParams(temperature=1.0, max_tokens=3, ignore_eos=True)
    corpus = [
        prompt + Engine(backend(target)).generate(prompt, replace(params, seed=s)).token_ids
        for s in range(30)
    ]
    ngram = NGramModel.build(corpus, order=3, vocab_size=VOCAB)
    # Heads trained on the target's own samples; they score 24 of 32 tokens (q = 0 on the
    # rest) and read the target's features, so each request's drafter wraps its backend.
    # Trained in float32 on every CPU (bfloat16 products, where a CPU has them, make another
    # head on each kind of CPU) and for 720 steps: after the default 240, on an AVX-512 BF16
    # EPYC the EAGLE head's drafts at top-k 8, top-p 0.9 were accepted 3% of the time in
    # bfloat16 and 6% in float32, too close to the 5% floor below; after 720, 25% (21% with
    # coupled verification at top-p 0.9), Medusa's 12-30%.
    heads = {
        kind: tiny_heads(target, kind, steps=720, precision="float32")[0]
        for kind in ("medusa", "eagle")
    }

    # A predicted output: the target's greedy continuation of the prompt (often, not always,
    # what a sampled output is).
    predicted = Engine(backend(target)).generate(prompt, replace(params, temperature=0.0))

    def with_prediction(behind=None):
        def drafter():
            made = PredictionDrafter(predicted.token_ids, len(prompt))
            return made if behind is None else FallbackDrafter([made, behind()])

        return drafter

    def with_heads(kind):
        def engine() -> Engine:
            backend_ = backend(target)
            return Engine(backend_, heads[kind].drafter(backend_))

        return engine

    return {
        "medusa": with_heads("medusa"),
        "eagle": with_heads("eagle"),
        "model": lambda: ModelDrafter(backend(draft)),
        # reading the prompt's first 4 tokens and last 4 (of 14)
        "model, prompt tail": lambda: ModelDrafter(backend(draft), prompt_tail=4),
        "lookup": PromptLookupDrafter,
        "ngram": lambda: NGramDrafter(ngram),
        "lookup+model": lambda: FallbackDrafter(
            [PromptLookupDrafter(), ModelDrafter(backend(draft))]
        ),
        "prediction": with_prediction(),
        "prediction+model": with_prediction(lambda: ModelDrafter(backend(draft))),
        # FR-Spec: the draft scores 24 of 32 tokens (q = 0 on the rest).
        "trimmed model": lambda: ModelDrafter(backend(trimmed_copy(draft, range(24)))),
    }


def trimmed_copy(model, token_ids):
    import copy

    from specdec.backends.trim import trim_output_layer

    model = copy.deepcopy(model)
    trim_output_layer(model, list(token_ids))
    return model


def sample_positions(
    engine: Engine, prompt, params: SamplingParams, verification: str, tree: str = "off"
) -> tuple[np.ndarray, SpecStats]:
    """Counts of generated tokens 1..3 over DRAWS seeded requests (k = 2), and their stats
    merged."""
    counts = np.zeros((POSITIONS, VOCAB))
    stats = []
    for seed in range(DRAWS):
        spec = SpecConfig(k=2, verification=verification, tree=tree)
        out = engine.generate(prompt, replace(params, seed=seed), spec)
        for position, token_id in enumerate(out.token_ids):
            counts[position, token_id] += 1
        stats.append(out.stats)
    return counts, SpecStats.merged(stats)


CASES = (
    [
        ("model", setting, verification)
        for setting in SETTINGS
        for verification in ("rejection", "coupled")
    ]
    + [
        (drafter, "temperature 0.7, top-k 8, top-p 0.9", verification)
        for drafter in ("lookup", "ngram")
        for verification in ("rejection", "coupled")
    ]
    + [("lookup+model", "temperature 0.7, top-k 8, top-p 0.9", "rejection")]
    + [
        ("prediction", "temperature 1", "coupled"),
        ("prediction+model", "temperature 0.7, top-k 8, top-p 0.9", "rejection"),
    ]
    + [
        ("model, prompt tail", "temperature 0.7, top-k 8, top-p 0.9", verification)
        for verification in ("rejection", "coupled")
    ]
    + [
        ("trimmed model", "temperature 1", "rejection"),
        ("trimmed model", "temperature 0.7, top-k 8, top-p 0.9", "coupled"),
    ]
    + [
        (kind, setting, "rejection")
        for kind in ("medusa", "eagle")
        for setting in ("temperature 1", "temperature 0.7, top-k 8, top-p 0.9")
    ]
    + [("eagle", "temperature 0.8, top-p 0.9", "coupled")]
)


@pytest.mark.parametrize(("drafter", "setting", "verification"), CASES)
def test_every_generated_position_follows_the_target(
    pair, prompt, make_drafter, drafter, setting, verification
):
    params = SETTINGS[setting]
    made = make_drafter[drafter]()
    engine = made if isinstance(made, Engine) else Engine(backend(pair[0]), made)
    counts, stats = sample_positions(engine, prompt, params, verification)
    assert 0.05 < stats.acceptance_rate < 0.98, "both acceptance and rejection must be exercised"
    if "model" in drafter:  # copying drafters seldom have both drafts accepted here
        assert stats.bonus_tokens > 50, "the bonus token must be drawn often enough to be tested"
    for position, expected in enumerate(marginals(pair[0], prompt, params)):
        assert_same_distribution(counts[position], expected)


@pytest.mark.parametrize("verification", ["rejection", "coupled"])
def test_the_first_token_from_the_prefill_keeps_every_position_exact(
    pair, prompt, make_drafter, verification, monkeypatch
):
    """A long prompt's path (``Run.first_token``; the threshold lowered so that this prompt
    takes it): the first token sampled from the prefill's last row, the next two by a round
    drafting k = 2 (the bonus then past max_tokens). Every position follows the target,
    with the power stated above."""
    monkeypatch.setattr(specdec.engine.Run, "FIRST_TOKEN_FROM_PREFILL", 1)
    params = SETTINGS["temperature 0.7, top-k 8, top-p 0.9"]
    engine = Engine(backend(pair[0]), make_drafter["model"]())
    counts, stats = sample_positions(engine, prompt, params, verification)
    assert stats.rounds >= DRAWS and 0.05 < stats.acceptance_rate < 0.98
    for position, expected in enumerate(marginals(pair[0], prompt, params)):
        assert_same_distribution(counts[position], expected)


def test_a_first_token_from_the_wrong_row_is_caught(pair, prompt, make_drafter, monkeypatch):
    """Negative control for that path: the first token drawn from the row before the
    prompt's last one (the pass fed without it, the last token fed apart after). The same
    check must fail at position 0."""
    scoring_last = specdec.engine.sync_cache_scoring_last

    def one_row_early(target, tokens):
        logits = scoring_last(target, tokens[:-1])
        target.forward([tokens[-1]])
        return logits

    monkeypatch.setattr(specdec.engine.Run, "FIRST_TOKEN_FROM_PREFILL", 1)
    monkeypatch.setattr(specdec.engine, "sync_cache_scoring_last", one_row_early)
    params = SETTINGS["temperature 0.7, top-k 8, top-p 0.9"]
    engine = Engine(backend(pair[0]), make_drafter["model"]())
    counts, _ = sample_positions(engine, prompt, params, "rejection")
    with pytest.raises(AssertionError, match="differs|impossible"):
        assert_same_distribution(counts[0], marginals(pair[0], prompt, params)[0])


def test_the_sample_size_detects_the_stated_effect():
    df = VOCAB - 1
    critical = stats.chi2.ppf(1 - SIGNIFICANCE, df)
    power = stats.ncx2.sf(critical, df, DRAWS * EFFECT**2)
    assert power >= 0.99, f"power {power:.3f} against w = {EFFECT} with {DRAWS} draws"


def test_a_wrong_bonus_row_is_caught(pair, prompt, make_drafter, monkeypatch):
    """Negative control: the engine's verifier samples the bonus from the last draft's row
    instead of the row after it. The same check must fail."""

    def bonus_from_the_wrong_row(draft_ids, draft_probs, target_probs, generator):
        wrong = target_probs.clone()
        if len(draft_ids) > 0:
            wrong[-1] = target_probs[-2]
        return verify_stochastic(draft_ids, draft_probs, wrong, generator)

    monkeypatch.setattr(specdec.engine, "verify_stochastic", bonus_from_the_wrong_row)
    params = SETTINGS["temperature 1"]
    engine = Engine(backend(pair[0]), make_drafter["model"]())
    counts, _ = sample_positions(engine, prompt, params, "rejection")
    with pytest.raises(AssertionError, match="differs|impossible"):
        assert_same_distribution(counts[2], marginals(pair[0], prompt, params)[2])


def test_the_engine_check_catches_a_wrong_distribution(pair, prompt, make_drafter):
    """Negative control: another model's marginals differ, and the same check says so."""
    params = SETTINGS["temperature 1"]
    engine = Engine(backend(pair[0]), make_drafter["model"]())
    counts, _ = sample_positions(engine, prompt, params, "rejection")
    unrelated = marginals(tiny_llama(seed=99, init=0.3), prompt, params)
    with pytest.raises(AssertionError):
        assert_same_distribution(counts[1], unrelated[1])


# ---- continuous batching -----------------------------------------------------------------


@pytest.fixture(scope="module")
def int8_pair(pair):
    import copy

    from specdec.backends.quant.convert import make_int8_batch_invariant

    return tuple(make_int8_batch_invariant(copy.deepcopy(model)) for model in pair)


@pytest.mark.parametrize("max_rows", [None, 16], ids=["k 2", "row budget: k 1 in a batch of 8"])
def test_batched_requests_follow_the_target(int8_pair, prompt, max_rows):
    """DRAWS seeded requests decoded 8 at a time by ``step_together`` on the int8 runtime
    (their target and draft passes batched), rejection sampling: every generated position
    follows the int8 target's exact marginals, with or without a row budget that cuts k."""
    from specdec.backends.batched import BatchedModel
    from specdec.engine import step_together

    target, draft = (BatchedModel(model) for model in int8_pair)
    params = SETTINGS["temperature 0.7, top-k 8, top-p 0.9"]
    counts = np.zeros((POSITIONS, VOCAB))
    accepted = drafted = 0
    for first in range(0, DRAWS, 8):
        runs = []
        for seed in range(first, first + 8):
            engine = Engine(target.sequence(), ModelDrafter(draft.sequence()))
            spec = SpecConfig(k=2, verification="rejection")
            runs.append(engine.begin(prompt, replace(params, seed=seed), spec))
            runs[-1].start()
        tokens: list[list[int]] = [[] for _ in runs]
        active = list(range(len(runs)))
        while active:
            chunks = step_together([runs[i] for i in active], target.forward_many, max_rows)
            for i, chunk in zip(list(active), chunks, strict=True):
                tokens[i] += chunk.token_ids
                if chunk.finish_reason is not None:
                    accepted += chunk.stats.accepted_tokens
                    drafted += chunk.stats.drafted_tokens
                    active.remove(i)
        for run_tokens in tokens:
            for position, token_id in enumerate(run_tokens):
                counts[position, token_id] += 1
    assert 0.05 < accepted / drafted < 0.98, "both acceptance and rejection must be exercised"
    for position, expected in enumerate(marginals(int8_pair[0], prompt, params)):
        assert_same_distribution(counts[position], expected)
