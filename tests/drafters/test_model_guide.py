"""The draft model guided by prompt lookup: the same proposals in fewer passes."""

from __future__ import annotations

import copy

import pytest

from helpers import backend
from specdec import Engine, SamplingParams, SpecConfig
from specdec.backends.quant.convert import make_int4_batch_invariant, make_int8_batch_invariant
from specdec.drafters import ModelDrafter
from specdec.drafters.base import Proposal, Siblings, drive, pass_work
from specdec.drafters.lookup import PromptLookupDrafter
from specdec.sampling import Sampler

CONTEXT = [(7 * i + 3) % 31 + 1 for i in range(24)]
K = 6


class FixedGuide:
    """A guide that guesses what it is told to at a round's start, nothing after a draft
    (lookup's interface)."""

    def __init__(self, guesses: list[int]):
        self.guesses = guesses

    def prepare(self, context) -> None:
        pass

    def continuation(self, context, after, k) -> list[int]:
        return [] if after else self.guesses[:k]


class KnowingGuide(FixedGuide):
    """A guide that knows the text after CONTEXT (``guesses``) but at the positions in
    ``blind``: it guesses from wherever the drafts have got to."""

    def __init__(self, guesses: list[int], blind: set[int]):
        super().__init__(guesses)
        self.blind = blind

    def continuation(self, context, after, k) -> list[int]:
        at = len(context) + len(after) - len(CONTEXT)
        text = [1 if i in self.blind else t for i, t in enumerate(self.guesses)]
        return text[at : at + k]


@pytest.fixture(scope="module", params=["int8", "int4"])
def draft(request, draft_model):
    """A draft on one of specdec's runtimes, where a row of a pass is its step bit for bit."""
    convert = make_int8_batch_invariant if request.param == "int8" else make_int4_batch_invariant
    return convert(copy.deepcopy(draft_model))


def counted(drafter: ModelDrafter, sampler: Sampler | None) -> tuple[Proposal, list[int]]:
    """The drafter's proposal after CONTEXT and the rows of each pass it asked for."""
    rows: list[int] = []
    drafting = drafter.drafting(CONTEXT, K, sampler)
    try:
        call = next(drafting)
        while True:
            seq, tokens, last_only = pass_work(call)
            rows.append(len(tokens))
            call = drafting.send(seq.forward(tokens, last_only=last_only))
    except StopIteration as done:
        return done.value, rows


def samplers():
    return {
        "greedy": lambda: None,
        "sampled": lambda: Sampler(SamplingParams(temperature=1.0, seed=3)),
        "coupled": lambda: Sampler(SamplingParams(temperature=0.8, top_k=5, seed=3), coupled=True),
    }


@pytest.mark.parametrize("kind", ["greedy", "sampled", "coupled"])
def test_guesses_right_wrong_or_none_give_the_unguided_proposal(draft, kind):
    make_sampler = samplers()[kind]
    plain = ModelDrafter(backend(draft)).propose(CONTEXT, K, make_sampler())
    chain = plain.token_ids
    wrong = [(t % 30) + 2 if t != (t % 30) + 2 else 1 for t in chain]  # differs at every place
    cases = {
        "all right": (chain, [len(CONTEXT)]),  # one pass: the context and K - 1 guesses
        "wrong at 2": (chain[:2] + wrong[2:], [len(CONTEXT) + K - 1, 1, 1, 1]),
        "wrong at once": (wrong, [len(CONTEXT) + K - 1, *[1] * (K - 1)]),
        "two right, then none": (chain[:2], [len(CONTEXT) + 2, *[1] * (K - 3)]),
    }
    for name, (guesses, passes) in cases.items():
        drafter = ModelDrafter(backend(draft), FixedGuide(guesses))
        proposal, rows = counted(drafter, make_sampler())
        assert proposal.token_ids == chain, name
        if plain.draft_probs is None:
            assert proposal.draft_probs is None, name
        else:
            assert proposal.draft_probs.equal(plain.draft_probs), name
        expected = passes if name != "all right" else [len(CONTEXT) + K - 1]
        assert rows == expected, name
        # The cache holds the context and the drafts it read, never a guess it did not pick.
        cached = drafter.backend.cached_token_ids
        assert (
            cached[: len(CONTEXT)] == CONTEXT
            and cached[len(CONTEXT) :] == chain[: len(cached) - len(CONTEXT)]
        )


@pytest.mark.parametrize("kind", ["greedy", "sampled", "coupled"])
def test_a_copy_resumes_after_a_wrong_guess(draft, kind):
    """Where the guide guesses wrong at a position and right after it (an edit in a copy),
    the pass that feeds the draft's own pick there reads the guide's next guesses: one more
    pass where unguided drafting takes one a token."""
    make_sampler = samplers()[kind]
    chain = ModelDrafter(backend(draft)).propose(CONTEXT, K, make_sampler()).token_ids
    blind = {2} if chain[2] != 1 else {3}
    drafter = ModelDrafter(backend(draft), KnowingGuide(chain, blind))
    proposal, rows = counted(drafter, make_sampler())
    assert proposal.token_ids == chain
    at = min(blind)  # the pass feeding the pick there reads the K - at - 2 guesses after it
    assert rows == [len(CONTEXT) + K - 1, 1 + K - at - 2]
    cached = drafter.backend.cached_token_ids
    assert cached == CONTEXT + chain[: len(cached) - len(CONTEXT)]


def test_a_guided_round_after_a_guided_round_catches_up_from_the_cache(draft):
    """The next round starts from what the cache shares with the new context: guesses fed
    and confirmed count as fed."""
    chain = ModelDrafter(backend(draft)).propose(CONTEXT, K).token_ids
    drafter = ModelDrafter(backend(draft), FixedGuide(chain))
    drive(drafter.drafting(CONTEXT, K))
    later = CONTEXT + chain[:3]
    assert (
        drafter.propose(later, 2).token_ids
        == ModelDrafter(backend(draft)).propose(later, 2).token_ids
    )


@pytest.mark.parametrize("k", [1, 2, 4, 8, "auto"])
def test_greedy_with_a_lookup_guide_equals_plain(draft, target_model, k):
    target = make_int8_batch_invariant(copy.deepcopy(target_model))
    prompt = [3, 4, 5, 6, 7, 3, 4, 5, 6, 7, 3, 4, 5] + CONTEXT[:8] + CONTEXT[:6]
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    expected = Engine(backend(target)).generate(prompt, params)
    guided = ModelDrafter(backend(draft), PromptLookupDrafter(3, 1))
    out = Engine(backend(target), guided).generate(prompt, params, SpecConfig(k=k))
    assert out.token_ids == expected.token_ids


def test_a_tree_carries_the_copy_where_the_draft_parts_from_it(draft):
    chain = ModelDrafter(backend(draft)).propose(CONTEXT, K).token_ids
    wrong = [(t % 30) + 2 if t != (t % 30) + 2 else 1 for t in chain]
    guesses = chain[:2] + wrong[2:]
    drafter = ModelDrafter(backend(draft), FixedGuide(guesses))
    tree = drive(drafter.drafting(CONTEXT, K, None, None, lambda confidences, seconds: []))
    assert tree.token_ids == chain + guesses[2 : K - 1]  # the guide offers K - 1 guesses
    assert tree.parents == [-1, 0, 1, 2, 3, 4, 1, 6, 7] and tree.draft_probs is None
    assert tree.copied == K - 3
    # A leaf beside every chain node: the one at depth 2 with the copy's token gives way.
    everywhere = lambda confidences, seconds: list(range(len(confidences)))  # noqa: E731
    drafter = ModelDrafter(backend(draft), FixedGuide(guesses))
    tree = drive(drafter.drafting(CONTEXT, K, None, None, everywhere))
    heads = [(tree.parents[i], tree.token_ids[i]) for i in range(K, len(tree.token_ids))]
    assert len(heads) == len(set(heads)), "no two siblings with one token"
    assert tree.token_ids[-3:] == guesses[2 : K - 1]


def test_a_tree_carries_as_much_of_the_copy_as_its_rule_pays_for(draft):
    chain = ModelDrafter(backend(draft)).propose(CONTEXT, K).token_ids
    wrong = [(t % 30) + 2 if t != (t % 30) + 2 else 1 for t in chain]
    guesses = chain[:2] + wrong[2:]
    asked = []

    def one_guess(confidences, rows, at, length):
        asked.append((len(confidences), rows, at, length))
        return 1

    drafter = ModelDrafter(backend(draft), FixedGuide(guesses))
    tree = drive(drafter.drafting(CONTEXT, K, None, None, Siblings(lambda c, s: [], one_guess)))
    assert asked == [(K, K + 1, 2, K - 3)], "the chain, its rows, where the copy parts, its length"
    assert tree.token_ids == chain + guesses[2:3] and tree.copied == 1
    assert tree.parents == [-1, 0, 1, 2, 3, 4, 1]
    none = Siblings(lambda c, s: [], lambda confidences, rows, at, length: 0)
    drafter = ModelDrafter(backend(draft), FixedGuide(guesses))
    tree = drive(drafter.drafting(CONTEXT, K, None, None, none))
    assert tree.token_ids == chain and tree.copied == 0


@pytest.mark.parametrize("tree", ["full", "auto"])
def test_guided_trees_equal_plain_greedy_and_seeded(draft, target_model, tree):
    target = make_int8_batch_invariant(copy.deepcopy(target_model))
    prompt = [3, 4, 5, 6, 7, 3, 4, 5, 6, 7, 3, 4, 5] + CONTEXT[:8] + CONTEXT[:6]
    greedy = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    branches = 0
    for params in [greedy] + [
        SamplingParams(max_tokens=30, temperature=0.9, seed=seed, ignore_eos=True)
        for seed in range(3)
    ]:
        expected = Engine(backend(target)).generate(prompt, params).token_ids
        for k in (2, 4, 8) if tree == "full" else ("auto", 4):
            guided = ModelDrafter(backend(draft), PromptLookupDrafter(3, 1))
            spec = SpecConfig(k=k, tree=tree)
            out = Engine(backend(target), guided).generate(prompt, params, spec)
            assert out.token_ids == expected, f"{params}, k {k}"
            branches += out.stats.sibling_tokens
    assert branches > 0, "trees must be verified"
