"""Prompt lookup, n-gram and fallback drafters: hand-built contexts, exactness through the
engine."""

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from helpers import VOCAB, backend, tiny_llama
from specdec import Engine, SamplingParams, SpecConfig
from specdec.drafters import (
    FallbackDrafter,
    ModelDrafter,
    NGramDrafter,
    NGramModel,
    PromptLookupDrafter,
)
from specdec.drafters.model import runner_up, second_choice
from specdec.sampling import Sampler


class TestPromptLookup:
    def test_match_proposes_what_followed(self):
        assert PromptLookupDrafter().propose([1, 2, 3, 4, 5, 9, 2, 3], k=2).token_ids == [4, 5]

    def test_no_match_proposes_nothing(self):
        assert PromptLookupDrafter().propose([1, 2, 3, 4], k=3).token_ids == []

    def test_longest_match_wins_over_a_more_recent_shorter_one(self):
        # Tail (7, 8): the 2-gram occurs at the start; "8" alone also occurs later.
        context = [7, 8, 1, 1, 8, 2, 2, 7, 8]
        assert PromptLookupDrafter(max_ngram=2).propose(context, k=2).token_ids == [1, 1]

    def test_most_recent_occurrence_of_equal_length(self):
        assert PromptLookupDrafter(max_ngram=1).propose([5, 1, 5, 2, 5], k=1).token_ids == [2]

    def test_overlapping_match(self):
        # Tail (4, 4, 4) matches itself shifted by one: copy the run forward.
        assert PromptLookupDrafter().propose([4, 4, 4, 4], k=3).token_ids == [4]

    def test_match_at_the_end_yields_a_short_continuation(self):
        assert PromptLookupDrafter(max_ngram=2).propose([1, 2, 3, 1, 2], k=5).token_ids == [3, 1, 2]

    def test_min_ngram_refuses_short_matches(self):
        assert (
            PromptLookupDrafter(max_ngram=3, min_ngram=2).propose([5, 1, 2, 5], k=2).token_ids == []
        )

    def test_continuation_may_contain_eos(self, target_model):
        # The engine, not the drafter, ends output at EOS; the drafter copies whatever followed.
        assert PromptLookupDrafter().propose([3, 0, 6, 3], k=3).token_ids == [0, 6, 3]

    def test_index_follows_a_growing_and_a_changed_context(self):
        drafter = PromptLookupDrafter(max_ngram=2)
        assert drafter.propose([1, 2, 3], k=1).token_ids == []
        assert drafter.propose([1, 2, 3, 1, 2], k=1).token_ids == [3]
        assert drafter.propose([9, 8, 9], k=1).token_ids == [8]  # a new request: rebuilt

    def test_bad_configuration(self):
        with pytest.raises(ValueError, match="min_ngram"):
            PromptLookupDrafter(max_ngram=1, min_ngram=2)

    @settings(max_examples=150, deadline=None)
    @given(
        st.lists(st.integers(0, 4), min_size=1, max_size=60),
        st.lists(st.integers(1, 5), max_size=8),
    )
    def test_incremental_index_equals_brute_force(self, tokens, cuts):
        """Fed a growing context, the indexed drafter proposes what a full scan would."""
        drafter = PromptLookupDrafter(max_ngram=3, min_ngram=1)
        end = 1
        for cut in cuts + [len(tokens)]:
            end = min(len(tokens), end + cut)
            context = tokens[:end]
            assert drafter.propose(context, k=4).token_ids == brute_force_lookup(context, 4, 3, 1)


def brute_force_lookup(context, k, max_ngram, min_ngram):
    for n in range(min(max_ngram, len(context) - 1), min_ngram - 1, -1):
        tail = context[-n:]
        for start in range(len(context) - n - 1, -1, -1):  # latest earlier occurrence
            if context[start : start + n] == tail:
                return context[start + n : start + n + k]
    return []


class TestNGram:
    CORPUS = [[1, 2, 3, 1, 2, 4, 1, 2, 3], [5, 1, 2, 3]]

    def test_probabilities_sum_to_one_and_follow_counts(self):
        model = NGramModel.build(self.CORPUS, order=3, vocab_size=8)
        probs = model.probs([1, 2])
        assert torch.isclose(probs.sum(), torch.tensor(1.0))
        assert probs[3] == pytest.approx(3 / 4) and probs[4] == pytest.approx(1 / 4)
        # Unseen 2-token context backs off to the bigram of its last token.
        assert model.probs([7, 1])[2] == pytest.approx(1.0)
        assert torch.isclose(model.probs([7, 7]).sum(), torch.tensor(1.0))

    def test_round_trip_through_save_and_load(self, tmp_path):
        model = NGramModel.build(self.CORPUS, order=3, vocab_size=8, tokenizer_name="toy")
        model.save(tmp_path / "m.json")
        loaded = NGramModel.load(tmp_path / "m.json")
        assert loaded.order == 3 and loaded.vocab_size == 8 and loaded.tokenizer_name == "toy"
        for context in ([], [1], [1, 2], [2, 3], [9]):
            assert torch.equal(loaded.probs(context), model.probs(context))

    def test_load_rejects_other_files(self, tmp_path):
        (tmp_path / "x.json").write_text('{"format": "other"}')
        with pytest.raises(ValueError, match="not a specdec n-gram model"):
            NGramModel.load(tmp_path / "x.json")

    def test_greedy_drafts_the_argmax_chain(self):
        drafter = NGramDrafter(NGramModel.build(self.CORPUS, order=3, vocab_size=8))
        proposal = drafter.propose([5, 1], k=3)
        assert proposal.token_ids == [2, 3, 1] and proposal.draft_probs is None

    def test_sampled_drafts_carry_the_distribution_they_came_from(self):
        drafter = NGramDrafter(NGramModel.build(self.CORPUS, order=3, vocab_size=8))
        proposal = drafter.propose(
            [1, 2], k=2, sampler=Sampler(SamplingParams(temperature=1.0, seed=0))
        )
        assert proposal.draft_probs.shape == (2, 8)
        for token, row in zip(proposal.token_ids, proposal.draft_probs, strict=True):
            assert row[token] > 0 and torch.isclose(row.sum(), torch.tensor(1.0))


def test_fallback_uses_the_first_drafter_with_a_proposal():
    lookup = PromptLookupDrafter()
    ngram = NGramDrafter(NGramModel.build([[1, 2, 3]], order=2, vocab_size=8))
    both = FallbackDrafter([lookup, ngram])
    assert both.name == "lookup+ngram" and both.vocab_size == 8
    assert both.propose([4, 5, 6, 4, 5], k=1).drafter == "lookup"
    assert both.propose([1], k=2).drafter == "ngram"


def test_lookup_in_front_of_another_drafter_takes_two_token_matches_only():
    ngram = NGramDrafter(NGramModel.build([[1, 2, 3]], order=2, vocab_size=8))
    alone = PromptLookupDrafter()
    assert alone.propose([4, 5, 4], k=2).token_ids == [5, 4]  # a 1-token match, taken alone
    in_front = FallbackDrafter([PromptLookupDrafter(), ngram])
    assert in_front.propose([4, 5, 4], k=2).drafter == "ngram"  # the same match left to ngram
    proposal = in_front.propose([4, 5, 6, 4, 5], k=2)
    assert (proposal.drafter, proposal.token_ids) == ("lookup", [6, 4])
    asked = FallbackDrafter([PromptLookupDrafter(min_ngram=1), ngram])  # given: kept
    assert asked.propose([4, 5, 4], k=2).drafter == "lookup"
    with pytest.raises(ValueError, match="max_ngram"):
        PromptLookupDrafter(max_ngram=0)


# ---- through the engine: greedy equality and statistical exactness per drafter kind ----

REPETITIVE_PROMPT = [3, 4, 5, 6, 7, 3, 4, 5, 6, 7, 3, 4, 5]


@pytest.fixture(scope="module")
def drafter_kinds(target_model, draft_model):
    corpus = [[(3 * i + j) % VOCAB for i in range(60)] for j in range(4)]
    ngram = NGramModel.build(corpus, order=3, vocab_size=VOCAB)
    return {
        "lookup": lambda: PromptLookupDrafter(),
        "ngram": lambda: NGramDrafter(ngram),
        "lookup+model": lambda: FallbackDrafter(
            [PromptLookupDrafter(), ModelDrafter(backend(draft_model))]
        ),
    }


@pytest.mark.parametrize("kind", ["lookup", "ngram", "lookup+model"])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_equals_plain_for_each_drafter(target_model, drafter_kinds, kind, k):
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    expected = Engine(backend(target_model)).generate(REPETITIVE_PROMPT, params)
    out = Engine(backend(target_model), drafter_kinds[kind]()).generate(
        REPETITIVE_PROMPT, params, SpecConfig(k=k)
    )
    assert out.token_ids == expected.token_ids


def test_stats_name_the_drafter_of_each_round(target_model, drafter_kinds):
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    out = Engine(backend(target_model), drafter_kinds["lookup+model"]()).generate(
        REPETITIVE_PROMPT, params, SpecConfig(k=4)
    )
    by_drafter = out.stats.to_dict()["by_drafter"]
    assert set(by_drafter) <= {"lookup", "model"} and by_drafter
    assert sum(d["drafted"] for d in by_drafter.values()) == out.stats.drafted_tokens
    assert sum(d["accepted"] for d in by_drafter.values()) == out.stats.accepted_tokens


def test_a_prompt_longer_than_the_drafts_window_decodes_plainly(target_model):
    """A draft whose context is shorter than the target's (llama.cpp's n_ctx) declines to
    draft past it instead of failing: the output is still the target's."""
    short_draft = tiny_llama(seed=0, max_positions=16)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompt = [(7 * i) % VOCAB for i in range(20)]
    expected = Engine(backend(target_model)).generate(prompt, params)
    out = Engine(backend(target_model), ModelDrafter(backend(short_draft))).generate(
        prompt, params, SpecConfig(k=4)
    )
    assert out.token_ids == expected.token_ids
    assert out.stats.drafted_tokens == 0


# ---- the draft reads a long prompt's first tokens and its tail ----------------------------

TAIL = 6
SINK = ModelDrafter.PROMPT_SINK
LONG = [(5 * i + 2) % (VOCAB - 1) + 1 for i in range(30)]


def test_the_draft_reads_a_long_prompts_first_tokens_and_tail(draft_model):
    drafter = ModelDrafter(backend(draft_model), prompt_tail=TAIL)
    drafter.prepare(LONG)
    seen = LONG[:SINK] + LONG[-TAIL:]
    assert drafter.backend.cached_token_ids == seen[:-1]
    drafter.propose(LONG + [3, 4], 2)  # the text goes on: the same cut, what follows fed
    assert drafter.backend.cached_token_ids[: len(seen) + 1] == seen + [3]
    whole = ModelDrafter(backend(draft_model), prompt_tail=None)
    whole.prepare(LONG)
    assert whole.backend.cached_token_ids == LONG[:-1]
    short = LONG[: SINK + TAIL]  # nothing to skip
    drafter.prepare(short)
    assert drafter.backend.cached_token_ids == short[:-1]


def scanned_cuts(context, held, tail):
    """Every cut whose window begins as a held text does, by scanning the context for each
    held text: what ``_held_cuts`` finds, in its order."""
    match, last = ModelDrafter.MATCH, len(context) - tail
    return [
        cut
        for ids in held
        if len(ids) >= SINK + match and ids[:SINK] == context[:SINK]
        for cut in range(SINK + 1, last + 1)
        if context[cut : cut + match] == ids[SINK : SINK + match]
    ]


@settings(max_examples=300, deadline=None)
@given(
    context=st.lists(st.integers(0, 2), min_size=SINK + 2, max_size=60),
    windows=st.lists(st.tuples(st.integers(1, 60), st.lists(st.integers(0, 2))), max_size=5),
    others=st.lists(st.lists(st.integers(0, 2), max_size=30), max_size=3),
    tail=st.integers(1, 12),  # prompt_tail >= 1, and _fit asks only for len > SINK + tail
)
def test_held_cuts_are_the_scans_cuts_in_its_order(context, windows, others, tail):
    """Held windows looked up by their first token (one read of the context) give the cuts,
    and their order (held text by held text, ties to the first), that scanning the context
    for each held text gives."""
    assume(len(context) > SINK + tail)
    # windows the context holds (from a cut on, then text of their own) among other texts
    held = [  # cuts counted from the end: as many near the tail's
        context[:SINK] + context[(len(context) - back) % len(context) :] + own
        for back, own in windows
    ]
    held += others
    drafter = ModelDrafter.__new__(ModelDrafter)
    drafter.prompt_tail = tail
    assert drafter._held_cuts(context, held) == scanned_cuts(context, held, tail)


def test_a_prompt_prefilled_in_parts_reads_the_tail_in_shares(draft_model):
    """``prepare_part`` (``Run.prefill_part``): each part feeds its share of what the draft
    reads, never more rows than prompt tokens the part covers, and the parts end where one
    ``prepare`` would."""
    drafter = ModelDrafter(backend(draft_model), prompt_tail=TAIL)
    held = 0
    for upto in range(4, len(LONG), 4):
        drafter.prepare_part(LONG, upto)
        grew = len(drafter.backend.cached_token_ids) - held
        held += grew
        assert 0 <= grew <= 4
    drafter.prepare(LONG)
    assert drafter.backend.cached_token_ids == (LONG[:SINK] + LONG[-TAIL:])[:-1]


def test_longer_and_longer_prefixes_are_read_whole(draft_model):
    """``prepare`` alone on longer and longer prefixes: once the cache holds more than the
    tail would cost, reading on is cheaper than starting the tail anew."""
    drafter = ModelDrafter(backend(draft_model), prompt_tail=TAIL)
    for end in range(4, len(LONG) + 1, 4):
        drafter.prepare(LONG[:end])
    drafter.prepare(LONG)
    assert drafter.backend.cached_token_ids == LONG[:-1]


@pytest.mark.parametrize("tail", [0, -3])
def test_a_prompt_tail_must_be_positive(draft_model, tail):
    with pytest.raises(ValueError, match="positive count or None"):
        ModelDrafter(backend(draft_model), prompt_tail=tail)


def test_a_text_that_does_not_go_on_from_the_last_is_fitted_anew(draft_model):
    drafter = ModelDrafter(backend(draft_model), prompt_tail=TAIL)
    drafter.prepare(LONG)
    other = [t % (VOCAB - 2) + 2 for t in reversed(LONG)]  # a new request, never prepared
    drafter.propose(other, 2)
    seen = other[:SINK] + other[-TAIL:]
    assert drafter.backend.cached_token_ids[: len(seen)] == seen


@pytest.mark.parametrize("guided", [False, True])
@pytest.mark.parametrize("k", [1, 3, 5, 8])
def test_greedy_with_the_prompt_tail_equals_plain(target_model, draft_model, guided, k):
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    guide = PromptLookupDrafter(3, 2) if guided else None
    drafter = ModelDrafter(backend(draft_model), guide, prompt_tail=TAIL)
    expected = Engine(backend(target_model)).generate(LONG, params)
    out = Engine(backend(target_model), drafter).generate(LONG, params, SpecConfig(k=k))
    assert out.token_ids == expected.token_ids
    assert out.stats.accepted_tokens > 0, "the pair should agree sometimes, or nothing is tested"
    read = len(drafter.backend.cached_token_ids)
    assert read <= SINK + TAIL + len(out.token_ids) + k, "it read the prompt's tail only"


@given(st.integers(0, 2**31 - 1), st.sampled_from(["argmax", "first", "last", "any"]))
@settings(max_examples=40, deadline=None)
def test_the_runner_up_share_is_the_second_choices(seed, which):
    """What decides a leaf (``runner_up``) is what ``second_choice`` reports, without its copy."""
    generator = torch.Generator().manual_seed(seed)
    dist = torch.softmax(3 * torch.randn(500, generator=generator), dim=-1)
    chosen = {"argmax": int(dist.argmax()), "first": 0, "last": 499, "any": seed % 500}[which]
    _, _, share = second_choice(dist, False, chosen, Sampler(SamplingParams()), 0)
    assert runner_up(dist, chosen) == pytest.approx(share, rel=1e-5)


def test_no_runner_up_where_the_choice_holds_all_the_mass():
    point = torch.zeros(8)
    point[3] = 1.0
    assert runner_up(point, 3) == 0.0
    assert second_choice(point, False, 3, Sampler(SamplingParams()), 0)[0] == -1
