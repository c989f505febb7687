"""One int8 model, many sequences: a ragged pass gives each its logits alone, bit for bit."""

import pytest
import torch

from helpers import backend, perturbed_copy, random_ids, tiny_llama
from specdec import Engine, SamplingParams, SpecConfig
from specdec.backends.base import sync_cache
from specdec.backends.batched import BatchedModel, supports
from specdec.backends.quant.convert import make_int8_batch_invariant
from specdec.doctor import real_size_int8_model
from specdec.drafters import FallbackDrafter, ModelDrafter, PromptLookupDrafter
from specdec.drafters.base import Drafter, Proposal
from specdec.engine import step_together


@pytest.fixture(scope="module")
def int8_model():
    return make_int8_batch_invariant(tiny_llama(seed=0))


@pytest.fixture(scope="module", params=["int8", "int4"])
def quantized_model(request, int8_model):
    """Each batch-invariant runtime: int8 and int4."""
    if request.param == "int8":
        return int8_model
    from specdec.backends.quant.convert import make_int4_batch_invariant

    return make_int4_batch_invariant(tiny_llama(seed=0))


def test_only_the_int8_and_int4_runtimes_on_the_layer_stack_are_supported(int8_model):
    assert supports(int8_model)
    assert not supports(tiny_llama(seed=0))
    with pytest.raises(ValueError, match="int8 or int4 runtime"):
        BatchedModel(tiny_llama(seed=0))


def test_each_sequence_gets_its_logits_and_features_alone_bit_for_bit(quantized_model):
    """Three sequences of different lengths, blocks of different sizes, last_only mixed,
    a rollback in between: every row equals HFModel's over the same model."""
    batched = BatchedModel(quantized_model)
    sequences = [batched.sequence() for _ in range(3)]
    alone = [backend(quantized_model) for _ in range(3)]
    for model in [*sequences, *alone]:
        model.keep_hidden_states()
    prompts = [random_ids(1, 9), random_ids(2, 3), random_ids(3, 17)]
    passes = [
        [(0, prompts[0], False), (1, prompts[1], True), (2, prompts[2], False)],
        [(2, random_ids(4, 5), False), (0, random_ids(5, 1), False)],
        [(1, random_ids(6, 4), False), (2, random_ids(7, 2), True), (0, random_ids(8, 6), False)],
    ]
    for step, work in enumerate(passes):
        got = batched.forward_many([(sequences[i], tokens, last) for i, tokens, last in work])
        for (i, tokens, last), logits in zip(work, got, strict=True):
            assert torch.equal(logits, alone[i].forward(tokens, last_only=last)), (step, i)
        if step == 1:
            for model in (sequences[2], alone[2]):
                model.truncate(10)  # a rejected block rolled back
    for sequence, model in zip(sequences, alone, strict=True):
        assert list(sequence.cached_token_ids) == list(model.cached_token_ids)
        assert torch.equal(sequence.hidden_states(), model.hidden_states())


def test_a_shared_prefix_is_copied_not_computed_and_gives_the_same_bits(int8_model):
    """B's prompt begins like A's: syncing B copies A's keys and values for the common part
    and computes only the rest; every later row equals a sequence that computed it all,
    features included; A changing afterwards leaves B alone."""
    from specdec.backends.base import sync_cache

    batched = BatchedModel(int8_model)
    shared = random_ids(30, 12)
    a, b = batched.sequence(), batched.sequence()
    fresh = backend(int8_model)
    for model in (a, b, fresh):
        model.keep_hidden_states()
    sync_cache(a, shared + random_ids(31, 5))
    assert batched.reused_tokens == 0  # nothing to copy from yet
    computed = []
    forward = b.forward
    b.forward = lambda tokens, last_only=False: (
        computed.append(list(tokens)) or forward(tokens, last_only)
    )
    prompt_b = shared + random_ids(32, 4)
    assert sync_cache(b, prompt_b)
    assert computed == [prompt_b[12:]] and batched.reused_tokens == 12
    fresh.forward(prompt_b, last_only=True)
    a.truncate(3)  # the donor moves on; B holds its own copy
    a.forward(random_ids(33, 6))
    block = random_ids(34, 5)
    assert torch.equal(b.forward(block), fresh.forward(block))
    assert list(b.cached_token_ids) == list(fresh.cached_token_ids)
    assert torch.equal(b.hidden_states(), fresh.hidden_states())
    # a donor that kept no features cannot serve one that needs them
    other = BatchedModel(int8_model)
    c, d = other.sequence(), other.sequence()
    sync_cache(c, shared)
    d.keep_hidden_states()
    assert d.reuse_prefix(shared) == 0 and other.sequence().reuse_prefix(shared) == 12


def test_copied_tokens_count_only_those_a_sequence_did_not_hold(int8_model):
    """``reused_tokens`` (the server's ``specdec_prefix_reused_tokens_total``): the tokens a
    copy saved computing, not those the sequence held already."""
    batched = BatchedModel(int8_model)
    prompt = random_ids(60, 10)
    donor, mine = batched.sequence(), batched.sequence()
    donor.forward(prompt, last_only=True)
    mine.forward(prompt[:4], last_only=True)
    assert mine.reuse_prefix(prompt) == 10 and batched.reused_tokens == 6
    assert mine.reuse_prefix(prompt) == 10 and batched.reused_tokens == 6  # held: no copy


def test_finished_sequences_stay_donors_within_the_memory_kept(int8_model):
    """A sequence no longer used stays a donor however many begin after it (a busy server's
    requests, alive meanwhile) while the caches kept fit in ``keep_bytes``, the oldest
    dropped first; one that held nothing takes no place, and one that the next to end
    covers (a conversation's turn before) gives its place at once."""
    batched = BatchedModel(int8_model)
    first = batched.sequence()
    first.forward(random_ids(40, 10), last_only=True)
    size = first.held.nbytes  # every buffer here has its first capacity: the same size
    assert size > 0
    batched.keep_bytes = 3 * size
    del first  # its request ended
    running = [batched.sequence() for _ in range(8)]
    for seed, sequence in enumerate(running):  # requests that began since, still going
        sequence.forward([0] + random_ids(50 + seed, 5), last_only=True)  # 0: not in the 10
    for _ in range(5):
        batched.sequence()  # made and dropped holding nothing
    later = batched.sequence()
    assert later.reuse_prefix(random_ids(40, 10) + [3]) == 10
    later.forward([3, 4], last_only=True)  # the next turn goes on from it
    del later  # it ended holding all the first held, and more: the first gives its place
    assert len(batched._kept) == 1
    assert batched.sequence().reuse_prefix(random_ids(40, 10) + [3, 4]) == 12
    del running[:3]  # three more end: four caches do not fit in three's room
    assert len(batched._kept) == 3
    assert batched.sequence().reuse_prefix(random_ids(40, 10)) == 0
    nothing_kept = BatchedModel(int8_model, keep_bytes=0)
    gone = nothing_kept.sequence()
    gone.forward(random_ids(40, 10), last_only=True)
    del gone
    assert nothing_kept.sequence().reuse_prefix(random_ids(40, 10)) == 0


@pytest.fixture(scope="module", params=["int8", "int4"])
def real_size_quantized_model(request):
    if request.param == "int8":
        return real_size_int8_model()
    from specdec.backends.quant.convert import make_int4_batch_invariant
    from specdec.doctor import real_size_model

    return make_int4_batch_invariant(real_size_model())


@pytest.mark.parametrize("threads", [1, 2, 3, 4, 8])
def test_a_batch_equals_each_sequence_alone_at_real_layer_sizes(real_size_quantized_model, threads):
    """Hidden 1536, intermediate 8960; 4 sequences, blocks of 1, 3, 5 and 9 tokens."""
    model = real_size_quantized_model
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        batched = BatchedModel(model)
        sequences = [batched.sequence() for _ in range(4)]
        alone = [backend(model) for _ in range(4)]
        for i, (sequence, single) in enumerate(zip(sequences, alone, strict=True)):
            prompt = random_ids(10 + i, 12 + 7 * i, vocab=2048)
            sequence.forward(prompt, last_only=True)
            single.forward(prompt, last_only=True)
        blocks = [random_ids(20 + i, size, vocab=2048) for i, size in enumerate((1, 3, 5, 9))]
        got = batched.forward_many(
            [(sequence, block, False) for sequence, block in zip(sequences, blocks, strict=True)]
        )
        for i, block in enumerate(blocks):
            assert torch.equal(got[i], alone[i].forward(block)), i
    finally:
        torch.set_num_threads(before)


def test_a_failed_pass_leaves_every_sequence_as_it_was(int8_model, monkeypatch):
    """The last layer's down product fails mid-pass (every layer before it has written its
    keys and values): both sequences hold what they held, and go on as if it never ran."""
    down = int8_model.model.layers[-1].mlp.down_proj
    working, failing = down.forward, []

    def product(x):
        if failing:
            raise RuntimeError("out of memory, say")
        return working(x)

    monkeypatch.setattr(down, "forward", product)  # the stack calls the int8 product back
    batched = BatchedModel(int8_model)
    first, second = batched.sequence(), batched.sequence()
    reference = backend(int8_model)
    first.forward(random_ids(1, 6))
    second.forward(random_ids(2, 4))
    reference.forward(random_ids(1, 6))
    failing.append(True)
    with pytest.raises(RuntimeError, match="out of memory"):
        batched.forward_many([(first, random_ids(3, 3), False), (second, random_ids(4, 2), False)])
    failing.clear()
    assert len(first.cached_token_ids) == 6 and len(second.cached_token_ids) == 4
    assert all(layer.keys.shape[-2] == 6 for layer in first.layers)
    assert torch.equal(first.forward(random_ids(3, 3)), reference.forward(random_ids(3, 3)))


def _split_and_whole(model, rows):
    """Two views of one model: passes of at most ``rows`` rows, and passes of any size."""
    split, whole = BatchedModel(model), BatchedModel(model)
    split.PASS_ROWS, whole.PASS_ROWS = rows, 1_000_000
    passes = []
    inner = split._forward

    def counted(work, parents):
        passes.append(sum(len(tokens) for _, tokens, _ in work))
        return inner(work, parents)

    split._forward = counted  # type: ignore[method-assign]
    return split, whole, passes


def test_a_pass_longer_than_pass_rows_is_split_and_gives_the_same_bits(quantized_model):
    """Prompts longer than PASS_ROWS (a long prefill) go in consecutive passes of at most
    that many rows, a sequence's tokens split between them: every logit, cached token and
    kept feature equals one pass's, last_only mixed, a part asking for no logits."""
    split, whole, passes = _split_and_whole(quantized_model, rows=5)
    ours = [split.sequence() for _ in range(3)]
    theirs = [whole.sequence() for _ in range(3)]
    for sequence in [*ours, *theirs]:
        sequence.keep_hidden_states()
    steps = [
        [(0, random_ids(1, 17), True), (1, random_ids(2, 3), False), (2, random_ids(3, 12), False)],
        [(2, random_ids(4, 1), False), (0, random_ids(5, 6), False), (1, random_ids(6, 9), True)],
    ]
    for work in steps:
        got = split.forward_many([(ours[i], tokens, last) for i, tokens, last in work])
        want = whole.forward_many([(theirs[i], tokens, last) for i, tokens, last in work])
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b)
    assert max(passes) <= 5 and len(passes) == 7 + 4  # 32 rows, then 16
    for a, b in zip(ours, theirs, strict=True):
        assert list(a.cached_token_ids) == list(b.cached_token_ids)
        assert torch.equal(a.hidden_states(), b.hidden_states())


def test_a_split_pass_that_fails_leaves_every_sequence_as_it_was(int8_model, monkeypatch):
    """Its third part fails: every sequence holds what it held before the call."""
    split, _, passes = _split_and_whole(int8_model, rows=4)
    first, second = split.sequence(), split.sequence()
    first.forward(random_ids(1, 3))
    counted = split._forward

    def failing(work, parents):
        if len(passes) == 2:
            raise RuntimeError("out of memory, say")
        return counted(work, parents)

    monkeypatch.setattr(split, "_forward", failing)
    with pytest.raises(RuntimeError, match="out of memory"):
        split.forward_many([(first, random_ids(2, 6), False), (second, random_ids(3, 7), True)])
    assert len(first.cached_token_ids) == 3 and not second.cached_token_ids
    assert all(layer.keys.shape[-2] == 3 for layer in first.layers)


@pytest.mark.parametrize("threads", [1, 2, 3, 4, 8])
def test_a_split_prefill_equals_one_pass_at_real_layer_sizes(real_size_quantized_model, threads):
    """Hidden 1536, intermediate 8960: a 40-token prompt in passes of 16 rows, then a block
    of 9, equal bit for bit to one pass each."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        split, whole, passes = _split_and_whole(real_size_quantized_model, rows=16)
        ours, theirs = split.sequence(), whole.sequence()
        prompt = random_ids(30, 40, vocab=2048)
        assert torch.equal(ours.forward(prompt, last_only=True), theirs.forward(prompt, True))
        block = random_ids(31, 9, vocab=2048)
        assert torch.equal(ours.forward(block), theirs.forward(block))
        assert passes == [16, 16, 8, 9]
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 2, 3, 4, 8])
def test_a_prefill_in_parts_equals_one_pass_at_real_layer_sizes(real_size_quantized_model, threads):
    """Hidden 1536, intermediate 8960: a 40-token prompt fed 7 tokens a call (``sync_cache``
    with ``most``: a server's prefill in parts between other requests' steps), then a block
    of 9, equal bit for bit to one pass each."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model = BatchedModel(real_size_quantized_model)
        ours, theirs = model.sequence(), model.sequence()
        prompt = random_ids(32, 40, vocab=2048)
        fed = []
        while fed[-1:] != [0]:
            fed.append(sync_cache(ours, prompt, most=7))
        assert fed == [7, 7, 7, 7, 7, 5, 0] and ours.cached_token_ids == prompt
        theirs.forward(prompt, last_only=True)
        block = random_ids(33, 9, vocab=2048)
        assert torch.equal(ours.forward(block), theirs.forward(block))
    finally:
        torch.set_num_threads(before)


# ---- the engine over a batch ------------------------------------------------------------


@pytest.fixture(scope="module")
def int8_draft():
    return make_int8_batch_invariant(perturbed_copy(tiny_llama(seed=0), noise=0.03, seed=1))


class CountingBatchedModel(BatchedModel):
    def __init__(self, model):
        super().__init__(model)
        self.sizes: list[int] = []

    def forward_many(self, work):
        self.sizes.append(len(work))
        return super().forward_many(work)


def run_together(int8_model, draft, requests, max_rows=None, lookup_in_front=False, runs=None):
    """Decode ``requests`` [(prompt, params, spec)] in batched steps; their outputs.
    ``draft``: a BatchedModel (drafts of all requests in one pass per step) or a model;
    ``lookup_in_front``: each request drafts with ``lookup+model``; ``runs``: a list that
    gets the requests' runs."""
    batched = BatchedModel(int8_model)
    runs = [] if runs is None else runs
    for prompt, params, spec in requests:
        sequence = draft.sequence() if isinstance(draft, BatchedModel) else backend(draft)
        drafter: Drafter = ModelDrafter(sequence)
        if lookup_in_front:
            drafter = FallbackDrafter([PromptLookupDrafter(), drafter])
        engine = Engine(batched.sequence(), drafter)
        run = engine.begin(prompt, params, spec)
        run.start()
        runs.append(run)
    chunks: list[list] = [[] for _ in runs]
    active = list(range(len(runs)))
    while active:
        results = step_together([runs[i] for i in active], batched.forward_many, max_rows)
        for i, chunk in zip(list(active), results, strict=True):
            assert not isinstance(chunk, Exception), chunk
            chunks[i].append(chunk)
            if chunk.finish_reason is not None:
                active.remove(i)
    return [[t for chunk in run_chunks for t in chunk.token_ids] for run_chunks in chunks]


@pytest.mark.parametrize("max_rows", [None, 6, 2])
@pytest.mark.parametrize("draft_batched", [False, True], ids=["drafts alone", "drafts batched"])
def test_batched_requests_decode_what_each_decodes_alone(
    int8_model, int8_draft, max_rows, draft_batched
):
    """Greedy with k 1, 4, auto and a seeded sampled request: each request's tokens are
    those of the same request on its own engine, whatever the batch and its row budget,
    with the drafts of all requests run one by one or as one pass per draft step."""
    requests = [
        (
            random_ids(1, 5),
            SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True),
            SpecConfig(k=1),
        ),
        (
            random_ids(2, 9),
            SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True),
            SpecConfig(k=4),
        ),
        (
            random_ids(3, 2),
            SamplingParams(max_tokens=25, temperature=0.0, ignore_eos=True),
            SpecConfig(k="auto"),
        ),
        (
            random_ids(4, 7),
            SamplingParams(max_tokens=20, temperature=0.9, seed=5, ignore_eos=True),
            SpecConfig(k=3),
        ),
    ]
    draft = CountingBatchedModel(int8_draft) if draft_batched else int8_draft
    together = run_together(int8_model, draft, requests, max_rows)
    if draft_batched and (max_rows is None or max_rows // len(requests) > 1):  # any drafts
        assert max(draft.sizes) > 1  # some draft passes served several requests
    for (prompt, params, spec), tokens in zip(requests, together, strict=True):
        engine = Engine(backend(int8_model), ModelDrafter(backend(int8_draft)))
        assert tokens == engine.generate(prompt, params, spec).token_ids


def test_batched_chains_at_k_auto_decode_what_plain_decoding_does(int8_model, int8_draft):
    """lookup+model (the server's default without heads), each member its own k, in batched
    steps with batched drafts: greedy and seeded sampled requests give plain decoding's
    tokens, and both members draft."""
    repetitive = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    requests = [
        (prompt, SamplingParams(max_tokens=30, ignore_eos=True, **extra), SpecConfig(k="auto"))
        for prompt in (repetitive, random_ids(2, 9), repetitive[2:])
        for extra in ({"temperature": 0.0}, {"temperature": 0.9, "seed": 3})
    ]
    draft, runs = CountingBatchedModel(int8_draft), []
    together = run_together(int8_model, draft, requests, lookup_in_front=True, runs=runs)
    for (prompt, params, _), tokens in zip(requests, together, strict=True):
        assert tokens == Engine(backend(int8_model)).generate(prompt, params).token_ids
    assert max(draft.sizes) > 1
    drafted_by = {name for run in runs for name in run.stats.by_drafter}
    assert {"lookup", "model"} <= drafted_by


def test_each_run_is_charged_its_share_of_a_batched_step(int8_model, int8_draft):
    """What runs in one batched step are charged (the pass by rows scored, the lockstep
    drafting by tokens drafted) adds up to the step, not to N times it: a k controller fed
    the whole batch's time would think drafting N times dearer than it is."""
    import time

    batched, drafts = BatchedModel(int8_model), BatchedModel(int8_draft)
    runs = []
    for seed in range(6):
        engine = Engine(batched.sequence(), ModelDrafter(drafts.sequence()))
        params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
        run = engine.begin(random_ids(seed, 4 + seed), params, SpecConfig(k=3))
        run.start()
        runs.append(run)
    before = sum(run.stats.target_seconds + run.stats.drafter_seconds for run in runs)
    started = time.perf_counter()
    for _ in range(3):
        step_together(runs, batched.forward_many)
    wall = time.perf_counter() - started
    charged = sum(run.stats.target_seconds + run.stats.drafter_seconds for run in runs) - before
    assert 0 < charged <= wall
    assert all(run.stats.drafter_seconds > 0 for run in runs)


def test_a_step_the_batch_policy_keeps_from_drafting_drafts_nothing(int8_model, int8_draft):
    """The policy says no: no run drafts, the output is unchanged, and the runs' own k
    controllers learn nothing from those rounds; the policy learns the step's rate."""
    from specdec.controller import AdaptiveK, BatchDrafting

    class Never(BatchDrafting):
        def drafting(self, n: int) -> bool:
            return False

    batched, drafts = BatchedModel(int8_model), BatchedModel(int8_draft)
    controller, policy = AdaptiveK(), Never()
    runs, alone = [], []
    for seed in range(3):
        prompt, params = random_ids(seed, 6), SamplingParams(max_tokens=10, temperature=0.0)
        engine = Engine(batched.sequence(), ModelDrafter(drafts.sequence()), controller)
        runs.append(engine.begin(prompt, params, SpecConfig(k="auto")))
        runs[-1].start(prepare_drafter=False)
        reference = Engine(backend(int8_model), ModelDrafter(backend(int8_draft)))
        alone.append(reference.generate(prompt, params, SpecConfig(k=4)).token_ids)
    tokens: list[list[int]] = [[] for _ in runs]
    active = list(range(len(runs)))
    while active:
        chunks = step_together([runs[i] for i in active], batched.forward_many, None, policy)
        for i, chunk in zip(list(active), chunks, strict=True):
            tokens[i] += chunk.token_ids
            if chunk.finish_reason is not None:
                active.remove(i)
    assert tokens == alone
    assert all(run.stats.drafted_tokens == 0 for run in runs)
    assert controller.draft_step_seconds is None and not controller.pass_seconds
    assert policy.rates[(3, False)] > 0


def test_a_batch_teaches_its_costs_apart_from_a_request_alone(int8_model, int8_draft):
    """Rounds scored in a batched pass of two requests go to the shared controller's batched
    costs; a round alone (a batch of one) to its costs alone."""
    from specdec.controller import AdaptiveK

    batched, drafts = BatchedModel(int8_model), BatchedModel(int8_draft)
    controller = AdaptiveK()
    runs = []
    for seed in range(2):
        engine = Engine(batched.sequence(), ModelDrafter(drafts.sequence()), controller)
        params = SamplingParams(max_tokens=12, temperature=0.0)
        runs.append(engine.begin(random_ids(seed, 6), params, SpecConfig(k="auto")))
        runs[-1].start()
    step_together(runs, batched.forward_many)
    assert controller.in_batch and controller.batched.pass_seconds
    assert controller.batched.draft_step_seconds is not None
    assert not controller.solo.pass_seconds and controller.solo.draft_step_seconds is None
    step_together(runs[:1], batched.forward_many)
    assert not controller.in_batch and controller.solo.pass_seconds


def test_an_empty_step_is_no_pass():
    def forward_many(work):
        raise AssertionError("no pass for no runs")

    assert step_together([], forward_many, max_rows=8) == []


def test_the_row_budget_caps_each_requests_drafts(int8_model):
    batched = BatchedModel(int8_model)
    runs = []
    for _ in range(3):
        engine = Engine(batched.sequence(), PromptLookupDrafter())
        run = engine.begin([5, 6, 7, 5, 6, 7, 5, 6], SamplingParams(max_tokens=40), SpecConfig(k=8))
        run.start()
        runs.append(run)
    seen = []

    def forward_many(work):
        seen.append([len(tokens) for _, tokens, _ in work])
        return batched.forward_many(work)

    step_together(runs, forward_many, max_rows=9)
    assert seen and all(rows <= 3 for rows in seen[0])  # 9 rows / 3 requests: 2 drafts each


def test_a_failing_drafter_fails_its_own_request_only(int8_model):
    class Broken(PromptLookupDrafter):
        def propose(self, context, k, sampler=None, keep_going=None) -> Proposal:
            raise RuntimeError("drafter broke")

    batched = BatchedModel(int8_model)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    runs = []
    for drafter in (Broken(), PromptLookupDrafter()):
        run = Engine(batched.sequence(), drafter).begin(random_ids(1, 6), params, SpecConfig(k=2))
        run.start()
        runs.append(run)
    broken, fine = step_together(runs, batched.forward_many)
    assert isinstance(broken, RuntimeError) and not isinstance(fine, Exception)
    assert fine.token_ids


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_heads_draft_for_batched_requests_as_for_one(int8_model, kind):
    """Medusa and EAGLE over ``ModelSequence`` targets (their features kept per sequence):
    greedy requests decoded together give each request's solo tokens."""
    from helpers import tiny_heads

    heads, _ = tiny_heads(int8_model, kind, steps=60)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    prompts = [random_ids(1, 5), random_ids(2, 8), random_ids(3, 3)]
    batched = BatchedModel(int8_model)
    runs = []
    for prompt in prompts:
        sequence = batched.sequence()
        run = Engine(sequence, heads.drafter(sequence)).begin(prompt, params, SpecConfig(k=3))
        run.start()
        runs.append(run)
    tokens: list[list[int]] = [[] for _ in runs]
    active = list(range(len(runs)))
    drafted = 0
    while active:
        for i, chunk in zip(
            list(active),
            step_together([runs[i] for i in active], batched.forward_many),
            strict=True,
        ):
            assert not isinstance(chunk, Exception), chunk
            tokens[i] += chunk.token_ids
            if chunk.finish_reason is not None:
                drafted += chunk.stats.drafted_tokens
                active.remove(i)
    assert drafted > 0
    for prompt, got in zip(prompts, tokens, strict=True):
        alone = backend(int8_model)
        expected = Engine(alone, heads.drafter(alone)).generate(prompt, params, SpecConfig(k=3))
        assert got == expected.token_ids
