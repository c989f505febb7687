"""Medusa and EAGLE drafting: exact with the target, their caches following the text,
EAGLE's layer on the int4 and int8 layer stack."""

from __future__ import annotations

import pytest
import torch

from helpers import EOS_ID, VOCAB, backend, tiny_llama
from specdec import Engine, SamplingParams, SpecConfig
from specdec.backends.quant.convert import make_int8_batch_invariant
from specdec.heads import store
from specdec.heads.fingerprint import target_fingerprint
from specdec.heads.load import load_heads
from specdec.heads.nets import KINDS
from specdec.sampling import Sampler

# ---- drafting --------------------------------------------------------------------------


def test_settings_a_checkpoint_was_not_started_with_are_refused(tmp_path):
    """Continuing cannot change the heads' shape: a --vocab-size, --num-heads (Medusa),
    --intermediate-size or --init (EAGLE) other than the checkpoint's is refused, one the
    same or left out is not."""
    from argparse import Namespace

    from specdec.heads.nets import HeadsConfig
    from specdec.heads.train import check_continuing

    config = HeadsConfig(
        kind="eagle",
        fingerprint="f",
        hidden_size=8,
        vocab_size=151936,
        token_ids=list(range(16384 + 5)),  # 16,384 asked, 5 special tokens beyond them
        intermediate_size=2048,
    )

    def check(
        vocab_size=None, num_heads=None, intermediate_size=None, kind="eagle", init=None, **kw
    ):
        args = Namespace(
            kind=kind,
            vocab_size=vocab_size,
            num_heads=num_heads,
            intermediate_size=intermediate_size,
            init=init,
        )
        check_continuing(args, config, tmp_path / ".eagle.checkpoint.pt", **kw)

    check()
    check(vocab_size=16384, intermediate_size=2048, num_heads=7)  # heads: Medusa's only
    with pytest.raises(ValueError, match="--vocab-size 32768 \\(it scores 16389 tokens\\)"):
        check(vocab_size=32768)
    with pytest.raises(
        ValueError, match="--vocab-size 8000 .*--intermediate-size 4096 .*--restart"
    ):
        check(vocab_size=8000, intermediate_size=4096)
    with pytest.raises(ValueError, match="--num-heads 3 \\(it has 4\\)"):
        check(num_heads=3, kind="medusa")
    check(init="target", started="target")
    check(init="random")  # a checkpoint from before --init started random
    with pytest.raises(ValueError, match="--init target \\(it started random\\)"):
        check(init="target")
    with pytest.raises(ValueError, match="--init random \\(it started target\\)"):
        check(init="random", started="target")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("k", range(1, 9))
def test_greedy_with_heads_equals_plain(target_model, trained, kind, k):
    heads, _ = trained[kind]
    params = SamplingParams(max_tokens=37, temperature=0.0, ignore_eos=True)
    drafted = accepted = 0
    for prompt in ([4], [5, 9, 2], [7, 3] * 10):
        expected = Engine(backend(target_model)).generate(prompt, params).token_ids
        target = backend(target_model)
        out = Engine(target, heads.drafter(target)).generate(prompt, params, SpecConfig(k=k))
        assert out.token_ids == expected
        assert len(out.token_ids) == 37  # cut mid-round by max_tokens at most k's
        drafted += out.stats.drafted_tokens
        accepted += out.stats.accepted_tokens
    assert drafted > 0 and accepted > 0


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pattern", ["(ab|cd)+e{3}f", "[a-h ]{5,30}\\.", "[a-z]{8,20}"])
def test_constrained_drafting_with_heads_equals_plain_constrained(
    target_model, tokenizer, trained, kind, pattern
):
    """Heads (alone and behind prompt lookup, what ``--drafter auto`` gives a long prompt)
    under a grammar: greedy output equal to plain constrained decoding's, k fixed and auto."""
    import re

    from specdec.config import Constraint
    from specdec.drafters import FallbackDrafter, PromptLookupDrafter

    heads, _ = trained[kind]
    constraint = Constraint("regex", pattern)
    params = SamplingParams(max_tokens=40, temperature=0.0, constraint=constraint)
    prompt = [5, 9, 2, 7, 3, 5, 9, 2]
    plain = Engine(backend(target_model, tokenizer)).generate(prompt, params)
    assert re.fullmatch(pattern, plain.text) or plain.finish_reason == "length"
    drafted = 0  # by the heads themselves, not the grammar's forced tokens
    for spec in (SpecConfig(k=3), SpecConfig(k="auto")):
        for in_front in (False, True):
            target = backend(target_model, tokenizer)
            drafter = heads.drafter(target)
            if in_front:
                drafter = FallbackDrafter([PromptLookupDrafter(), drafter])
            out = Engine(target, drafter).generate(prompt, params, spec)
            assert out.token_ids == plain.token_ids, (spec, in_front)
            assert out.finish_reason == plain.finish_reason
            drafted += out.stats.by_drafter.get(kind, {}).get("drafted", 0)
    assert drafted > 0


@pytest.mark.parametrize("kind", KINDS)
def test_eos_inside_an_accepted_block_ends_the_output(trained, kind):
    model = tiny_llama(seed=0)  # the conftest target, EOS id 0 honoured here
    heads, _ = trained[kind]
    params = SamplingParams(max_tokens=200, temperature=0.0)
    stopped = 0
    for start in range(1, 30):
        prompt = [start, (start * 7) % VOCAB or 1]
        expected = Engine(backend(model)).generate(prompt, params)
        target = backend(model)
        out = Engine(target, heads.drafter(target)).generate(prompt, params, SpecConfig(k=4))
        assert out.token_ids == expected.token_ids
        if out.finish_reason == "stop":
            stopped += 1
            assert out.token_ids[-1] == EOS_ID and EOS_ID not in out.token_ids[:-1]
    assert stopped > 0, "no prompt reached EOS: the case is not exercised"


@pytest.mark.parametrize("kind", KINDS)
def test_draft_probs_are_distributions_on_the_trimmed_vocabulary(target_model, trained, kind):
    heads, _ = trained[kind]
    inside = torch.zeros(VOCAB, dtype=torch.bool)
    inside[heads.config.token_ids] = True
    assert not inside.all(), "the test needs a vocabulary that leaves tokens out"
    target = backend(target_model)
    drafter = heads.drafter(target)
    context = [3, 1, 4, 1, 5, 9]
    target.forward(context[:-1])
    for seed in range(20):
        sampler = Sampler(SamplingParams(temperature=0.9, top_p=0.95, seed=seed))
        proposal = drafter.propose(context, 4, sampler)
        assert proposal.draft_probs is not None and len(proposal.token_ids) == 4
        for token, row in zip(proposal.token_ids, proposal.draft_probs, strict=True):
            assert row[token] > 0 and inside[token]
            assert torch.isclose(row.sum(), torch.tensor(1.0)) and (row[~inside] == 0).all()


@pytest.mark.parametrize("kind", KINDS)
def test_heads_decline_when_the_cache_is_elsewhere(target_model, trained, kind):
    heads, _ = trained[kind]
    target = backend(target_model)
    drafter = heads.drafter(target)
    assert drafter.propose([5], 3).token_ids == []  # one token: no feature yet
    target.forward([5, 6, 7])
    assert drafter.propose([5, 6], 3).token_ids == []  # the cache is ahead of the context


def test_eagle_cache_follows_the_text_like_a_fresh_drafter(target_model, trained):
    """Proposals after many rounds equal a fresh drafter's on the same context."""
    heads, _ = trained["eagle"]
    target = backend(target_model)
    engine = Engine(target, heads.drafter(target))
    params = SamplingParams(max_tokens=30, temperature=0.0)
    out = engine.generate([2, 3, 4], params, SpecConfig(k=3))
    context = [2, 3, 4] + out.token_ids
    target.truncate(len(context) - 1)  # the engine left it there; make sure
    assert list(target.cached_token_ids) == context[:-1]
    reused = engine.drafter.propose(context, 4).token_ids
    fresh_target = backend(target_model)
    fresh = heads.drafter(fresh_target)  # before the forward: keeping features resets a cache
    fresh_target.forward(context[:-1])
    assert len(reused) == 4 and reused == fresh.propose(context, 4).token_ids


@pytest.mark.parametrize("runtime", ["int4", "int8"])
def test_eagle_beside_an_int4_or_int8_target_runs_on_int4_and_stays_exact(
    tmp_path, target_model, trained, runtime, monkeypatch
):
    """Loaded for an int4 target, or an int8 one where the int4 kernel builds, EAGLE's layer
    runs on the int4 row kernels and ``fc`` is int4 too (without the kernel, beside int8:
    the layer's linears in int8, ``fc`` float32); greedy speculation still equals plain
    decoding on the target's runtime, every k."""
    import copy

    from specdec.backends.quant import kernels
    from specdec.backends.quant.convert import (
        make_int4_batch_invariant,
        uses_row_kernels,
    )
    from specdec.backends.quant.int4 import RowInt4Linear
    from specdec.backends.quant.int8 import RowInt8Linear

    heads, _ = trained["eagle"]
    make = make_int4_batch_invariant if runtime == "int4" else make_int8_batch_invariant
    quantized = make(copy.deepcopy(target_model))
    target = backend(quantized)
    fingerprint = target_fingerprint(quantized)
    entry = store.entry_dir(str(tmp_path), fingerprint, "tiny-quantized")
    store.save(
        entry,
        "eagle",
        heads.config.to_dict() | {"fingerprint": fingerprint},
        heads.net.state_dict(),
    )
    if runtime == "int8":
        with monkeypatch.context() as patch:
            patch.setattr(kernels, "kernel_or_none", lambda: None)  # no compiler here
            without = load_heads("eagle", target, str(tmp_path), "tiny-quantized")
        assert isinstance(without.net.fc, torch.nn.Linear)
        assert not uses_row_kernels(without.net.body)
        assert any(isinstance(m, RowInt8Linear) for m in without.net.body.modules())
        assert without.drafter(target)._stacked is None  # transformers' forward, as before
    loaded = load_heads("eagle", target, str(tmp_path), "tiny-quantized")
    assert isinstance(loaded.net.fc, RowInt4Linear) and uses_row_kernels(loaded.net.body)
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    drafted = 0
    for k in range(1, 6):
        for prompt in ([4], [7, 3] * 10):
            expected = Engine(backend(quantized)).generate(prompt, params).token_ids
            target = backend(quantized)
            out = Engine(target, loaded.drafter(target)).generate(prompt, params, SpecConfig(k=k))
            assert out.token_ids == expected, f"k={k}"
            drafted += out.stats.drafted_tokens
    assert drafted > 0


# ---- the CLI on a tiny model directory -----------------------------------------------------


def test_eagle_on_int4_runs_its_layer_on_the_stack_with_transformers_bits(
    tmp_path, target_model, trained
):
    """Beside an int4 target the head's layer runs on the kernel's layer stack
    (``layer_stack.StackedDecoder``): round after round, as its cache follows the text and
    drops drafted pairs, its drafts and draft probabilities equal those of transformers'
    forward over the same layer, bit for bit."""
    import copy

    from specdec.backends.quant.convert import make_int4_batch_invariant

    heads, _ = trained["eagle"]
    quantized = make_int4_batch_invariant(copy.deepcopy(target_model))
    fingerprint = target_fingerprint(quantized)
    entry = store.entry_dir(str(tmp_path), fingerprint, "tiny-int4")
    config = heads.config.to_dict() | {"fingerprint": fingerprint}
    store.save(entry, "eagle", config, heads.net.state_dict())
    targets = [backend(quantized), backend(quantized)]
    loaded = load_heads("eagle", targets[0], str(tmp_path), "tiny-int4")
    drafters = [loaded.drafter(target) for target in targets]
    assert drafters[0]._stacked is not None
    assert heads.drafter(backend(target_model))._stacked is None  # a float head: transformers
    drafters[1]._stacked = None  # transformers' forward with its DynamicCache
    context = [3, 9, 4, 4, 11, 2]
    params = SamplingParams(temperature=1.0, top_k=12, seed=7)
    samplers = [Sampler(params), Sampler(params)]
    for round_ in range(8):
        proposals = []
        for target, drafter, sampler in zip(targets, drafters, samplers, strict=True):
            target.truncate(min(len(target.cached_token_ids), len(context) - 1))
            target.forward(context[len(target.cached_token_ids) : -1])
            proposals.append(drafter.propose(context, 4, sampler))
        a, b = proposals
        assert a.token_ids == b.token_ids and len(a.token_ids) == 4, round_
        assert torch.equal(a.draft_probs, b.draft_probs), round_
        context += a.token_ids[: round_ % 3] + [round_ + 1]  # some drafts kept, then another
    assert drafters[0]._stacked.length > 0
