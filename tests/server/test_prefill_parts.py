"""A joining prompt prefilled in parts between the other requests' steps (the scheduler's
``prefill_rows``): the others keep getting a round every step, no step prefills more than
a part into each model, prompts that fit join at once, and every output is what the request
gives alone."""

import pytest

from helpers import backend, char_tokenizer, perturbed_copy, random_ids, tiny_llama
from specdec import Engine, SamplingParams, SpecConfig
from specdec.backends.batched import BatchedModel
from specdec.backends.hf import model_of
from specdec.backends.quant.convert import make_int4_batch_invariant, make_int8_batch_invariant
from specdec.drafters import ModelDrafter
from specdec.engine import Run
from specdec.server.scheduler import Job, Scheduler, _Active

LONG = 150  # prompt tokens of the request that joins (the tiny model holds 256 positions)


@pytest.fixture(scope="module", params=["int8", "int4"])
def pair(request):
    make = {"int8": make_int8_batch_invariant, "int4": make_int4_batch_invariant}[request.param]
    target = tiny_llama(seed=0)
    draft = perturbed_copy(target, noise=0.03, seed=1)
    return make(target), make(draft), char_tokenizer()


class Recorded(Job):
    """A job whose chunks go to a list (the scheduler's steps are driven by the test)."""

    def put(self, item):
        self.items.append(item)


def params(max_tokens, seed, temperature) -> SamplingParams:
    """Every request runs to ``max_tokens`` (the steps the test counts need it running)."""
    return SamplingParams(
        max_tokens=max_tokens, temperature=temperature, seed=seed, ignore_eos=True
    )


def job(prompt_ids, max_tokens, seed=None, temperature=0.0):
    recorded = Recorded(
        prompt_ids=prompt_ids,
        params=params(max_tokens, seed, temperature),
        spec=SpecConfig(k=3),
        drafter="model",
        loop=None,
    )
    recorded.items = []
    return recorded


def alone(pair, prompt_ids, max_tokens, seed=None, temperature=0.0) -> list[int]:
    target, draft, tokenizer = pair
    engine = Engine(backend(target, tokenizer), ModelDrafter(backend(draft)))
    return engine.generate(
        prompt_ids, params(max_tokens, seed, temperature), SpecConfig(k=3)
    ).token_ids


def tokens_of(recorded) -> list[int]:
    return [t for item in recorded.items if item is not None for t in item.token_ids]


@pytest.fixture
def parts(monkeypatch) -> list[tuple[Run, int]]:
    """Every part of a prefill (``Run.prefill_part``, and ``Run.first_token`` where a long
    prompt's last part gives its first token): the run and the prompt tokens it fed."""
    calls = []
    part, first_token = Run.prefill_part, Run.first_token

    def recorded(run, rows, prepare_drafter=True):
        fed = part(run, rows, prepare_drafter)
        calls.append((run, fed))
        return fed

    def recorded_first(run):
        held = len(run.target.cached_token_ids)
        chunk = first_token(run)
        calls.append((run, len(run.target.cached_token_ids) - held))
        return chunk

    monkeypatch.setattr(Run, "prefill_part", recorded)
    monkeypatch.setattr(Run, "first_token", recorded_first)
    return calls


def fed_in(parts, step) -> dict[Run, int]:
    """Prompt tokens fed per run by the parts ``step()`` ran."""
    before = len(parts)
    step()
    fed: dict[Run, int] = {}
    for run, tokens in parts[before:]:
        fed[run] = fed.get(run, 0) + tokens
    return fed


@pytest.mark.parametrize("rows", [8, 37])
def test_a_long_prompt_joins_in_parts_while_the_running_request_keeps_stepping(pair, rows, parts):
    target, draft, tokenizer = pair
    scheduler = Scheduler(target, tokenizer, draft, prefill_rows=rows)
    assert isinstance(scheduler.batched, BatchedModel)
    running = _Active(job(random_ids(1, 12, vocab=30), 200, seed=5, temperature=0.9))
    while not tokens_of(running.job):  # alone, in parts too, then its first round
        scheduler._step_batched([running])
    joining = _Active(job(random_ids(2, LONG, vocab=30), 20))
    entries = [running, joining]
    steps_to_join = 0
    while not joining.started:
        before_chunks = len(running.job.items)
        fed = fed_in(parts, lambda: scheduler._step_batched(entries))
        # a part into the target, or its last part and then one into the draft
        assert list(fed) == [joining.run] and 0 < fed[joining.run] <= 2 * rows
        assert len(running.job.items) == before_chunks + 1  # the running one got its round
        steps_to_join += 1
    # the target's prompt (all but the last token), then the draft's if the batch drafts
    assert steps_to_join >= (LONG - 1) // rows
    while joining.job.items[-1] is not None or running.job.items[-1] is not None:
        scheduler._step_batched([e for e in entries if e.job.items[-1:] != [None]])
    assert tokens_of(running.job) == alone(pair, running.job.prompt_ids, 200, 5, 0.9)
    assert tokens_of(joining.job) == alone(pair, joining.job.prompt_ids, 20)


def test_joining_prompts_advance_together_and_those_that_fit_join_at_once(pair, parts):
    """Each joining request gets a part a step, so prompts that come together join
    together (and decode in the same batched steps); one that fits its first part joins in
    the step it came."""
    target, draft, tokenizer = pair
    scheduler = Scheduler(target, tokenizer, draft, prefill_rows=16)
    first, second = (_Active(job(random_ids(seed, 40, vocab=30), 8)) for seed in (3, 4))
    short = _Active(job(random_ids(5, 12, vocab=30), 8))
    fed = fed_in(parts, lambda: scheduler._step_batched([first, second, short]))
    assert fed == {first.run: 16, second.run: 16, short.run: 11 + 12}  # target, then draft
    assert short.started and tokens_of(short.job) and not (first.started or second.started)
    steps = 1
    while not first.started:
        fed = fed_in(parts, lambda: scheduler._step_batched([first, second, short]))
        assert set(fed) == {first.run, second.run} and fed[first.run] == fed[second.run]
        assert all(tokens <= 2 * 16 for tokens in fed.values())
        steps += 1
    # 39 target tokens: 16, 16, 7; the draft's 39: 15 in that third step, 16, 8
    assert second.started and steps == 5
    for entry in (first, second, short):
        while entry.job.items[-1:] != [None]:
            scheduler._step_batched([entry])
        assert tokens_of(entry.job) == alone(pair, entry.job.prompt_ids, 8)


def test_a_long_prompt_sends_its_first_token_from_its_prefill_before_it_joins(pair, parts):
    """A prompt of ``Run.FIRST_TOKEN_FROM_PREFILL`` tokens or more: the part that ends the
    target's prefill scores its last token, and that token goes to the client in that step,
    while the draft's prefill still has parts to go; a shorter one gets its first token from
    its first round, as alone."""
    target, draft, tokenizer = pair
    scheduler = Scheduler(target, tokenizer, draft, prefill_rows=16)
    long = _Active(job(random_ids(11, 40, vocab=30), 8))
    assert Run.FIRST_TOKEN_FROM_PREFILL <= 40
    fed = [fed_in(parts, lambda: scheduler._step_batched([long]))[long.run] for _ in range(2)]
    assert fed == [16, 16] and not long.job.items
    fed = fed_in(parts, lambda: scheduler._step_batched([long]))
    # the target's last 8 tokens with the first token, then the draft's first 16
    assert fed[long.run] == 8 + 16 and not long.started
    assert len(long.job.items) == 1 and len(tokens_of(long.job)) == 1
    while long.job.items[-1:] != [None]:
        scheduler._step_batched([long])
    assert tokens_of(long.job) == alone(pair, long.job.prompt_ids, 8)
    # one token asked for: the request ends at its prefill, without joining a step
    once = _Active(job(random_ids(12, 40, vocab=30), 1))
    while not once.job.items:
        scheduler._step_batched([once])
    assert len(tokens_of(once.job)) == 1 and once.job.items[-1] is None and not once.started
    assert tokens_of(once.job) == alone(pair, once.job.prompt_ids, 1)
    short = _Active(job(random_ids(13, 12, vocab=30), 8))
    scheduler._step_batched([short])  # fits one part: prefilled, joined, its first round
    assert short.started and len(short.job.items) == 1 and len(tokens_of(short.job)) > 1


def test_a_request_cancelled_between_its_parts_is_dropped_and_the_others_go_on(pair, parts):
    target, draft, tokenizer = pair
    scheduler = Scheduler(target, tokenizer, draft, prefill_rows=8)
    running = _Active(job(random_ids(8, 6, vocab=30), 40))
    joining = _Active(job(random_ids(9, LONG, vocab=30), 8))
    scheduler._step_batched([running, joining])
    assert running.started and not joining.started
    joining.job.cancelled.set()  # its client went away while its prompt was being read
    fed = fed_in(parts, lambda: scheduler._step_batched([running, joining]))
    assert joining.run not in fed and not joining.job.items  # dropped: no part, no chunk
    while running.job.items[-1:] != [None]:
        scheduler._step_batched([running])
    assert tokens_of(running.job) == alone(pair, running.job.prompt_ids, 40)


def test_without_a_budget_a_joining_prompt_is_prefilled_whole_in_its_first_step(pair):
    target, draft, tokenizer = pair
    scheduler = Scheduler(target, tokenizer, draft, prefill_rows=None)
    entry = _Active(job(random_ids(6, LONG, vocab=30), 4))
    scheduler._step_batched([entry])
    assert entry.started and tokens_of(entry.job)
    assert len(entry.run.target.cached_token_ids) >= LONG - 1


@pytest.mark.parametrize("tail", [ModelDrafter.PROMPT_TAIL, 40])
def test_a_prefill_in_parts_leaves_the_caches_bit_for_bit_as_one_prefill(pair, tail):
    """The next pass's logits after parts of every size == after one prefill; with a draft
    that reads the prompt's first tokens and a tail shorter than the prompt too (its parts
    feed shares of that, never more rows than the part's)."""
    target, draft, tokenizer = pair
    prompt = random_ids(7, LONG, vocab=30)
    params, spec = SamplingParams(max_tokens=4), SpecConfig(k=3)
    sink = ModelDrafter.PROMPT_SINK
    read = prompt if sink + tail >= LONG else prompt[:sink] + prompt[-tail:]

    def prefilled(rows):
        target_seq = model_of(target, tokenizer).sequence()
        draft_seq = model_of(draft).sequence()
        drafter = ModelDrafter(draft_seq, prompt_tail=tail)
        run = Engine(target_seq, drafter).begin(prompt, params, spec)
        if rows is None:
            run.start()
        else:
            parts = 0
            while not run.prefilled:
                before = len(target_seq.cached_token_ids), len(draft_seq.cached_token_ids)
                fed = run.prefill_part(rows)
                grew = len(target_seq.cached_token_ids) - before[0]
                grew_draft = len(draft_seq.cached_token_ids) - before[1]
                assert grew <= rows and grew_draft <= rows and grew + grew_draft <= fed
                parts += 1
            assert parts >= 2 * (LONG - 1) // rows - 1
            run.start()  # feeds nothing more
        assert run.target.cached_token_ids == prompt[:-1]
        assert draft_seq.cached_token_ids == read[:-1]
        return target_seq.forward(prompt[-1:]), draft_seq.forward(prompt[-1:])

    whole = prefilled(None)
    for rows in (1, 7, 64):
        parts = prefilled(rows)
        for a, b in zip(whole, parts, strict=True):
            assert a.dtype == b.dtype and bool((a == b).all()), rows


def test_a_drafter_left_part_way_through_its_prefill_catches_up_apart(pair):
    """A batch that stops drafting while a joining request's draft is part-way through the
    prompt: the rest is left for later, and until the draft has had the whole prompt it
    counts as never having followed the text, so its first drafting round catches up in a
    pass of its own (``speculation.CATCH_UP_APART``), not inside a batched draft step."""
    target, draft, tokenizer = pair
    prompt = random_ids(10, LONG, vocab=30)
    target_seq, draft_seq = model_of(target, tokenizer).sequence(), model_of(draft).sequence()
    run = Engine(target_seq, ModelDrafter(draft_seq)).begin(
        prompt, SamplingParams(max_tokens=8), SpecConfig(k=3)
    )
    while not draft_seq.cached_token_ids:
        run.prefill_part(16)
    assert 0 < len(draft_seq.cached_token_ids) < LONG - 1 and not run.prefilled
    run.start(prepare_drafter=False)  # the batch is not drafting now
    assert run.speculation.fed == {}  # not followed: the whole text is ahead of it
    proposal, _ = run.propose()
    assert run.speculation.sat_out == 0 and run.stats.drafter_seconds > 0  # caught up apart
    assert proposal.token_ids and draft_seq.cached_token_ids[: LONG - 1] == prompt[:-1]


def test_a_window_another_cache_holds_is_read_on_not_read_again_from_a_later_cut(pair):
    """A conversation's next turn: the draft of a request whose prompt goes on from one a
    cache holds (a window of its first tokens and tail) reads on from that cache's cut,
    copying it, where a later cut would read the whole tail again; alone, it reads its own
    tail. Greedy output is plain decoding's either way."""
    target, draft, tokenizer = pair
    tail, sink = 40, ModelDrafter.PROMPT_SINK
    turn1 = random_ids(11, 100, vocab=30)
    turn2 = turn1 + random_ids(12, 25, vocab=30)
    draft_model = model_of(draft)
    ModelDrafter(draft_model.sequence(), prompt_tail=tail).prepare(turn1)
    copied = draft_model.reused_tokens
    nxt = ModelDrafter(draft_model.sequence(), prompt_tail=tail)
    nxt.prepare(turn2)
    window = turn2[:sink] + turn2[len(turn1) - tail :]
    assert nxt.backend.cached_token_ids == window[:-1]
    assert draft_model.reused_tokens - copied == sink + tail - 1  # all turn 1's window held
    other = model_of(draft)  # another model of the same weights: no cache to copy from
    alone = ModelDrafter(other.sequence(), prompt_tail=tail)
    alone.prepare(turn2)
    assert alone.backend.cached_token_ids == (turn2[:sink] + turn2[-tail:])[:-1]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    plain = Engine(backend(target, tokenizer)).generate(turn2, params)
    out = Engine(backend(target, tokenizer), nxt).generate(turn2, params, SpecConfig(k=3))
    assert out.token_ids == plain.token_ids and out.stats.accepted_tokens > 0


def test_a_request_that_drafts_nothing_makes_no_draft_sequence(pair):
    """k = 0: no drafter, nor a draft sequence made for nothing."""
    target, draft, tokenizer = pair
    scheduler = Scheduler(target, tokenizer, draft, prefill_rows=None)
    made = []
    scheduler.draft_model.sequence = lambda: made.append(1)  # type: ignore[method-assign]
    plain = job(random_ids(13, 20, vocab=30), 3)
    plain.spec = SpecConfig(k=0)
    scheduler._step_batched([_Active(plain)])
    assert not made and tokens_of(plain)


def test_a_prompt_that_begins_like_one_ahead_waits_and_copies_that_beginning(pair, parts):
    """Prompts that come together and share a beginning longer than a part (a question's
    answers): the later one skips its prefill while the one ahead computes that beginning,
    then copies it and computes only its own tail; a prompt with nothing in common goes on
    beside them. Every output is the request's alone."""
    target, draft, tokenizer = pair
    scheduler = Scheduler(target, tokenizer, draft, prefill_rows=16)
    common = random_ids(14, 40, vocab=30)
    ahead, behind = (_Active(job(common + random_ids(s, 10, vocab=30), 6)) for s in (15, 16))
    other = _Active(job(random_ids(17, 50, vocab=30), 6))
    entries = [ahead, behind, other]
    for _ in range(2):  # ahead holds 16, then 32 of the 40 tokens in common
        fed = fed_in(parts, lambda: scheduler._step_batched(entries))
        assert fed == {ahead.run: 16, other.run: 16} and behind.run is None
    copied = scheduler.batched.reused_tokens
    fed_in(parts, lambda: scheduler._step_batched(entries))  # ahead's third part: 48 held
    assert scheduler.batched.reused_tokens - copied == 40
    # then its own 10 in the same step, the last one scored for its first token
    assert behind.run.target.cached_token_ids[:50] == behind.job.prompt_ids
    assert len(tokens_of(behind.job)) == 1
    while any(entry.job.items[-1:] != [None] for entry in entries):
        scheduler._step_batched([e for e in entries if e.job.items[-1:] != [None]])
    for entry in entries:
        assert tokens_of(entry.job) == alone(pair, entry.job.prompt_ids, 6)


def test_without_prefix_sharing_no_prompt_waits(pair, parts):
    target, draft, tokenizer = pair
    scheduler = Scheduler(target, tokenizer, draft, prefill_rows=16, prefix_sharing=False)
    common = random_ids(14, 40, vocab=30)
    ahead, behind = (_Active(job(common + random_ids(s, 10, vocab=30), 6)) for s in (15, 16))
    fed = fed_in(parts, lambda: scheduler._step_batched([ahead, behind]))
    assert fed == {ahead.run: 16, behind.run: 16}


@pytest.mark.parametrize("top", [1, 2])
def test_a_scored_prompt_waits_for_scores_like_its_own_and_takes_them(pair, top):
    """Scoring answers (prompt log-probabilities, one token): the later waits for one ahead
    that keeps scores with as many most likely tokens, takes them with the cache, and gives
    the scores the prompt gets alone, bit for bit; for one that keeps other scores it does
    not wait (it could not take them)."""
    target, draft, tokenizer = pair
    scheduler = Scheduler(target, tokenizer, draft, prefill_rows=16)
    common = random_ids(18, 40, vocab=30)
    ahead, behind = (_Active(job(common + random_ids(s, 10, vocab=30), 1)) for s in (19, 20))
    ahead.job.params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1)
    behind.job.params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=top)
    scheduler._step_batched([ahead, behind])
    assert (behind.run is None) == (top == 1)
    while any(entry.job.items[-1:] != [None] for entry in (ahead, behind)):
        scheduler._step_batched([e for e in (ahead, behind) if e.job.items[-1:] != [None]])
    for entry in (ahead, behind):
        engine = Engine(backend(target, tokenizer))
        out = engine.generate(entry.job.prompt_ids, entry.job.params)
        first = entry.job.items[0]
        assert first.prompt_logprobs == out.prompt_logprobs and first.token_ids == out.token_ids
