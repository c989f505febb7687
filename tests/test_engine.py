"""Engine behaviour: text and stop strings, streaming, determinism, bad input."""

from dataclasses import replace

import pytest

import specdec.engine
from helpers import EOS_ID, backend, tiny_llama
from specdec import Engine, SamplingParams, SpecConfig
from specdec.drafters import ModelDrafter, PromptLookupDrafter


@pytest.fixture(scope="module")
def engine(target_model, draft_model, tokenizer):
    return Engine(backend(target_model, tokenizer), ModelDrafter(backend(draft_model)))


@pytest.fixture(scope="module")
def plain(target_model, tokenizer):
    return Engine(backend(target_model, tokenizer))


GREEDY = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)


def test_text_is_the_decoded_tokens(engine, tokenizer):
    out = engine.generate(tokenizer.encode("hello"), GREEDY, SpecConfig(k=4))
    assert out.text == tokenizer.decode(out.token_ids, skip_special_tokens=True)
    assert len(out.text) == 40


def test_stop_string_ends_the_output_before_it(engine, plain, tokenizer):
    full = plain.generate(tokenizer.encode("hello"), GREEDY).text
    stop = full[10:13]
    expected_text = full[: full.index(stop)]
    for k in (0, 2, 5):
        params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, stop=(stop,))
        out = engine.generate(tokenizer.encode("hello"), params, SpecConfig(k=k))
        assert out.text == expected_text
        assert out.finish_reason == "stop"
        # Tokens stop with the one that completed the stop string; nothing after it.
        assert tokenizer.decode(out.token_ids).endswith(stop)
        assert stop not in tokenizer.decode(out.token_ids[:-1])


def test_stream_yields_the_same_as_generate(engine, tokenizer):
    prompt = tokenizer.encode("stream me")
    chunks = list(engine.stream(prompt, GREEDY, SpecConfig(k=3)))
    out = engine.generate(prompt, GREEDY, SpecConfig(k=3))
    assert [t for c in chunks for t in c.token_ids] == out.token_ids
    assert "".join(c.text for c in chunks) == out.text
    assert all(1 <= len(c.token_ids) <= 4 for c in chunks)
    assert [c.finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert {c.extra_kind for c in chunks} <= {"recovered", "bonus", "target"}


def test_a_long_prompt_gets_its_first_token_from_the_prefill(engine, plain, tokenizer):
    """From FIRST_TOKEN_FROM_PREFILL prompt tokens on, the first token comes out of the
    prefill's own pass, before the drafter has seen the prompt; then rounds as usual. The
    same tokens as plain decoding; the first token is no round."""
    prompt = tokenizer.encode("a longer prompt, " * 12)
    assert len(prompt) >= specdec.engine.Run.FIRST_TOKEN_FROM_PREFILL
    draft = engine.drafter.backend
    draft.truncate(0)
    chunks = []
    for chunk in engine.stream(prompt, GREEDY, SpecConfig(k=3)):
        if not chunks:
            assert draft.cached_token_ids == [], "the drafter's prefill waits for the first token"
            assert chunk.token_ids and chunk.extra_kind == "target"
        chunks.append(chunk)
    tokens = [t for c in chunks for t in c.token_ids]
    assert tokens == plain.generate(prompt, GREEDY).token_ids
    assert len(chunks[0].token_ids) == 1 and len(chunks) > 2
    stats = chunks[-1].stats
    assert stats.rounds == len(chunks) - 1  # every chunk after the first is a round
    assert stats.target_forwards == stats.rounds + 1  # + the prefill, which made the first
    assert 1 + stats.accepted_tokens + stats.rounds >= stats.generated_tokens == len(tokens)
    assert stats.drafted_tokens > 0


def test_a_long_prompt_that_wants_one_token_never_prefills_the_drafter(engine, plain, tokenizer):
    prompt = tokenizer.encode("a longer prompt, " * 12)
    engine.drafter.backend.truncate(0)
    params = replace(GREEDY, max_tokens=1)
    out = engine.generate(prompt, params, SpecConfig(k=3))
    assert out.token_ids == plain.generate(prompt, params).token_ids
    assert out.stats.rounds == 0 and out.stats.target_forwards == 1
    assert engine.drafter.backend.cached_token_ids == []


def test_stream_holds_back_a_possible_stop_prefix(engine, plain, tokenizer):
    full = plain.generate(tokenizer.encode("hello"), GREEDY).text
    stop = full[20:22] + "#"  # starts like the text but never completes
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, stop=(stop,))
    chunks = list(engine.stream(tokenizer.encode("hello"), params, SpecConfig(k=2)))
    shown = ""
    for chunk in chunks[:-1]:
        shown += chunk.text
        assert not shown.endswith(stop[:2]), "a possible stop prefix was shown too early"
    assert shown + chunks[-1].text == full


def test_eos_ends_with_stop(engine, tokenizer, target_model):
    target = backend(target_model, tokenizer)
    reference = Engine(target).generate(tokenizer.encode("hi"), GREEDY)
    target.eos_token_ids = frozenset({reference.token_ids[5]})
    out = Engine(target, engine.drafter).generate(
        tokenizer.encode("hi"), SamplingParams(max_tokens=40, temperature=0.0), SpecConfig(k=4)
    )
    assert out.finish_reason == "stop" and out.token_ids[-1] == reference.token_ids[5]


@pytest.mark.parametrize("k", [0, 2, 5])
def test_a_stop_token_id_ends_the_output_as_eos_does_and_shows_no_text(engine, plain, tokenizer, k):
    """stop_token_ids (vLLM's): the output ends at the first one, which is kept in the
    tokens and left out of the text; drafts past it are dropped; ignore_eos does not ignore
    it. Speculation gives plain decoding's output."""
    free = plain.generate(tokenizer.encode("hello"), GREEDY)
    stop_id = free.token_ids[12]
    first = free.token_ids.index(stop_id)
    params = replace(GREEDY, stop_token_ids=(stop_id,))  # ignore_eos=True
    out = engine.generate(tokenizer.encode("hello"), params, SpecConfig(k=k))
    assert out.finish_reason == "stop" and out.token_ids == free.token_ids[: first + 1]
    assert out.text == tokenizer.decode(free.token_ids[:first]) == free.text[:first]
    streamed = list(engine.stream(tokenizer.encode("hello"), params, SpecConfig(k=k)))
    assert "".join(c.text for c in streamed) == out.text


@pytest.mark.parametrize("bad", [[-1], [True], ["3"], 5, "12"])
def test_bad_stop_token_ids_are_refused(bad):
    with pytest.raises(ValueError, match="stop_token_ids must be token ids"):
        SamplingParams(stop_token_ids=bad)


def test_stop_token_ids_outside_the_vocabulary_are_named(engine, tokenizer):
    with pytest.raises(ValueError, match=r"stop_token_ids names ids outside .*\[99\]"):
        engine.generate([3, 4], SamplingParams(stop_token_ids=(99,)))


SAMPLED = SamplingParams(max_tokens=30, temperature=0.9, top_k=10, seed=1234, ignore_eos=True)


def test_a_seeded_request_gives_plain_decodings_output_whatever_k_and_the_drafter(
    engine, plain, tokenizer, draft_model
):
    """The reproducibility contract: with a seed, sampling is coupled by default and the
    output is plain decoding's with that seed, for any k, k=auto and any drafter."""
    prompt = tokenizer.encode("seed")
    reference = plain.generate(prompt, SAMPLED).token_ids
    lookup_engine = Engine(plain.target, PromptLookupDrafter())
    accepted = 0
    for spec in (SpecConfig(k=1), SpecConfig(k=4), SpecConfig(k=8), SpecConfig(k="auto")):
        out = engine.generate(prompt, SAMPLED, spec)
        assert out.token_ids == reference, spec
        assert lookup_engine.generate(prompt, SAMPLED, spec).token_ids == reference, spec
        accepted += out.stats.accepted_tokens if spec.k != "auto" else 0
    assert accepted > 0, "drafts were accepted on the way (fixed k always drafts)"
    other = plain.generate(prompt, replace(SAMPLED, seed=4321)).token_ids
    assert other != reference


def test_adaptive_k_state_does_not_change_a_seeded_output(engine, tokenizer):
    """k=auto learns from every request (and from wall-clock costs); a seeded request still
    gives the same text before and after other traffic."""
    prompt = tokenizer.encode("again")
    first = engine.generate(prompt, SAMPLED, SpecConfig(k="auto"))
    for seed, text in enumerate(["other traffic", "more of it", "x" * 20]):
        engine.generate(tokenizer.encode(text), replace(SAMPLED, seed=seed), SpecConfig("auto"))
    engine.controller.draft_step_seconds = 10.0  # as if drafting had become very slow
    second = engine.generate(prompt, SAMPLED, SpecConfig(k="auto"))
    assert first.token_ids == second.token_ids


def test_rejection_verification_is_deterministic_for_a_fixed_k(engine, tokenizer):
    params = replace(SAMPLED, seed=99)
    spec = SpecConfig(k=4, verification="rejection")
    first = engine.generate(tokenizer.encode("seed"), params, spec)
    second = engine.generate(tokenizer.encode("seed"), params, spec)
    assert first.token_ids == second.token_ids


def test_a_tiny_temperature_is_near_greedy_not_a_crash(engine, plain, tokenizer):
    prompt = tokenizer.encode("tiny")
    greedy = plain.generate(prompt, GREEDY).token_ids
    for temperature in (1e-40, 1e-30, 1e-8):
        params = replace(GREEDY, temperature=temperature, seed=1)
        assert engine.generate(prompt, params, SpecConfig(k=4)).token_ids == greedy


def test_stats_add_up(engine, tokenizer):
    out = engine.generate(tokenizer.encode("count"), GREEDY, SpecConfig(k=4))
    stats = out.stats
    assert stats.generated_tokens == len(out.token_ids) == 40
    # Every round emits its accepted drafts plus one token, except where max_tokens cut it.
    assert stats.accepted_tokens + stats.rounds >= stats.generated_tokens
    assert stats.target_forwards == stats.rounds + 1  # + the prompt prefill
    assert 0 < stats.acceptance_rate <= 1
    assert stats.mean_accepted_length == pytest.approx(1 + stats.accepted_tokens / stats.rounds)
    assert stats.drafter_seconds > 0 and stats.target_seconds > 0 and stats.tokens_per_second > 0
    assert sum(stats.k_per_round.values()) == stats.rounds


def test_plain_decoding_is_the_k0_path(engine, plain, tokenizer):
    prompt = tokenizer.encode("plain")
    k0 = engine.generate(prompt, GREEDY, SpecConfig(k=0))
    assert k0.token_ids == plain.generate(prompt, GREEDY).token_ids
    assert k0.stats.drafted_tokens == 0 and k0.stats.mean_accepted_length == 1.0


class TestBadInput:
    def test_empty_prompt(self, engine):
        with pytest.raises(ValueError, match="prompt_ids is empty"):
            engine.generate([], GREEDY)

    def test_prompt_ids_out_of_vocabulary(self, engine):
        with pytest.raises(ValueError, match="outside the vocabulary"):
            engine.generate([1, 999], GREEDY)

    def test_prompt_longer_than_the_context(self, engine):
        with pytest.raises(ValueError, match="context"):
            engine.generate([1] * 300, GREEDY)

    @pytest.mark.parametrize(
        "kwargs, name",
        [
            ({"k": -1}, "k"),
            ({"k": 1.5}, "k"),
            ({"verification": "typical"}, "verification"),
        ],
    )
    def test_spec_config(self, kwargs, name):
        with pytest.raises(ValueError, match=name):
            SpecConfig(**kwargs)

    @pytest.mark.parametrize(
        "kwargs, name",
        [
            ({"temperature": -0.1}, "temperature"),
            ({"temperature": float("nan")}, "temperature"),
            ({"temperature": float("inf")}, "temperature"),
            ({"temperature": True}, "temperature"),
            ({"seed": 2**64}, "seed"),
            ({"seed": -(2**63) - 1}, "seed"),
            ({"top_p": 0.0}, "top_p"),
            ({"top_p": 1.5}, "top_p"),
            ({"max_tokens": 0}, "max_tokens"),
            ({"max_tokens": -3}, "max_tokens"),
            ({"top_k": -1}, "top_k"),
            ({"seed": "x"}, "seed"),
            ({"stop": [""]}, "stop"),
        ],
    )
    def test_sampling_params(self, kwargs, name):
        with pytest.raises(ValueError, match=name):
            SamplingParams(**kwargs)

    def test_mismatched_vocabularies(self, target_model):
        other = tiny_llama(seed=3, vocab=48)
        with pytest.raises(ValueError, match="vocabulary"):
            Engine(backend(target_model), ModelDrafter(backend(other)))

    def test_stop_strings_need_a_tokenizer(self, target_model):
        with pytest.raises(ValueError, match="tokenizer"):
            Engine(backend(target_model)).generate([1, 2], SamplingParams(stop=("x",)))


def test_eos_id_is_known_from_the_config(target_model):
    assert EOS_ID in backend(target_model).eos_token_ids


class _NeverDrafts:
    """A controller that has learned speculation does not pay."""

    max_k = 8

    def choose_k(self) -> int:
        return 0

    def keep_going(self, confidences) -> bool:
        return False

    def observe(self, *args, **kwargs) -> None:
        pass


def test_no_draft_prefill_when_the_controller_will_not_draft(target_model, draft_model, tokenizer):
    class CountingDrafter(ModelDrafter):
        prepared = 0

        def prepare(self, context):
            CountingDrafter.prepared += 1
            super().prepare(context)

    drafter = CountingDrafter(backend(draft_model))
    engine = Engine(backend(target_model, tokenizer), drafter)
    prompt, params = tokenizer.encode("the cat"), SamplingParams(max_tokens=8, temperature=0.0)
    expected = Engine(backend(target_model, tokenizer)).generate(prompt, params).token_ids
    engine.controller = _NeverDrafts()
    out = engine.generate(prompt, params, SpecConfig(k="auto"))
    assert CountingDrafter.prepared == 0 and out.stats.drafted_tokens == 0
    assert out.token_ids == expected
    engine.controller = None  # a fresh adaptive controller drafts at first: it prepares
    assert engine.generate(prompt, params, SpecConfig(k="auto")).token_ids == expected
    assert CountingDrafter.prepared == 1


def test_a_forward_that_fails_midway_leaves_the_engine_usable(target_model, monkeypatch):
    """An error inside the target's pass (after some layers grew their cache) reaches the
    caller; the cache is cut back, so the next request on the same engine is right."""
    engine = Engine(backend(target_model))
    expected = Engine(backend(target_model)).generate([1, 2, 3], GREEDY).token_ids
    engine.generate([1, 2, 3, 4], replace(GREEDY, max_tokens=5))
    last_mlp = target_model.model.layers[-1].mlp
    calls = {"n": 0}
    original = last_mlp.forward

    def fails_once(x):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("out of memory, say")
        return original(x)

    monkeypatch.setattr(last_mlp, "forward", fails_once)
    with pytest.raises(RuntimeError, match="out of memory"):
        engine.generate([1, 2, 3, 4, 5], GREEDY)
    monkeypatch.undo()
    assert engine.generate([1, 2, 3], GREEDY).token_ids == expected
