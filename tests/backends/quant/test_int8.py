"""The batch-invariant int8 runtime: a block scores every position exactly as one-token steps do."""

import pytest
import torch
from torch import nn

from helpers import backend, perturbed_copy, tiny_llama
from specdec import Engine, SamplingParams, SpecConfig
from specdec.backends.quant import fused, int8, kernels
from specdec.backends.quant import rows as row_ops
from specdec.backends.quant.convert import make_int8_batch_invariant
from specdec.backends.quant.int8 import RowInt8Linear
from specdec.doctor import real_size_model
from specdec.drafters import ModelDrafter


def test_row_int8_linear_approximates_the_float_layer():
    generator = torch.Generator().manual_seed(0)
    linear = nn.Linear(64, 48)
    x = torch.randn(7, 64, generator=generator)
    relative_error = (RowInt8Linear(linear)(x) - linear(x)).norm() / linear(x).norm()
    assert relative_error < 0.03


def test_a_row_does_not_depend_on_its_neighbours():
    linear = RowInt8Linear(nn.Linear(64, 40))
    generator = torch.Generator().manual_seed(1)
    block = torch.randn(6, 64, generator=generator)
    block[3] *= 50.0  # an outlier row would widen a shared activation range
    singles = torch.cat([linear(block[i : i + 1]) for i in range(6)])
    assert torch.equal(linear(block), singles)


def test_tall_weights_are_split_into_pieces(monkeypatch):
    monkeypatch.setattr(int8, "ROWS_PER_PIECE", 16)
    layer = nn.Linear(8, 40)
    split = RowInt8Linear(layer)
    assert len(split.pieces) == 3
    monkeypatch.setattr(int8, "ROWS_PER_PIECE", 1000)
    x = torch.randn(3, 8)
    assert torch.equal(split(x), RowInt8Linear(layer)(x))


def _unfused(model, monkeypatch):
    """``model`` on the int8 runtime without the fused projections."""

    with monkeypatch.context() as patch:
        patch.setattr(fused, "fuse_projections", lambda m: m)
        return make_int8_batch_invariant(model)


@pytest.mark.parametrize(
    "build",
    [lambda: tiny_llama(seed=3), real_size_model],
    ids=["tiny llama", "qwen2 at the 1.5B's layer sizes"],
)
def test_fused_projections_give_the_separate_layers_logits_bit_for_bit(build, monkeypatch):
    from specdec.backends.quant.fused import FusedAttention, FusedMLP

    # The row kernels take fused layers only: compared on the torch forms both can run.
    monkeypatch.setattr(kernels, "kernel_or_none", lambda: None)
    fused = make_int8_batch_invariant(build())
    kinds = {type(module) for module in fused.modules()}
    assert FusedAttention in kinds and FusedMLP in kinds
    separate = backend(_unfused(build(), monkeypatch))
    fused_backend = backend(fused)
    for model in (fused_backend, separate):
        model.forward([t % 17 + 1 for t in range(29)])
    for block in ([4, 9, 2, 11, 7], [5], [13, 3]):
        assert torch.equal(fused_backend.forward(block), separate.forward(block))


@pytest.fixture(scope="module")
def int8_pair():
    target = make_int8_batch_invariant(tiny_llama(seed=0))
    draft = make_int8_batch_invariant(perturbed_copy(tiny_llama(seed=0), noise=0.03, seed=1))
    return target, draft


def test_block_logits_equal_one_token_steps_bit_for_bit(int8_pair):
    model = backend(int8_pair[0])
    model.forward([1, 2, 3])
    block = model.forward([4, 5, 6, 7, 8])
    model.truncate(3)
    steps = torch.cat([model.forward([t]) for t in (4, 5, 6, 7, 8)])
    assert torch.equal(block, steps)


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_int8_greedy_speculation_equals_int8_plain(int8_pair, k):
    target, draft = int8_pair
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    expected = Engine(backend(target)).generate([5, 9, 2], params)
    out = Engine(backend(target), ModelDrafter(backend(draft))).generate(
        [5, 9, 2], params, SpecConfig(k=k)
    )
    assert out.token_ids == expected.token_ids
    assert out.stats.accepted_tokens > 0


# ---- batch invariance at real layer sizes and any thread count ------------------------

THREADS = [1, 2, 3, 4, 8]


@pytest.mark.parametrize("rows", [*range(2, 13), 21, 22, 40, 64, 97])
def test_token_by_token_ops_match_one_token_steps_at_every_thread_count(threads, rows):
    """The hazard: PyTorch splits a 9 x 8960 SiLU across 3+ threads and the edge of each
    thread's range rounds differently from the same element in a one-token step. Run in
    pieces under the grain size (3 tokens of SiLU at 8960, 21 of an RMSNorm at 1536, one
    token at an odd width), every token is computed as in the step's own call."""
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    generator = torch.Generator().manual_seed(rows)
    norm = Qwen2RMSNorm(1536)
    norm.weight.data = torch.randn(1536, generator=generator)
    cases = [
        (nn.SiLU(), torch.randn(1, rows, 8960, generator=generator) * 3.0),
        (norm, torch.randn(1, rows, 1536, generator=generator) * 3.0),
        (nn.SiLU(), torch.randn(1, rows, 1000, generator=generator) * 3.0),  # not 64-wide
    ]
    for inner, x in cases:
        wrapped = row_ops.TokenByToken(inner)
        for count in THREADS:
            torch.set_num_threads(count)
            steps = torch.cat([inner(x[:, i : i + 1]) for i in range(rows)], dim=1)
            assert torch.equal(wrapped(x), steps), f"{inner}, {rows} rows, {count} threads"


@pytest.fixture(scope="module", params=["row kernels", "torch forms"])
def real_size_model(request):
    """The int8 runtime as it runs where the int4 kernel builds (its row operations) and
    where it does not (the torch forms above)."""
    from specdec.backends.quant import convert
    from specdec.doctor import real_size_int8_model

    with pytest.MonkeyPatch.context() as patch:
        if request.param == "torch forms":
            patch.setattr(kernels, "kernel_or_none", lambda: None)
        model = real_size_int8_model()
    assert convert.uses_row_kernels(model) == (request.param == "row kernels")
    return model


@pytest.mark.parametrize("count", THREADS)
def test_blocks_equal_steps_at_real_layer_sizes(real_size_model, threads, count):
    """Hidden 1536, intermediate 8960 (the 1.5B's layers), blocks of 2..12 tokens."""
    from specdec.doctor import check_block_equals_steps

    result = check_block_equals_steps(real_size_model, count)
    assert result.ok, f"{result.mismatched} of {result.blocks} blocks differ at {count} threads"


def test_doctor_reports_the_check(capsys):
    from specdec.cli import main

    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "CPU:" in out and "8 threads: ok" in out
    assert "int8 runtime: norms, activation, rotary and attention on the int4 kernel's" in out
