"""The int4 runtime's layers in one kernel call (``backends/layer_stack.py``): the same bits as
the Python layer loop, for many sequences, blocks and rollbacks, at every code path."""

import pytest
import torch

from helpers import random_ids, tiny_llama
from specdec.backends.batched import BatchedModel
from specdec.backends.layer_stack import LayerStack
from specdec.backends.quant import int4, kernels
from specdec.backends.quant.convert import make_int4_batch_invariant, make_int8_batch_invariant
from specdec.doctor import real_size_model


def pair(model) -> tuple[BatchedModel, BatchedModel]:
    """The model with its layer stack, and the same model through the Python loop."""
    stacked, looped = BatchedModel(model), BatchedModel(model)
    assert stacked.stack is not None
    looped.stack = None
    return stacked, looped


def replay(model, vocab: int) -> None:
    """Three sequences through both: ragged passes, last_only mixed, a rollback, a sequence
    grown past its buffers' first capacity; logits and kept features equal bit for bit."""
    stacked, looped = pair(model)
    runs = []
    for batched in (stacked, looped):
        sequences = [batched.sequence() for _ in range(3)]
        for sequence in sequences:
            sequence.keep_hidden_states()
        runs.append(sequences)
    passes = [
        [
            (0, random_ids(1, 9, vocab), False),
            (1, random_ids(2, 3, vocab), True),
            (2, random_ids(3, 17, vocab), False),
        ],
        [(2, random_ids(4, 5, vocab), False), (0, random_ids(5, 1, vocab), False)],
        [
            (1, random_ids(6, 4, vocab), False),
            (2, random_ids(7, 2, vocab), True),
            (0, random_ids(8, 6, vocab), False),
        ],
        [(1, random_ids(9, 270, vocab), False)],  # past the buffers' 256 positions: they grow
        [(0, random_ids(10, 1, vocab), False), (1, random_ids(11, 3, vocab), False)],
    ]
    for step, work in enumerate(passes):
        got = [
            batched.forward_many([(run[i], tokens, last) for i, tokens, last in work])
            for batched, run in zip((stacked, looped), runs, strict=True)
        ]
        for (i, _, _), a, b in zip(work, *got, strict=True):
            assert torch.equal(a, b), (step, i)
            assert torch.equal(runs[0][i].hidden_states(), runs[1][i].hidden_states()), (step, i)
        if step == 1:
            for run in runs:
                run[2].truncate(20)  # a rollback: the next pass overwrites the cut positions


def test_the_stack_is_the_python_loop_bit_for_bit():
    replay(make_int4_batch_invariant(tiny_llama(seed=0)), vocab=20)


@pytest.mark.parametrize("path", ["avx2", "scalar"])
def test_the_stack_follows_a_pinned_path(path):
    """A path pinned on a loaded model's products (as ``--int4-path`` does) is the one the
    stack runs: the same bits as the loop on that path."""
    model = make_int4_batch_invariant(tiny_llama(seed=1))
    if kernels.best_path() < kernels.PATH_BY_NAME[path]:
        pytest.skip(f"this CPU has no {path} path")
    for module in model.modules():
        if isinstance(module, int4.RowInt4Linear):
            module.path = kernels.PATH_BY_NAME[path]
    replay(model, vocab=20)


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_the_stack_is_the_loop_at_real_layer_sizes(threads):
    """Hidden 1536, intermediate 8960 (the 1.5B's layers), 2 layers."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        replay(make_int4_batch_invariant(real_size_model()), vocab=2048)
    finally:
        torch.set_num_threads(before)


def test_the_int8_runtime_keeps_the_python_loop():
    assert BatchedModel(make_int8_batch_invariant(tiny_llama(seed=0))).stack is None
    assert LayerStack.of([]) is None


def test_a_failed_pass_leaves_the_caches_as_they_were():
    stacked, _ = pair(make_int4_batch_invariant(tiny_llama(seed=0)))
    sequence = stacked.sequence()
    sequence.forward(random_ids(1, 7, 20))
    logits = sequence.forward(random_ids(2, 1, 20))
    sequence.truncate(7)
    with pytest.raises(RuntimeError, match="hidden"):
        stacked.stack.forward(  # float64 rows: the kernel refuses the pass
            torch.zeros(1, 3, dtype=torch.float64),
            (torch.zeros(1, 1, 8), torch.zeros(1, 1, 8)),
            [(sequence.layers, 0, 1)],
        )
    assert all(layer.length == 7 for layer in sequence.layers)
    assert torch.equal(sequence.forward(random_ids(2, 1, 20)), logits)
