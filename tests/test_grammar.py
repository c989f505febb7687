"""Structured output (``SamplingParams.constraint``, ``grammar.py``): masks by hand, greedy
constrained speculative == plain constrained, and the constrained distribution measured.

Statistical: the grammar ``[a-h][a-h]`` after a prompt; the target's exact constrained
marginals of the two tokens (its rows masked to a-h and renormalised) by enumeration.
With DRAWS = 2,000 requests and at most 8 cells (df <= 7), chi-square at 1e-4 rejects with
probability >= 0.99 whenever a marginal is off by Cohen's w >= 0.2 (noncentral chi-square,
lambda = 80; ``test_the_sample_size_detects_the_stated_effect`` in
``test_engine_statistical.py`` computes it for df = 31, which needs more). The drafts are
another model's, drawn from its rows masked by the grammar (the default) or from its raw
rows, where 40% of first drafts are forbidden and verification must reject them. Three
injected mutants must be caught: rows left unmasked; a forbidden draft cut off before
verification (its row then samples the bonus from p instead of the residual: biased
whenever the drafter's allowed tokens are shaped unlike the target's); a draft drawn from
the masked row but verified against the raw one (accepted too often). Their effect sizes on
this pair are worked out in ``test_the_sample_size_detects_the_mutants``. The same check, the
same cells, where the grammar forces letters before the two (``xz[a-h][a-h]``: the forced
drafts lead the draft's in one round) and between them (``[a-h]xz[a-h]``: the draft reads
them as guesses); a fourth mutant, the forced drafts' point masses left out so that the
draft's rows verify the wrong tokens, must be caught there.
"""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest
import torch
from scipy import stats

import specdec.engine as engine_module
from helpers import (
    CHARS,
    SIGNIFICANCE,
    assert_same_distribution,
    backend,
    char_tokenizer,
    tiny_llama,
)
from specdec import Engine, SamplingParams, SpecConfig
from specdec.backends.quant.convert import make_int8_batch_invariant
from specdec.config import Constraint
from specdec.drafters import ModelDrafter, PromptLookupDrafter
from specdec.drafters.base import Proposal, after_given
from specdec.engine import Run
from specdec.grammar import DraftMask, Grammar
from specdec.sampling import Sampler

START = [3, 1, 4, 1, 5]
DRAWS = 2000
ALLOWED = [1 + CHARS.index(c) for c in "abcdefgh"]


def ids(text: str) -> list[int]:
    return [1 + CHARS.index(c) for c in text]


def test_masks_row_by_row_and_a_forbidden_draft_ends_the_rows(tokenizer):
    grammar = Grammar(Constraint("regex", "ab(c|d)e"), tokenizer, 32, {0})
    logits = torch.zeros(7, 32)
    kept, rows = grammar.mask(ids("abd"), logits[:4])
    assert kept == 3 and rows.shape == (4, 32)
    finite = [torch.isfinite(row).nonzero().flatten().tolist() for row in rows]
    assert finite == [ids("a"), ids("b"), ids("cd"), ids("e")]
    kept, rows = grammar.mask(ids("ax"), logits[:3])  # x forbidden after a: nothing after it
    assert kept == 2 and rows.shape == (3, 32)
    assert grammar.forced() == ids("ab")  # the drafts were rolled back
    kept, rows = grammar.mask(ids("abce") + [0, 3], logits[:7])  # an EOS ends the rows
    assert kept == 5 and rows.shape == (6, 32) and bool(torch.isfinite(rows[4, 0]))
    assert grammar.forced() == ids("ab")  # rolled back, the EOS never consumed
    assert grammar.advance(ids("ab")) == 2
    assert grammar.forced() == [] and not grammar.done()
    assert grammar.advance(ids("ce") + [7, 8]) == 2  # what follows the end is cut
    assert grammar.done()


def test_a_draft_mask_follows_given_drafts_and_tells_the_forced_ones_after_them(tokenizer):
    """``follow`` consumes the grammar's given tokens; ``forced(position)`` tells what the
    grammar forces from the position after the drafts followed, and nothing at any other
    position (a guess there could be for another text); ``end`` rolls everything back."""
    grammar = Grammar(Constraint("regex", "abc(d|e)fg"), tokenizer, 32, {0})
    mask = grammar.drafts(10)
    mask.follow(ids("ab"))
    assert mask.followed == 2 and mask.forced(12) == ids("c") and mask.forced(11) == []
    row = mask.allowed(12)
    assert row is not None and row.nonzero().flatten().tolist() == ids("c")
    mask.picked(12, ids("c")[0])
    assert mask.forced(13) == [] and mask.allowed(13) is not None  # d or e: a choice
    mask.picked(13, ids("e")[0])
    assert mask.forced(14) == ids("fg")
    mask.end()
    assert grammar.forced() == ids("abc")


def test_a_bad_grammar_is_a_value_error_naming_it(tokenizer):
    with pytest.raises(ValueError, match="constraint"):
        Grammar(Constraint("regex", "a(b"), tokenizer, 32, {0})
    with pytest.raises(ValueError, match="not JSON"):
        Grammar(Constraint("json_schema", "{nope"), tokenizer, 32, {0})
    with pytest.raises(ValueError, match="constraint kind"):
        Constraint("yaml", "x")


@pytest.fixture(scope="module")
def pair():
    """The target and another model as the draft: its proposals are shaped unlike the
    target's (a perturbed copy's would be so alike that the cut mutant changes nothing)."""
    return tiny_llama(seed=10, init=0.3), tiny_llama(seed=12, init=1.0)


@pytest.mark.parametrize("runtime", ["float32", "int8"])
@pytest.mark.parametrize(
    "pattern", ["(ab|cd)+e{3}f", "[a-h]{5,9}", "(hello|help) (world|word)!", "[a-z ]{3,30}\\."]
)
def test_greedy_constrained_speculation_equals_plain_constrained(pair, runtime, pattern):
    target, draft = pair
    if runtime == "int8":  # on copies: the conversion changes a model in place
        target = make_int8_batch_invariant(copy.deepcopy(target))
        draft = make_int8_batch_invariant(copy.deepcopy(draft))
    tokenizer = char_tokenizer()
    params = SamplingParams(max_tokens=40, temperature=0, constraint=Constraint("regex", pattern))
    plain = Engine(backend(target, tokenizer)).generate(START, params)
    assert re.fullmatch(pattern, plain.text) or plain.finish_reason == "length"
    for drafter, spec in (
        (ModelDrafter(backend(draft)), SpecConfig(k=1)),
        (ModelDrafter(backend(draft)), SpecConfig(k=5)),
        (ModelDrafter(backend(draft)), SpecConfig(k="auto")),
        (PromptLookupDrafter(), SpecConfig(k=3, forced_drafts=False)),
    ):
        out = Engine(backend(target, tokenizer), drafter).generate(START, params, spec)
        assert out.token_ids == plain.token_ids and out.finish_reason == plain.finish_reason


def test_forced_tokens_are_free_drafts_always_accepted(pair):
    """Where the pattern allows one character only, it is proposed at no draft cost."""
    target, draft = pair
    pattern = "(hello|help), (world|word)!"
    params = SamplingParams(max_tokens=60, temperature=0, constraint=Constraint("regex", pattern))
    engine = Engine(backend(target, char_tokenizer()), ModelDrafter(backend(draft)))
    out = engine.generate(START, params, SpecConfig(k=3))
    plain = engine.generate(START, params, SpecConfig(k=0))
    assert out.token_ids == plain.token_ids and re.fullmatch(pattern, out.text)
    forced = out.stats.by_drafter["grammar"]
    assert forced["drafted"] >= 4 and forced["accepted"] == forced["drafted"]
    assert "grammar" not in plain.stats.by_drafter  # k = 0: plain decoding, no drafts at all
    assert out.stats.rounds < plain.stats.rounds
    # the draft drafts on after the forced tokens in the same round: rounds that hold both
    # are counted once in the total and once for each drafter
    by_drafter = out.stats.by_drafter
    assert by_drafter["grammar"]["rounds"] + by_drafter["model"]["rounds"] > out.stats.rounds
    alone = engine.generate(START, params, SpecConfig(k=3, forced_drafts=False))
    assert alone.token_ids == plain.token_ids and out.stats.rounds < alone.stats.rounds


def test_a_round_of_forced_drafts_alone_is_counted_as_one_with_the_drafters(pair):
    """Where the forced run fills the round's room ("xyzw" with 5 tokens to go), the
    drafter sits it out; its stats read as those of a forced run the drafter drafts after:
    the grammar's drafts, none by position, and the target's token after them a bonus."""
    target, draft = pair
    params = SamplingParams(
        max_tokens=5, temperature=0, constraint=Constraint("regex", "xyzw[a-h]")
    )
    engine = Engine(backend(target, char_tokenizer()), ModelDrafter(backend(draft)))
    out = engine.generate(START, params, SpecConfig(k=3))
    assert out.stats.rounds == 1 and len(out.token_ids) == 5
    assert out.stats.by_drafter == {"grammar": {"rounds": 1, "drafted": 4, "accepted": 4}}
    assert sum(out.stats.drafted_per_position) == 0 and out.stats.bonus_tokens == 1


class CountedPasses:
    """A backend whose forward passes are counted."""

    def __init__(self, inner):
        self.inner, self.passes = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def forward(self, token_ids, last_only=False):
        self.passes += 1
        return self.inner.forward(token_ids, last_only)


def test_the_draft_reads_forced_tokens_mid_chain_in_the_pass_before_them(pair, monkeypatch):
    """Where the grammar forces tokens after a draft ("xyzw" after the first letter), the
    draft reads them in the pass that feeds that draft, as a guide's guesses, and picks them
    from its masked rows without a pass each: the same proposal, in 2 draft passes not 6."""
    target, draft = pair
    params = SamplingParams(
        max_tokens=7, temperature=0, constraint=Constraint("regex", "[a-h]xyzw[a-h]")
    )
    tokenizer = char_tokenizer()
    outs, passes = [], []
    for guessed in (True, False):
        if not guessed:
            monkeypatch.setattr(DraftMask, "forced", lambda self, position: [])
        counted = CountedPasses(backend(draft))
        out = Engine(backend(target, tokenizer), ModelDrafter(counted)).generate(
            START, params, SpecConfig(k=6, forced_drafts=False)
        )
        outs.append(out)
        passes.append(counted.passes)
    plain = Engine(backend(target, tokenizer)).generate(START, params)
    assert outs[0].token_ids == outs[1].token_ids == plain.token_ids
    assert outs[0].stats.rounds == outs[1].stats.rounds == 1  # the whole answer drafted
    assert passes == [3, 7]  # the prefill, then 2 draft passes against 6


def test_forced_drafts_lead_the_drafters_as_point_masses():
    """``after_given``: the grammar's tokens first, each a point mass, the drafter's rows
    after them unchanged; ``drafters_part`` gives the drafter's proposal back."""
    probs = torch.softmax(torch.randn(2, 6), -1)
    drafted = Proposal([4, 2], probs, "model", [0.5, 0.25])
    joined = after_given([3, 1, 5], drafted)
    assert joined.token_ids == [3, 1, 5, 4, 2] and joined.given == 3
    assert joined.draft_probs is not None
    assert torch.equal(joined.draft_probs[:3], torch.eye(6)[[3, 1, 5]])
    assert torch.equal(joined.draft_probs[3:], probs)
    part = joined.drafters_part()
    assert part.token_ids == [4, 2] and part.confidences == [0.5, 0.25]
    assert part.draft_probs is not None and torch.equal(part.draft_probs, probs)
    assert after_given([], drafted) is drafted
    assert after_given([3], Proposal([4])).draft_probs is None  # greedy drafts: point masses


def test_a_grammar_the_vocabulary_cannot_spell_is_a_clear_error(pair):
    """The tiny vocabulary has no "{": JSON cannot be written with it."""
    params = SamplingParams(max_tokens=10, temperature=0, constraint=Constraint("json_object"))
    with pytest.raises(ValueError, match="the grammar cannot go on"):
        Engine(backend(pair[0], char_tokenizer())).generate(START, params)


def constrained_marginals(model, prompt: list[int] = START, middle: str = "") -> list[np.ndarray]:
    """The target's exact distribution of the two letters of [a-h]{middle}[a-h] after
    ``prompt`` (``middle``: letters the grammar forces between them)."""
    mask = torch.full((32,), float("-inf"))
    mask[ALLOWED] = 0.0
    with torch.inference_mode():
        first = torch.softmax(model(torch.tensor([prompt])).logits[0, -1] + mask, -1)
        pairs = torch.tensor([prompt + [x] + ids(middle) for x in range(32)])
        second = torch.softmax(model(pairs).logits[:, -1] + mask, -1)  # [x, y]
    return [first.numpy(), (first @ second).numpy()]


def sample(pair, spec: SpecConfig, seeded: bool, forced: str = "", middle: str = "") -> np.ndarray:
    """Counts of the two letters of [a-h][a-h] over DRAWS requests; ``forced``: letters the
    grammar forces before them (the first round's drafts start with them); ``middle``:
    between them (the draft reads them as guesses after its first letter)."""
    target, draft = pair
    engine = Engine(backend(target, char_tokenizer()), ModelDrafter(backend(draft)))
    counts = np.zeros((2, 32))
    constraint = Constraint("regex", f"{forced}[a-h]{middle}[a-h]")
    length = len(forced) + len(middle) + 2
    for i in range(DRAWS):
        params = SamplingParams(
            max_tokens=length + 1 if length > 2 else 2,  # room for every draft after forced
            temperature=1.0,
            seed=i if seeded else None,
            constraint=constraint,
        )
        out = engine.generate(START, params, spec)
        assert out.token_ids[: len(forced)] == ids(forced)
        letters = out.token_ids[len(forced) :: len(middle) + 1][:2]  # a mutant may end at EOS
        for position, token_id in enumerate(letters):
            counts[position, token_id] += 1
    return counts


def drafted_forbidden(pair) -> float:
    """How often the model drafts a token outside a-h as the first draft."""
    with torch.inference_mode():
        q = torch.softmax(pair[1](torch.tensor([START])).logits[0, -1], -1)
    return 1.0 - float(q[ALLOWED].sum())


@pytest.mark.parametrize("masked", [True, False], ids=["drafts masked", "drafts unmasked"])
@pytest.mark.parametrize("verification", ["rejection", "coupled"])
def test_constrained_speculative_sampling_follows_the_constrained_target(
    pair, verification, masked, monkeypatch
):
    """Drafts drawn from the grammar-masked draft rows (the default), and from the raw ones,
    where forbidden drafts are common and verification must reject them."""
    monkeypatch.setattr(Run, "mask_drafts", masked)
    assert drafted_forbidden(pair) > 0.3, "forbidden drafts must be common, or that path is idle"
    counts = sample(pair, SpecConfig(k=2, verification=verification), verification == "coupled")
    assert counts.sum() == 2 * DRAWS  # every output is two letters
    for position, expected in enumerate(constrained_marginals(pair[0])):
        assert_same_distribution(counts[position], expected)


@pytest.mark.parametrize("verification", ["rejection", "coupled"])
def test_drafts_after_forced_tokens_follow_the_constrained_target(pair, verification):
    """The grammar forces "xz" first: the first round drafts "x", "z" (point masses) and
    the draft's two letters after them, verified in one pass."""
    spec = SpecConfig(k=2, verification=verification)
    counts = sample(pair, spec, verification == "coupled", forced="xz")
    assert counts.sum() == 2 * DRAWS
    for position, expected in enumerate(constrained_marginals(pair[0], START + ids("xz"))):
        assert_same_distribution(counts[position], expected)


@pytest.mark.parametrize("verification", ["rejection", "coupled"])
def test_drafts_through_forced_tokens_mid_chain_follow_the_constrained_target(pair, verification):
    """The grammar forces "xz" between the letters: the draft reads them as guesses after
    its first letter and drafts the second one in the same round (k = 4)."""
    spec = SpecConfig(k=4, verification=verification, forced_drafts=False)
    counts = sample(pair, spec, verification == "coupled", middle="xz")
    assert counts.sum() == 2 * DRAWS
    for position, expected in enumerate(constrained_marginals(pair[0], START, "xz")):
        assert_same_distribution(counts[position], expected)


def _misaligned_after_given(given, proposal):
    """The forced drafts' point masses left out: the drafter's rows verify the tokens
    before their own (its last row repeated to fill the chain)."""
    joined = ORIGINAL_AFTER_GIVEN(given, proposal)
    if joined.draft_probs is None or not given:
        return joined
    probs = proposal.draft_probs
    filler = probs[-1:].expand(len(given), -1)
    return Proposal(joined.token_ids, torch.cat([probs, filler]), joined.drafter, given=len(given))


def test_the_statistical_check_catches_misaligned_forced_rows(pair, monkeypatch):
    monkeypatch.setattr(engine_module, "after_given", _misaligned_after_given)
    counts = sample(pair, SpecConfig(k=2, verification="rejection"), seeded=False, forced="xz")
    failures = 0
    for position, expected in enumerate(constrained_marginals(pair[0], START + ids("xz"))):
        try:
            assert_same_distribution(counts[position], expected)
        except AssertionError:
            failures += 1
    assert failures > 0, f"the check at {SIGNIFICANCE} missed the mutant"


def _unmasked(self, draft_ids, logits):
    return len(draft_ids), logits.float()


def _cut_before_forbidden(self, draft_ids, logits):
    kept, rows = ORIGINAL_MASK(self, draft_ids, logits)
    if kept and not torch.isfinite(rows[kept - 1, draft_ids[kept - 1]]):
        return kept - 1, rows[:kept]  # the forbidden draft dropped: its row becomes the bonus
    return kept, rows


ORIGINAL_MASK = Grammar.mask
ORIGINAL_AFTER_GIVEN = after_given
ORIGINAL_PICK = Sampler.pick


def _draft_q_unmasked(self, logits, position=None):
    token_id, probs = ORIGINAL_PICK(self, logits, position)
    if probs is None or self.draft_mask is None:
        return token_id, probs
    return token_id, self.probs(logits.unsqueeze(0))[0]  # drawn masked, reported raw


def test_the_sample_size_detects_the_mutants(pair):
    """Two mutants' first token, worked out: with Qa the draft's mass on a-h, p the masked
    target and r the residual max(p - q, 0) normalised, the cut mutant emits
    p + (1 - Qa) (p - r); the raw-q mutant q' min(1, p / q) + (1 - sum of it) r. Their
    effect sizes w on this pair, and the power of the check."""
    target, draft = pair
    with torch.inference_mode():
        q = torch.softmax(draft(torch.tensor([START])).logits[0, -1], -1).double().numpy()
    p = constrained_marginals(target)[0].astype(float)
    residual = np.maximum(p - q, 0)
    residual /= residual.sum()
    cut = p + (1 - q[ALLOWED].sum()) * (p - residual)
    # drafts drawn from the masked q' but verified against the raw q: accepted with
    # min(1, p / q) > min(1, p / q'), the residual still max(p - q, 0)
    masked = np.zeros_like(q)
    masked[ALLOWED] = q[ALLOWED] / q[ALLOWED].sum()
    accepted = masked * np.minimum(1.0, p / q)
    wrong_q = accepted + (1 - accepted.sum()) * residual
    df = len(ALLOWED) - 1
    for mutant in (cut, wrong_q):
        w = float(np.sqrt(((mutant - p)[ALLOWED] ** 2 / p[ALLOWED]).sum()))
        power = stats.ncx2.sf(stats.chi2.isf(SIGNIFICANCE, df), df, DRAWS * w**2)
        assert w >= 0.2 and power >= 0.99, (w, power)


MUTANTS = {  # what is replaced, and whether drafts are masked
    # rows left unmasked (the grammar still follows the tokens, refusing none)
    "unmasked rows": (
        [(Grammar, "mask", _unmasked), (Grammar, "advance", lambda self, ids: len(ids))],
        False,
    ),
    "forbidden draft cut": ([(Grammar, "mask", _cut_before_forbidden)], False),
    "masked draft verified as raw": ([(Sampler, "pick", _draft_q_unmasked)], True),
}


@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_the_statistical_check_catches_mutants(pair, monkeypatch, mutant):
    replacements, masked = MUTANTS[mutant]
    for owner, name, replacement in replacements:
        monkeypatch.setattr(owner, name, replacement)
    monkeypatch.setattr(Run, "mask_drafts", masked)
    counts = sample(pair, SpecConfig(k=2, verification="rejection"), seeded=False)
    failures = 0
    for position, expected in enumerate(constrained_marginals(pair[0])):
        try:
            assert_same_distribution(counts[position], expected)
        except AssertionError:
            failures += 1
    assert failures > 0, f"the check at {SIGNIFICANCE} missed the mutant"
