"""The int4 and int8 runtimes' layers in one kernel call (``backends/layer_stack.py``): the same
bits as transformers' forward over the same model, for many sequences, blocks and rollbacks, at
every code path and thread count."""

import pytest
import torch

from helpers import random_ids, tiny_llama
from specdec.backends.batched import BatchedModel, supports
from specdec.backends.hf import HFModel
from specdec.backends.layer_stack import LayerStack
from specdec.backends.quant import int4, kernels
from specdec.backends.quant.convert import make_int4_batch_invariant, make_int8_batch_invariant
from specdec.backends.transformers_forward import TransformersModel
from specdec.doctor import real_size_int8_model, real_size_model


def replay(model, vocab: int) -> None:
    """Three sequences on the stack, batched, against each alone on transformers' forward
    over the same model: ragged passes, last_only mixed, a rollback, a sequence grown past its
    buffers' first capacity; logits and kept features equal bit for bit."""
    stacked = BatchedModel(model)
    transformers = TransformersModel(model)
    runs = [[stacked.sequence() for _ in range(3)], [transformers.sequence() for _ in range(3)]]
    for run in runs:
        for sequence in run:
            sequence.keep_hidden_states()
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
        batched = stacked.forward_many([(runs[0][i], tokens, last) for i, tokens, last in work])
        for (i, tokens, last), logits in zip(work, batched, strict=True):
            alone = runs[1][i].forward(tokens, last_only=last)
            assert torch.equal(logits, alone), (step, i)
            assert torch.equal(runs[0][i].hidden_states(), runs[1][i].hidden_states()), (step, i)
        if step == 1:
            for run in runs:
                run[2].truncate(20)  # a rollback: the next pass overwrites the cut positions


@pytest.mark.parametrize("runtime", ["int4", "int8"])
def test_the_stack_is_transformers_forward_bit_for_bit(runtime):
    make = make_int4_batch_invariant if runtime == "int4" else make_int8_batch_invariant
    model = make(tiny_llama(seed=0))
    assert BatchedModel(model).stack.size == model.config.num_hidden_layers
    replay(model, vocab=20)


@pytest.mark.parametrize("path", ["avx2", "scalar"])
def test_the_stack_follows_a_pinned_path(path):
    """A path pinned on a loaded model's products (as ``--int4-path`` does) is the one the
    stack runs: the same bits as transformers' forward on that path."""
    model = make_int4_batch_invariant(tiny_llama(seed=1))
    if kernels.best_path() < kernels.PATH_BY_NAME[path]:
        pytest.skip(f"this CPU has no {path} path")
    for module in model.modules():
        if isinstance(module, int4.RowInt4Linear):
            module.path = kernels.PATH_BY_NAME[path]
    replay(model, vocab=20)


@pytest.mark.parametrize("runtime", ["int4", "int8"])
@pytest.mark.parametrize("threads", [1, 2, 3, 4, 8])
def test_the_stack_is_transformers_forward_at_real_layer_sizes(runtime, threads):
    """Hidden 1536, intermediate 8960 (the 1.5B's layers), 2 layers."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        if runtime == "int4":
            replay(make_int4_batch_invariant(real_size_model()), vocab=2048)
        else:
            replay(real_size_int8_model(), vocab=2048)
    finally:
        torch.set_num_threads(before)


def test_without_the_kernel_a_model_runs_transformers_forward(monkeypatch):
    """Where the kernel does not build the int8 runtime keeps torch's forms: no stack, so
    ``HFModel`` runs transformers' forward and the server's requests take turns."""
    monkeypatch.setattr(kernels, "kernel_or_none", lambda: None)  # no compiler here
    model = make_int8_batch_invariant(tiny_llama(seed=0))
    assert not supports(model)
    assert isinstance(HFModel(model).source, TransformersModel)
    assert LayerStack.of([]) is None


def test_a_failed_pass_leaves_the_caches_as_they_were():
    stacked = BatchedModel(make_int4_batch_invariant(tiny_llama(seed=0)))
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
