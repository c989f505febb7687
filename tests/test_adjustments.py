"""logit_bias and the repetition, frequency and presence penalties (``adjustments.py``):
hand-computed rows; greedy speculative output equal to plain decoding with them (float32,
and the int8 and int4 runtimes with trees and batches, bit for bit); sampled output
following the changed target distribution at every position, with a negative control that
forgets the drafts ahead of a row.

Statistical power: the marginals are checked as in ``test_engine_statistical`` (DRAWS
requests, chi-square at 1e-4, power >= 0.99 at effect size w = 0.2). Penalties act on
repeats, which the marginals of single positions hardly show, so each case also checks how
often a token repeats an earlier one of the output (two cells: repeat or not) against the
exact probability; the mutant that forgets the drafts on a row's path repeats tokens far
more often, and ``test_drafts_left_out_of_the_counts_are_caught`` requires the check to fail.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
import torch

import specdec.engine
from helpers import VOCAB, assert_same_distribution, backend, decode_together
from specdec import Engine, SamplingParams, SpecConfig
from specdec.adjustments import DraftRows, adjusted, adjusts, columns, held_back, row_paths
from specdec.backends.hf import HFModel
from specdec.backends.quant.convert import make_int4_batch_invariant, make_int8_batch_invariant
from specdec.config import Constraint
from specdec.drafters import ModelDrafter, PromptLookupDrafter
from specdec.sampling import logits_to_probs
from test_engine_statistical import DRAWS, pair, prompt  # noqa: F401

# ---- the rows, by hand ----------------------------------------------------------------------

ROW = [1.0, 2.0, -1.0, 0.5]


def changed(logits, params, counts, seen, paths):
    """``adjusted`` with the output's ``columns``."""
    return adjusted(logits, params, columns(params, counts, seen), paths)


def test_a_bias_is_added_to_its_token_alone_on_every_row():
    params = SamplingParams(logit_bias={0: 1.5, 3: -100})
    out = changed(torch.tensor([ROW, ROW]), params, {1: 1}, {2}, [[], [1]])
    assert out.tolist() == [[2.5, 2.0, -1.0, -99.5]] * 2


def test_repetition_divides_positive_logits_and_multiplies_negative_ones_of_seen_tokens():
    params = SamplingParams(repetition_penalty=2.0)
    out = changed(torch.tensor([ROW]), params, {}, {1, 2}, [[]])
    assert out.tolist() == [[1.0, 1.0, -2.0, 0.5]]


def test_frequency_and_presence_count_the_output_and_the_drafts_on_each_row_path():
    params = SamplingParams(frequency_penalty=0.25, presence_penalty=0.5)
    logits = torch.tensor([ROW, ROW, ROW])
    # output so far: token 1 twice; row 1 follows draft 3, row 2 drafts 3 and 1
    out = changed(logits, params, {1: 2}, set(), [[], [3], [3, 1]])
    assert out.tolist() == [
        [1.0, 2.0 - 0.5 - 0.5, -1.0, 0.5],
        [1.0, 2.0 - 0.5 - 0.5, -1.0, 0.5 - 0.25 - 0.5],
        [1.0, 2.0 - 0.75 - 0.5, -1.0, 0.5 - 0.25 - 0.5],
    ]


def test_everything_at_once_in_vllms_order():
    """Bias first, then repetition (prompt and output), frequency, presence."""
    params = SamplingParams(
        logit_bias={0: 1.5}, presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=2.0
    )
    out = changed(torch.tensor([ROW, ROW]), params, {1: 2}, {1, 2}, [[], [3]])
    # token 1: (2 / 2) - 2 * 0.25 - 0.5; token 3 on row 1: drafted, so seen and counted once
    assert out.tolist() == [
        [2.5, 0.0, -2.0, 0.5],
        [2.5, 0.0, -2.0, 0.25 - 0.25 - 0.5],
    ]


def test_the_input_is_left_alone_and_neutral_params_change_nothing():
    logits = torch.tensor([ROW])
    changed(logits, SamplingParams(logit_bias={0: 3.0}, repetition_penalty=3.0), {}, {0}, [[]])
    assert logits.tolist() == [ROW]
    assert not adjusts(SamplingParams())
    assert adjusts(SamplingParams(repetition_penalty=1.1))
    assert changed(logits, SamplingParams(), {1: 3}, {1}, [[]]).tolist() == [ROW]


def test_row_paths_of_a_chain_and_of_a_tree():
    assert row_paths([5, 6, 7], None) == [[], [5], [5, 6], [5, 6, 7]]
    # nodes: 5 under the root, 6 under 5, 7 beside 5
    assert row_paths([5, 6, 7], [-1, 0, -1]) == [[], [5], [5, 6], [7]]


def test_a_block_row_is_the_steps_row_bit_for_bit():
    """Row i of a block, its drafts on the path, equals the same row adjusted alone with
    those drafts already in the output: the same bits (each element is changed alone)."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 1000, generator=generator) * 4
    drafts = [7, 7, 3, 999]
    params = SamplingParams(
        logit_bias={7: 0.3, 5: -2.0}, presence_penalty=0.7, frequency_penalty=0.3,
        repetition_penalty=1.3,
    )  # fmt: skip
    output = [3, 5, 5]
    block = changed(logits, params, Counter(output), {1, 2, *output}, row_paths(drafts, None))
    for i in range(len(drafts) + 1):
        so_far = output + drafts[:i]
        alone = changed(logits[i : i + 1], params, Counter(so_far), {1, 2, *so_far}, [[]])
        assert torch.equal(block[i], alone[0]), f"row {i}"


def test_draft_rows_follow_the_drafts_picked_before_them():
    """``DraftRows``: the row at a position is the target's row there, its path the drafts
    picked before it (the given ones first); a pick again from an earlier position drops
    what came after; a row whose path is unknown, or of another vocabulary, is left alone."""
    params = SamplingParams(frequency_penalty=1.0, presence_penalty=0.5)
    row = torch.tensor(ROW)
    rows = DraftRows(params, columns(params, {0: 1}, set()), start=10, vocab=4, given=[2])
    assert rows.row(10, row).tolist() == [-0.5, 2.0, -1.0, 0.5]
    assert rows.row(11, row).tolist() == [-0.5, 2.0, -2.5, 0.5]
    rows.picked(11, 3)
    assert rows.row(12, row).tolist() == [-0.5, 2.0, -2.5, -1.0]
    assert rows.row(13, row).tolist() == ROW  # position 12 not picked: unknown path
    rows.picked(12, 3)
    assert rows.row(13, row).tolist() == [-0.5, 2.0, -2.5, -2.0]
    rows.picked(11, 1)  # drafting again from position 11
    assert rows.row(12, row).tolist() == [-0.5, 0.5, -2.5, 0.5]
    assert rows.row(13, row).tolist() == ROW
    assert rows.row(11, torch.tensor([*ROW, 0.0])).tolist() == [*ROW, 0.0]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"logit_bias": {"7": 1.0}}, "keys must be token ids"),
        ({"logit_bias": {-1: 1.0}}, "keys must be token ids"),
        ({"logit_bias": {7: 101.0}}, r"in \[-100, 100\]"),
        ({"logit_bias": {7: float("nan")}}, r"in \[-100, 100\]"),
        ({"logit_bias": [1, 2]}, "must map token ids"),
        ({"presence_penalty": 2.5}, r"presence_penalty must be a number in \[-2, 2\]"),
        ({"frequency_penalty": True}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, r"repetition_penalty must be a number in \[0.01, 100\]"),
        ({"repetition_penalty": 5e-324}, "repetition_penalty"),  # schemathesis found it: NaN
        ({"repetition_penalty": 1e39}, "repetition_penalty"),
    ],
)
def test_bad_values_are_refused_by_name(fields, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**fields)


def test_params_stay_hashable_and_the_bias_is_kept_as_sorted_pairs():
    params = SamplingParams(logit_bias={9: 1, 2: -3.5})
    assert params.logit_bias == ((2, -3.5), (9, 1.0))
    assert hash(params) == hash(SamplingParams(logit_bias=((9, 1.0), (2, -3.5))))


def test_a_bias_outside_the_vocabulary_is_refused(target_model):
    engine = Engine(backend(target_model))
    with pytest.raises(ValueError, match="logit_bias names ids outside the vocabulary"):
        engine.generate([5], SamplingParams(logit_bias={VOCAB: 1.0}))


# ---- greedy: speculative == plain ---------------------------------------------------------------

PROMPTS = {"short": [8, 5, 12, 12, 15], "long": [(7 * i + 3) % 31 + 1 for i in range(40)]}
PENALISED = SamplingParams(
    max_tokens=40, temperature=0.0, ignore_eos=True, presence_penalty=0.4,
    frequency_penalty=0.3, repetition_penalty=1.2, logit_bias={4: 1.0, 9: -100},
)  # fmt: skip


ALONE = {
    "all of them": {},
    "bias alone": {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0},
    "repetition alone": {"presence_penalty": 0.0, "frequency_penalty": 0.0, "logit_bias": {}},
    "presence alone": {
        "presence_penalty": 1.5,
        "frequency_penalty": 0.0,
        "repetition_penalty": 1.0,
        "logit_bias": {},
    },
}


@pytest.mark.parametrize("setting", list(ALONE))
@pytest.mark.parametrize("prompt_name", list(PROMPTS))
def test_greedy_with_penalties_equals_plain_for_every_k(
    target_model, draft_model, prompt_name, setting
):
    text = PROMPTS[prompt_name]
    params = replace(PENALISED, **ALONE[setting])
    plain = Engine(backend(target_model))
    expected = plain.generate(text, params).token_ids
    unpenalised = plain.generate(text, replace(PENALISED, **NEUTRAL)).token_ids
    # (the long prompt holds every token of the vocabulary: a repetition penalty alone then
    # scales every logit alike, and the argmax stays)
    if (prompt_name, setting) != ("long", "repetition alone"):
        assert expected != unpenalised, "the change must change the output, or nothing is tested"
    speculative = Engine(backend(target_model), ModelDrafter(backend(draft_model)))
    accepted = 0
    for k in [*range(1, 9), "auto"]:
        out = speculative.generate(text, params, SpecConfig(k=k))
        assert out.token_ids == expected, f"k = {k}"
        accepted += out.stats.accepted_tokens
    lookup = Engine(backend(target_model), PromptLookupDrafter())
    assert lookup.generate(text, params, SpecConfig(k=4)).token_ids == expected
    assert accepted > 0
    if params.logit_bias:
        assert 9 not in expected


NEUTRAL = {
    "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
    "logit_bias": {},
}  # fmt: skip


@pytest.fixture(scope="module", params=["int8", "int4"])
def runtime_pair(request, target_model, draft_model):
    convert = make_int8_batch_invariant if request.param == "int8" else make_int4_batch_invariant
    return tuple(convert(copy.deepcopy(model)) for model in (target_model, draft_model))


def test_quantized_chains_and_trees_with_penalties_equal_plain(runtime_pair):
    """On the batch-invariant runtimes: chains, trees and seeded (coupled) sampling give
    plain decoding's tokens with the penalties."""
    target, draft = runtime_pair
    plain = Engine(backend(target))
    speculative = Engine(backend(target), ModelDrafter(backend(draft)))
    text = PROMPTS["long"]
    expected = plain.generate(text, PENALISED).token_ids
    siblings = 0
    for k, tree in [(3, "off"), (6, "off"), (4, "full"), (8, "full"), (5, "deep")]:
        out = speculative.generate(text, PENALISED, SpecConfig(k=k, tree=tree))
        assert out.token_ids == expected, f"k = {k}, tree {tree}"
        siblings += out.stats.sibling_accepted
    assert siblings > 0, "a sibling leaf must be taken, or tree paths are not tested"
    seeded = replace(PENALISED, temperature=0.8, seed=7)
    expected = plain.generate(text, seeded).token_ids
    for spec in (SpecConfig(k=4, verification="coupled"), SpecConfig(k=4, tree="full")):
        assert speculative.generate(text, seeded, spec).token_ids == expected


def test_a_batch_with_penalties_equals_plain(runtime_pair):
    """Requests stepped together (``step_together``), each with its own penalties."""
    from specdec.backends.batched import BatchedModel

    target_model, draft_model = runtime_pair
    settings = [PENALISED, replace(PENALISED, **NEUTRAL), replace(PENALISED, presence_penalty=2)]
    expected = [Engine(backend(target_model)).generate(PROMPTS["long"], p) for p in settings]
    target, draft = BatchedModel(target_model), BatchedModel(draft_model)
    runs = []
    for params in settings:
        engine = Engine(target.sequence(), ModelDrafter(draft.sequence()))
        runs.append(engine.begin(PROMPTS["long"], params, SpecConfig(k=3)))
        runs[-1].start()
    tokens = decode_together(runs, target.forward_many)
    assert tokens == [out.token_ids for out in expected]


# ---- sampling: the changed distribution, exactly ----------------------------------------------

STRONG = SamplingParams(
    temperature=1.0, max_tokens=3, ignore_eos=True, presence_penalty=1.5,
    frequency_penalty=0.5, repetition_penalty=1.3, logit_bias={3: 1.0, 7: -100},
)  # fmt: skip


def reference_row(raw: torch.Tensor, params: SamplingParams, prompt_ids, output) -> torch.Tensor:
    """One row changed as the docs say, written out token by token (not ``adjusted``)."""
    row = raw.double().clone()
    for token, bias in params.logit_bias:
        row[token] += bias
    for token in set(prompt_ids) | set(output):
        r = params.repetition_penalty
        row[token] = row[token] / r if row[token] > 0 else row[token] * r
    for token, count in Counter(output).items():
        row[token] -= params.frequency_penalty * count + params.presence_penalty
    return row


def exact_joint(model, prompt_ids, params) -> np.ndarray:
    """P(t1, t2, t3) of the target with the penalties, by enumeration  # [V, V, V]."""

    def probs(rows, outputs):
        changed = torch.stack(
            [reference_row(r, params, prompt_ids, o) for r, o in zip(rows, outputs, strict=True)]
        )
        return logits_to_probs(changed.float(), params).double()

    with torch.inference_mode():
        first = probs(model(torch.tensor([prompt_ids])).logits[:, -1], [[]])[0]
        pairs = [[x] for x in range(VOCAB)]
        second = probs(model(torch.tensor([prompt_ids + p for p in pairs])).logits[:, -1], pairs)
        triples = [[x, y] for x in range(VOCAB) for y in range(VOCAB)]
        third = probs(model(torch.tensor([prompt_ids + t for t in triples])).logits[:, -1], triples)
    joint = first[:, None, None] * second[:, :, None] * third.reshape(VOCAB, VOCAB, VOCAB)
    return joint.numpy()


def sampled_outputs(engine, prompt_ids, params, verification, tree="off") -> tuple[list, object]:
    outputs, stats = [], []
    for seed in range(DRAWS):
        spec = SpecConfig(k=2, verification=verification, tree=tree)
        out = engine.generate(prompt_ids, replace(params, seed=seed), spec)
        outputs.append(out.token_ids)
        stats.append(out.stats)
    from specdec.metrics import SpecStats

    return outputs, SpecStats.merged(stats)


def assert_follows(outputs: list[list[int]], joint: np.ndarray) -> None:
    """Each position's marginal, and how often t2 repeats t1 and t3 repeats t1 or t2."""
    counts = np.zeros((3, VOCAB))
    repeats = np.zeros((2, 2))
    for t1, t2, t3 in outputs:
        for position, token in enumerate((t1, t2, t3)):
            counts[position, token] += 1
        repeats[0, int(t2 == t1)] += 1
        repeats[1, int(t3 in (t1, t2))] += 1
    marginals = [joint.sum(axis=(1, 2)), joint.sum(axis=(0, 2)), joint.sum(axis=(0, 1))]
    for position in range(3):
        assert_same_distribution(counts[position], marginals[position])
    same = np.eye(VOCAB, dtype=bool)
    p_second = float(joint.sum(axis=2)[same].sum())
    p_third = float(sum(joint[x, y, z] for x, y, z in np.ndindex(joint.shape) if z in (x, y)))
    assert_same_distribution(repeats[0], [1 - p_second, p_second])
    assert_same_distribution(repeats[1], [1 - p_third, p_third])


@pytest.fixture(scope="module")
def joint(pair, prompt):  # noqa: F811
    return exact_joint(pair[0], prompt, STRONG)


@pytest.mark.parametrize(
    "case",  # drafter, verification, the draft's rows
    [
        ("model", "rejection", "changed"),
        ("model", "coupled", "changed"),
        ("model", "rejection", "as given"),
        ("lookup", "rejection", "changed"),
    ],
    ids=" ".join,
)
def test_sampled_output_follows_the_penalised_target(pair, prompt, joint, case, monkeypatch):  # noqa: F811
    """The draft's rows changed alike (the default) or left as the draft gives them."""
    drafter, verification, draft_rows = case
    monkeypatch.setattr(specdec.engine.Run, "adjust_drafts", draft_rows == "changed")
    draft = ModelDrafter(backend(pair[1])) if drafter == "model" else PromptLookupDrafter()
    engine = Engine(backend(pair[0]), draft)
    outputs, stats = sampled_outputs(engine, prompt, STRONG, verification)
    # (lookup copies the prompt, which the penalties make unlikely: about 3% are accepted)
    assert stats.accepted_tokens > 50 and stats.acceptance_rate < 0.98, (
        "both acceptance and rejection must be exercised"
    )
    assert all(7 not in out for out in outputs), "a -100 bias bans the token"
    assert_follows(outputs, joint)


def test_sampled_trees_follow_the_penalised_target(pair, prompt):  # noqa: F811
    models = [make_int8_batch_invariant(copy.deepcopy(model)) for model in pair]
    engine = Engine(backend(models[0]), ModelDrafter(backend(models[1])))
    outputs, stats = sampled_outputs(engine, prompt, STRONG, "rejection", tree="full")
    assert stats.sibling_accepted > 50, "leaves must be taken often"
    assert_follows(outputs, exact_joint(models[0], prompt, STRONG))


def test_drafts_left_out_of_the_counts_are_caught(pair, prompt, joint, monkeypatch):  # noqa: F811
    """Negative control: each row counted as if the drafts before it were not there (the
    output so far alone, as a sampler that knows nothing of speculation counts). The same
    check must fail."""
    monkeypatch.setattr(
        specdec.engine, "row_paths", lambda token_ids, parents: [[]] * (len(token_ids) + 1)
    )
    engine = Engine(backend(pair[0]), ModelDrafter(backend(pair[1])))
    outputs, _ = sampled_outputs(engine, prompt, STRONG, "rejection")
    with pytest.raises(AssertionError, match="differs|impossible"):
        assert_follows(outputs, joint)


# ---- min_tokens (vLLM's): no end before that many tokens ----------------------------------------


def test_held_back_rows_by_hand():
    logits = torch.zeros(4, 5)
    out = held_back(logits, [0, 3], written=[2, 3, 4, 5], min_tokens=4)
    assert torch.isinf(out[:2, [0, 3]]).all() and (out[:2, [1, 2, 4]] == 0).all()
    assert (out[2:] == 0).all() and (logits == 0).all()  # a copy; rows from 4 on untouched
    assert held_back(logits, [0], written=[4, 5, 6, 7], min_tokens=4) is logits


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"min_tokens": -1}, "min_tokens must be in"),
        ({"min_tokens": 65}, r"min_tokens must be in \[0, max_tokens = 64\]"),
        ({"min_tokens": True}, "min_tokens must be an integer"),
        ({"min_tokens": 2, "constraint": Constraint("json_object")}, "not combined"),
    ],
)
def test_bad_min_tokens_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**fields)


def early_end(target_model, prompt_ids) -> tuple[HFModel, int]:
    """A backend of the target whose EOS is a token its greedy output gives at position 2."""
    target = backend(target_model)
    free = Engine(target).generate(
        prompt_ids, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    )
    target.eos_token_ids = frozenset({free.token_ids[2]})
    return target, free.token_ids[2]


@pytest.mark.parametrize("runtime", ["float32", "int8", "int4"])
def test_greedy_with_min_tokens_equals_plain_for_every_k(target_model, draft_model, runtime):
    """EOS (and a stop token) held back until min_tokens: plain decoding then runs past
    where it would have ended; speculation gives its tokens for k 1-8 and auto, chains and
    (int8/int4) trees."""
    convert = {"int8": make_int8_batch_invariant, "int4": make_int4_batch_invariant}
    model, draft_model_ = target_model, draft_model
    if runtime in convert:
        model = convert[runtime](copy.deepcopy(target_model))
        draft_model_ = convert[runtime](copy.deepcopy(draft_model))
    prompt_ids = PROMPTS["short"]
    target, eos = early_end(model, prompt_ids)
    params = SamplingParams(max_tokens=24, temperature=0.0, min_tokens=12, stop_token_ids=(7,))
    expected = Engine(target).generate(prompt_ids, params)
    unheld = Engine(target).generate(prompt_ids, replace(params, min_tokens=0))
    assert len(unheld.token_ids) <= 3, "the end must come early, or nothing is held back"
    assert len(expected.token_ids) >= 12 and eos not in expected.token_ids[:11]
    assert 7 not in expected.token_ids[:11]
    speculative = Engine(target, ModelDrafter(backend(draft_model_)))
    for k in [*range(1, 9), "auto"]:
        assert speculative.generate(prompt_ids, params, SpecConfig(k=k)).token_ids == (
            expected.token_ids
        ), f"k = {k}"
    if runtime != "float32":
        tree = speculative.generate(prompt_ids, params, SpecConfig(k=4, tree="full"))
        assert tree.token_ids == expected.token_ids


def test_a_stop_string_before_min_tokens_does_not_end_the_output(target_model, tokenizer):
    engine = Engine(backend(target_model, tokenizer))
    free = engine.generate([3, 4], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))
    stop = free.text[2:4]
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True, stop=(stop,))
    assert engine.generate([3, 4], params).text == free.text[:2]
    later = free.text.find(stop, 10 - len(stop) + 1)
    held = engine.generate([3, 4], replace(params, min_tokens=10))
    assert held.text == (free.text[:later] if later >= 0 else free.text)


def exact_held_joint(model, prompt_ids, end_id: int, min_tokens: int) -> np.ndarray:
    """P(t1, t2, t3) of the target at temperature 1 with ``end_id`` held back at the first
    ``min_tokens`` positions, by enumeration  # [V, V, V]."""

    def probs(logits, position):
        logits = logits.float().clone()
        if position < min_tokens:
            logits[:, end_id] = -torch.inf
        return torch.softmax(logits, dim=-1).double()

    with torch.inference_mode():
        first = probs(model(torch.tensor([prompt_ids])).logits[:, -1], 0)[0]
        pairs = torch.tensor([prompt_ids + [x] for x in range(VOCAB)])
        second = probs(model(pairs).logits[:, -1], 1)
        triples = torch.tensor([prompt_ids + [x, y] for x in range(VOCAB) for y in range(VOCAB)])
        third = probs(model(triples).logits[:, -1], 2)
    joint = first[:, None, None] * second[:, :, None] * third.reshape(VOCAB, VOCAB, VOCAB)
    return joint.numpy()


def held_outputs(pair, prompt_ids, verification):  # noqa: F811
    """DRAWS seeded outputs of 3 tokens, min_tokens 2, the end token the one likeliest
    third (so that it is often held back at the first two, and often taken at the third)."""
    target = backend(pair[0])
    end_id = int(exact_held_joint(pair[0], prompt_ids, 0, 0).sum(axis=(0, 1)).argmax())
    target.eos_token_ids = frozenset({end_id})
    engine = Engine(target, ModelDrafter(backend(pair[1])))
    params = SamplingParams(max_tokens=3, temperature=1.0, min_tokens=2)
    outputs, stats = sampled_outputs(engine, prompt_ids, params, verification)
    return outputs, stats, end_id


def assert_marginals(outputs, joint) -> None:
    counts = np.zeros((3, VOCAB))
    for out in outputs:
        assert len(out) == 3, "no end before min_tokens, max_tokens 3"
        for position, token in enumerate(out):
            counts[position, token] += 1
    marginals = [joint.sum(axis=(1, 2)), joint.sum(axis=(0, 2)), joint.sum(axis=(0, 1))]
    for position in range(3):
        assert_same_distribution(counts[position], marginals[position])


@pytest.mark.parametrize("verification", ["rejection", "coupled"])
def test_sampled_output_with_min_tokens_follows_the_held_back_target(pair, prompt, verification):  # noqa: F811
    outputs, stats, end_id = held_outputs(pair, prompt, verification)
    assert stats.accepted_tokens > 50 and stats.acceptance_rate < 0.98
    assert all(end_id not in out[:2] for out in outputs)
    joint = exact_held_joint(pair[0], prompt, end_id, 2)
    assert joint.sum(axis=(0, 1))[end_id] > 0.02, "the end must be likely at position 3"
    assert_marginals(outputs, joint)


def test_min_tokens_counted_without_the_drafts_ahead_is_caught(pair, prompt, monkeypatch):  # noqa: F811
    """Negative control: each row held back as if the drafts before it were not there (the
    output's length at the round's start for every row): the end is then held back too
    long, and the same check must fail."""
    monkeypatch.setattr(
        specdec.engine, "row_paths", lambda token_ids, parents: [[]] * (len(token_ids) + 1)
    )
    outputs, _, end_id = held_outputs(pair, prompt, "rejection")
    with pytest.raises(AssertionError, match="differs|impossible"):
        assert_marginals(outputs, exact_held_joint(pair[0], prompt, end_id, 2))
