"""Draft trees through the whole engine: greedy and seeded (coupled) output equal to plain
decoding on the int4 and int8 runtimes for every k, sampled output following the target at
every position (chi-square, the power of ``test_engine_statistical``), clear refusals."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

import specdec.verify_tree
from helpers import assert_same_distribution, backend, char_tokenizer, decode_together
from specdec import Engine, SamplingParams, SpecConfig
from specdec.backends.quant.convert import make_int4_batch_invariant, make_int8_batch_invariant
from specdec.config import Constraint
from specdec.drafters import FallbackDrafter, ModelDrafter, PromptLookupDrafter
from test_engine_statistical import (  # noqa: F401
    DRAWS,
    SETTINGS,
    marginals,
    pair,
    prompt,
    sample_positions,
)

PROMPTS = {"short": [8, 5, 12, 12, 15], "long": [(7 * i + 3) % 31 + 1 for i in range(40)]}
GREEDY = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module", params=["int8", "int4"])
def runtime_pair(request, target_model, draft_model):
    convert = make_int8_batch_invariant if request.param == "int8" else make_int4_batch_invariant
    return tuple(convert(copy.deepcopy(model)) for model in (target_model, draft_model))


def engines(models):
    target, draft = models
    return Engine(backend(target)), Engine(backend(target), ModelDrafter(backend(draft)))


@pytest.mark.parametrize("tree", ["full", "auto"])
@pytest.mark.parametrize("prompt_name", list(PROMPTS))
def test_greedy_trees_equal_plain_for_every_k(runtime_pair, prompt_name, tree):
    plain, speculative = engines(runtime_pair)
    text = PROMPTS[prompt_name]
    expected = plain.generate(text, GREEDY).token_ids
    siblings = taken = 0
    ks: list[int | str] = ["auto", 2, 5] if tree == "auto" else list(range(1, 17))
    for k in ks:
        out = speculative.generate(text, GREEDY, SpecConfig(k=k, max_k=16, tree=tree))
        assert out.token_ids == expected, f"k = {k}"
        siblings += out.stats.sibling_tokens
        taken += out.stats.sibling_accepted
    if tree == "full":
        assert siblings > 0 and taken > 0, "leaves must be verified and some taken"
    else:  # the shaper learned costs at the fixed k's too
        assert speculative.controller is not None and speculative.controller.rounds > 0


@pytest.mark.parametrize("prompt_name", list(PROMPTS))
def test_greedy_deep_trees_equal_plain_for_every_k(runtime_pair, prompt_name):
    """Deep trees (a draft tree pass a depth), shaped by measured costs (k auto, and the
    shaper at fixed k's) and unshaped (every grown node verified), with the guide's guesses
    read as free rows: plain decoding's text."""
    target, draft = runtime_pair
    text = PROMPTS[prompt_name] + PROMPTS[prompt_name][:8]  # the guide finds copies
    expected = Engine(backend(target)).generate(text, GREEDY).token_ids
    off_chain = 0
    for guide in (None, PromptLookupDrafter(2, 2)):
        engine = Engine(backend(target), ModelDrafter(backend(draft), guide))
        for k in ["auto", *range(1, 17)]:
            out = engine.generate(text, GREEDY, SpecConfig(k=k, max_k=16, tree="deep"))
            assert out.token_ids == expected, f"k = {k}, guide {guide is not None}"
            off_chain += out.stats.sibling_accepted
    assert off_chain > 0, "some rounds must take a path off the draft's chain"


def test_seeded_deep_trees_equal_plain_seeded(runtime_pair):
    plain, speculative = engines(runtime_pair)
    off_chain = 0
    for seed in range(6):
        params = SamplingParams(max_tokens=30, temperature=0.9, seed=seed, ignore_eos=True)
        expected = plain.generate(PROMPTS["short"], params).token_ids
        for k in (2, 5, "auto"):
            out = speculative.generate(PROMPTS["short"], params, SpecConfig(k=k, tree="deep"))
            assert out.token_ids == expected, f"seed {seed}, k {k}"
            off_chain += out.stats.sibling_accepted
    assert off_chain > 0, "some rounds must take a path off the draft's chain"


def test_a_deep_tree_grows_wide_and_deep(runtime_pair):
    """Unshaped (a fixed k, no costs measured yet: every grown node), a deep tree has nodes
    off its chain below depth 0 (second choices with continuations of their own), its
    chain first, no depth past k, and a parent before each child."""
    from specdec.drafters.base import Growth, drive
    from specdec.sampling import Sampler
    from specdec.tree import chain_length, check, row_depths, row_parents

    target, draft = runtime_pair
    drafter = ModelDrafter(backend(draft))
    context = PROMPTS["long"]
    drafter.prepare(context)
    proposal = drive(drafter.drafting(context, 5, Sampler(GREEDY), None, Growth(width=2, beam=2)))
    parents = proposal.parents
    assert parents is not None
    check(parents)
    depths = [d - 1 for d in row_depths(row_parents(parents))[1:]]  # a node's, root's children 0
    chain = chain_length(parents, len(parents))
    assert chain == 5 and max(depths) == 4
    assert any(d >= 1 and i >= chain for i, d in enumerate(depths)), "a second choice grew"
    assert len(parents) == 2 + 2 * 2 * 4, "width 2 at the root, then a beam of 2 a depth"
    assert list(drafter.backend.cached_token_ids) == context, "the tree's rows were dropped"


def test_seeded_trees_equal_plain_seeded(runtime_pair):
    """Coupled verification: the target's keyed sample picks the child, so a tree's output
    is plain decoding's with the same seed."""
    plain, speculative = engines(runtime_pair)
    taken = 0
    for seed in range(6):
        params = SamplingParams(max_tokens=30, temperature=0.9, seed=seed, ignore_eos=True)
        expected = plain.generate(PROMPTS["short"], params).token_ids
        for k in (2, 5):
            out = speculative.generate(PROMPTS["short"], params, SpecConfig(k=k, tree="full"))
            assert out.token_ids == expected, f"seed {seed}, k {k}"
            taken += out.stats.sibling_accepted
    assert taken > 0, "some leaves must be taken"


@pytest.mark.parametrize(("k", "tree"), [("auto", "auto"), ("auto", "full"), (3, "full")])
def test_a_fallback_chain_grows_trees_when_its_model_drafts(runtime_pair, k, tree):
    """lookup+model: lookup's copies stay chains, the model's rounds grow leaves."""
    target, draft = runtime_pair
    text = PROMPTS["long"] + PROMPTS["long"][:6]  # lookup finds copies to propose
    expected = Engine(backend(target)).generate(text, GREEDY).token_ids
    drafter = FallbackDrafter([PromptLookupDrafter(), ModelDrafter(backend(draft))])
    engine = Engine(backend(target), drafter)
    out = engine.generate(text, GREEDY, SpecConfig(k=k, tree=tree))
    assert out.token_ids == expected
    assert set(out.stats.by_drafter) == {"lookup", "model"}, "both members drafted"
    if tree == "full":
        assert out.stats.sibling_tokens > 0


def test_tree_auto_in_a_chain_at_a_fixed_k_is_refused(runtime_pair):
    target, draft = runtime_pair
    drafter = FallbackDrafter([PromptLookupDrafter(), ModelDrafter(backend(draft))])
    with pytest.raises(ValueError, match="k='auto'"):
        Engine(backend(target), drafter).generate([5], GREEDY, SpecConfig(k=3, tree="auto"))


# ---- sampled output follows the target ---------------------------------------------------


@pytest.fixture(scope="module")
def int8_stat_pair(pair):  # noqa: F811
    return tuple(make_int8_batch_invariant(copy.deepcopy(model)) for model in pair)


def tree_counts(models, prompt, params, verification, tree="full"):  # noqa: F811
    """``sample_positions`` with the int8 pair's draft model growing trees."""
    target, draft = models
    engine = Engine(backend(target), ModelDrafter(backend(draft)))
    return sample_positions(engine, prompt, params, verification, tree)


@pytest.mark.parametrize(
    ("setting", "verification", "tree"),
    [
        ("temperature 1", "rejection", "full"),
        ("temperature 0.7, top-k 8, top-p 0.9", "rejection", "full"),
        ("temperature 0.8, top-p 0.9", "coupled", "full"),
        ("temperature 1", "rejection", "auto"),
        ("temperature 0.8, top-p 0.9", "coupled", "deep"),
    ],
)
def test_sampled_trees_follow_the_target(int8_stat_pair, prompt, setting, verification, tree):  # noqa: F811
    """Tree auto: which leaves are kept depends on the drafts, never on a leaf's own token."""
    params = SETTINGS[setting]
    counts, stats = tree_counts(int8_stat_pair, prompt, params, verification, tree)
    assert stats.sibling_tokens > DRAWS / 4 and stats.sibling_accepted > 50, (
        "leaves must be verified and taken often"
    )
    assert 0.05 < stats.acceptance_rate < 0.98, "both acceptance and rejection must be exercised"
    for position, expected in enumerate(marginals(int8_stat_pair[0], prompt, params)):
        assert_same_distribution(counts[position], expected)


def test_an_unnormalised_residual_is_caught(int8_stat_pair, prompt, monkeypatch):  # noqa: F811
    """The residual left by a rejected child, not renormalised before its sibling is
    tried, through the engine: the same check fails."""

    def unnormalised(p, q):
        residual = (p - q).clamp(min=0.0)
        return residual if float(residual.sum()) > 1e-6 else None

    monkeypatch.setattr(specdec.verify_tree, "_residual", unnormalised)
    params = SETTINGS["temperature 1"]
    counts, _ = tree_counts(int8_stat_pair, prompt, params, "rejection")
    expected = marginals(int8_stat_pair[0], prompt, params)
    with pytest.raises(AssertionError, match="differs|impossible"):
        for position in range(3):
            assert_same_distribution(counts[position], expected[position])


# ---- where trees are not grown -----------------------------------------------------------


def test_a_batch_drafts_chains_and_stays_exact(runtime_pair):
    """Requests stepped together score one pass of many sequences: their drafts stay chains."""
    from specdec.backends.batched import BatchedModel

    target, draft = (BatchedModel(model) for model in runtime_pair)
    expected = Engine(target.sequence()).generate(PROMPTS["short"], GREEDY).token_ids
    runs = []
    for _ in range(3):
        engine = Engine(target.sequence(), ModelDrafter(draft.sequence()))
        runs.append(engine.begin(PROMPTS["short"], GREEDY, SpecConfig(k=3, tree="full")))
        runs[-1].start()

    def chains_only(chunk):
        assert chunk.stats.sibling_tokens == 0

    tokens = decode_together(runs, target.forward_many, chains_only)
    assert all(t == expected for t in tokens)


def test_trees_are_refused_where_they_cannot_grow(runtime_pair, target_model, draft_model):
    target, draft = runtime_pair
    with pytest.raises(ValueError, match="layer stack"):  # transformers' forward: float32
        Engine(backend(target_model), ModelDrafter(backend(draft_model))).generate(
            [5], GREEDY, SpecConfig(tree="full")
        )
    with pytest.raises(ValueError, match="proposes chains"):
        Engine(backend(target), PromptLookupDrafter()).generate(
            [5], GREEDY, SpecConfig(tree="full")
        )
    with pytest.raises(ValueError, match="tree must be one of"):
        SpecConfig(tree="bushy")
    constrained = replace(GREEDY, constraint=Constraint("regex", "[a-c]+"))
    engine = Engine(backend(target, char_tokenizer()), ModelDrafter(backend(draft)))
    with pytest.raises(ValueError, match="grammar"):
        engine.generate([5], constrained, SpecConfig(tree="full"))


def test_a_plain_request_ignores_the_tree(runtime_pair):
    plain, speculative = engines(runtime_pair)
    out = speculative.generate(PROMPTS["short"], GREEDY, SpecConfig(k=0, tree="full"))
    assert out.token_ids == plain.generate(PROMPTS["short"], GREEDY).token_ids


def test_a_trees_logprobs_are_plain_decodings_bit_for_bit(runtime_pair):
    """Each emitted token's logprobs come from its path's row, which is the chain's row."""
    plain, speculative = engines(runtime_pair)
    params = replace(GREEDY, logprobs=5)
    expected = plain.generate(PROMPTS["long"], params)
    out = speculative.generate(PROMPTS["long"], params, SpecConfig(k=4, tree="full"))
    assert out.token_ids == expected.token_ids and out.stats.sibling_accepted > 0
    assert out.logprobs == expected.logprobs
