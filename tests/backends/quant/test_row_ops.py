"""The int4 kernel's row operations (``kernels/row_ops.cpp``, which the int4 runtime and, where
the kernel builds, the int8 runtime run) and their in-place KV caches:
close to torch's arithmetic, every row the same bits in a block as alone at any thread count,
and caches that grow and roll back without changing a number."""

import pytest
import torch

from helpers import tiny_llama
from specdec.backends.batched import BatchedModel
from specdec.backends.hf import HFModel
from specdec.backends.kv_buffer import MIN_CAPACITY, KVBuffer
from specdec.backends.quant import int4, kernels
from specdec.backends.quant.convert import make_int4_batch_invariant, uses_row_kernels

THREADS = [1, 2, 3, 4, 8]


@pytest.fixture(scope="module")
def ops():
    return kernels.kernel()


def randn(*shape, seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def attention_reference(query, keys, values, scaling):
    """float64 causal attention: row i of ``query`` over the first positions - rows + i + 1."""
    rows, heads, _ = query.shape
    group = heads // keys.shape[0]
    out = []
    for i in range(rows):
        end = keys.shape[1] - rows + i + 1
        k = keys[:, :end].double().repeat_interleave(group, 0)
        v = values[:, :end].double().repeat_interleave(group, 0)
        scores = torch.einsum("hd,htd->ht", query[i].double(), k) * scaling
        out.append(torch.einsum("ht,htd->hd", scores.softmax(-1), v))
    return torch.stack(out).float()


def test_rms_norm_is_the_norm(ops):
    x, weight = randn(5, 1536, seed=1, scale=3.0), randn(1536, seed=2)
    expected = weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    torch.testing.assert_close(ops.rms_norm(x, weight, 1e-6), expected, rtol=1e-5, atol=1e-5)


def test_silu_mul_is_the_gated_product(ops):
    gate_up = randn(3, 2 * 8960, seed=3, scale=6.0)
    gate, up = gate_up.double().split(8960, dim=-1)
    expected = (torch.nn.functional.silu(gate) * up).float()
    torch.testing.assert_close(ops.silu_mul(gate_up), expected, rtol=1e-5, atol=1e-5)


def test_silu_mul_keeps_a_nan_and_stays_finite_far_out(ops):
    gate_up = torch.zeros(1, 32)
    gate_up[0, :4] = torch.tensor([float("nan"), -200.0, 200.0, 0.5])
    gate_up[0, 16:] = 1.0
    out = ops.silu_mul(gate_up)[0]
    assert out[0].isnan()
    assert out[1] == pytest.approx(0.0, abs=1e-30) and out[2] == 200.0
    assert out[3].item() == pytest.approx(0.5 / (1 + torch.exp(torch.tensor(-0.5)).item()))


def test_rope_matches_torchs_products_bit_for_bit(ops):
    """x * cos + rotate_half(x) * sin: products and sum rounded once each, as torch does."""
    x, cos, sin = randn(4, 12, 128, seed=4), randn(4, 128, seed=5), randn(4, 128, seed=6)
    expected = x * cos[:, None] + rotate_half(x) * sin[:, None]
    rotated = x.clone()
    ops.rope_(rotated, cos, sin)
    assert torch.equal(rotated, expected)


@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(12, 2, 128), (14, 2, 64), (4, 4, 24)])
def test_attention_is_causal_softmax_attention(ops, heads, kv_heads, dim):
    positions, rows = 37, 5
    query = randn(rows, heads, dim, seed=7)
    keys, values = randn(kv_heads, positions, dim, seed=8), randn(kv_heads, positions, dim, seed=9)
    out = ops.causal_attention(query, keys, values, dim**-0.5)
    expected = attention_reference(query, keys, values, dim**-0.5)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [2, 3, 5, 9, 17])
def test_each_row_op_gives_a_row_the_same_bits_in_a_block(ops, threads, rows):
    """Real sizes (the 1.5B's hidden 1536, intermediate 8960, 12 heads over 2 kv heads of
    128): a block's row i equals that row alone (attention: over the prefix it sees)."""
    x, weight = randn(rows, 1536, seed=rows), randn(1536, seed=10)
    gate_up = randn(rows, 2 * 8960, seed=rows + 1, scale=4.0)
    query = randn(rows, 12, 128, seed=rows + 2)
    keys, values = randn(2, 300, 128, seed=11), randn(2, 300, 128, seed=12)
    for count in THREADS:
        torch.set_num_threads(count)
        norms, products = ops.rms_norm(x, weight, 1e-6), ops.silu_mul(gate_up)
        attended = ops.causal_attention(query, keys, values, 0.088)
        for i in range(rows):
            assert torch.equal(norms[i], ops.rms_norm(x[i : i + 1], weight, 1e-6)[0]), count
            assert torch.equal(products[i], ops.silu_mul(gate_up[i : i + 1])[0]), count
            end = 300 - rows + i + 1
            alone = ops.causal_attention(
                query[i : i + 1], keys[:, :end].contiguous(), values[:, :end].contiguous(), 0.088
            )
            assert torch.equal(attended[i], alone[0]), f"row {i}, {count} threads"


@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(12, 2, 128), (14, 2, 64)])
def test_rows_over_a_long_cache_read_together_give_each_row_its_own_bits(ops, heads, kv_heads, dim):
    """Causal rows read a kv head's cache together, in blocks of up to 16 rows and its values
    in tiles of 256 positions (the 1.5B's and the 0.5B's head shapes, a context of 1,100
    positions, neither a multiple of a tile or a block): each row equals itself alone, and
    the path of a chain-shaped draft tree (its keys gathered, as rows were read one by one
    before), bit for bit, at 1-8 threads."""
    positions = 1100
    keys, values = (
        randn(kv_heads, positions, dim, seed=21),
        randn(kv_heads, positions, dim, seed=22),
    )
    for rows in (1, 8, 33):
        query = randn(rows, heads, dim, seed=23 + rows, scale=2.0)
        chain = list(range(-1, rows - 1))  # each row under the one before: the causal rows
        for count in THREADS:
            torch.set_num_threads(count)
            attended = ops.causal_attention(query, keys, values, dim**-0.5)
            assert torch.equal(
                attended, ops.causal_attention(query, keys, values, dim**-0.5, chain)
            )
            for i in sorted({0, rows // 2, rows - 1}):
                end = positions - rows + i + 1
                alone = ops.causal_attention(
                    query[i : i + 1], keys[:, :end], values[:, :end], dim**-0.5
                )
                assert torch.equal(attended[i], alone[0]), f"row {i} of {rows}, {count} threads"
    expected = attention_reference(query, keys, values, dim**-0.5)
    torch.testing.assert_close(attended, expected, rtol=1e-5, atol=1e-5)


def test_attention_reads_views_of_a_larger_buffer_as_their_copies(ops):
    buffer_k, buffer_v = randn(2, 512, 128, seed=13), randn(2, 512, 128, seed=14)
    query = randn(3, 12, 128, seed=15)
    keys, values = buffer_k[:, :100], buffer_v[:, :100]
    assert not keys.is_contiguous()
    assert torch.equal(
        ops.causal_attention(query, keys, values, 0.1),
        ops.causal_attention(query, keys.contiguous(), values.contiguous(), 0.1),
    )


def test_the_int4_model_runs_its_rows_in_the_kernel():
    model = make_int4_batch_invariant(tiny_llama(seed=0))
    norms = [m for name, m in model.named_modules() if name.endswith(("layernorm", ".norm"))]
    assert len(norms) == 2 * model.config.num_hidden_layers + 1
    assert all(type(norm).__name__ == "RowRMSNorm" for norm in norms)
    assert uses_row_kernels(model)
    mlps = [module for module in model.modules() if type(module).__name__ == "FusedMLP"]
    assert mlps and all(mlp.row_kernels for mlp in mlps)


@pytest.mark.parametrize("runtime", ["int8", "int4"])
def test_a_batch_through_transformers_forward_gives_each_sequence_as_alone(runtime):
    """Calling the model as transformers does, on a batch of equal-length sequences (the
    statistical tests compute exact marginals so): every sequence's logits, bit for bit,
    are those it gets alone."""
    from specdec.backends.quant.convert import make_int8_batch_invariant

    make = make_int8_batch_invariant if runtime == "int8" else make_int4_batch_invariant
    model = make(tiny_llama(seed=0))
    assert uses_row_kernels(model)
    batch = torch.tensor([[5, 9, 2, 7, 7, 1], [3, 3, 8, 1, 30, 2], [12, 4, 4, 9, 0, 6]])
    with torch.inference_mode():
        together = model(input_ids=batch).logits
        alone = torch.cat([model(input_ids=row[None]).logits for row in batch])
    assert torch.equal(together, alone)


def test_the_int8_model_runs_its_rows_in_the_kernel_where_it_builds(monkeypatch):
    from specdec.backends.quant.convert import make_int8_batch_invariant

    assert uses_row_kernels(make_int8_batch_invariant(tiny_llama(seed=0)))
    monkeypatch.setattr(kernels, "kernel_or_none", lambda: None)  # no compiler: the torch forms
    model = make_int8_batch_invariant(tiny_llama(seed=0))
    assert not uses_row_kernels(model)
    assert not isinstance(HFModel(model).source, BatchedModel)


def test_hfmodel_runs_the_layer_stack_with_transformers_numbers():
    """On the row kernels ``HFModel`` is a sequence on the layer stack: the logits of
    transformers' own forward, bit for bit, in one pass and in pieces."""
    model = make_int4_batch_invariant(tiny_llama(seed=0))
    tokens = [5, 9, 2, 7, 7, 1, 30, 12, 4, 4]
    backend = HFModel(model)
    assert isinstance(backend.source, BatchedModel)
    with torch.inference_mode():
        expected = model(input_ids=torch.tensor([tokens])).logits[0].float()
    assert torch.equal(backend.forward(tokens), expected)
    backend.truncate(4)
    pieces = [backend.forward(tokens[4:7]), *(backend.forward([t]) for t in tokens[7:])]
    assert torch.equal(torch.cat(pieces), expected[4:])
    assert list(backend.cached_token_ids) == tokens


# ---- KV buffers --------------------------------------------------------------------------


def test_a_buffer_grows_past_its_capacity_keeping_what_it_holds():
    buffer, keys, values = KVBuffer(), randn(1, 2, 600, 8, seed=16), randn(1, 2, 600, 8, seed=17)
    for start in range(0, 600, 150):
        piece = slice(start, start + 150)
        held_k, held_v = buffer.update(keys[:, :, piece], values[:, :, piece])
        assert torch.equal(held_k, keys[:, :, : start + 150])
        assert torch.equal(held_v, values[:, :, : start + 150])
    buffer.crop(250)
    assert buffer.length == 250 and torch.equal(buffer.keys, keys[:, :, :250])
    buffer.update(values[:, :, :5], keys[:, :, :5])  # rolled back, then written over
    assert torch.equal(buffer.keys[:, :, 250:], values[:, :, :5])
    assert torch.equal(buffer.keys[:, :, :250], keys[:, :, :250])


def test_a_copied_prefix_does_not_follow_its_donor():
    donor, copy = KVBuffer(), KVBuffer()
    keys = randn(1, 2, 40, 8, seed=18)
    donor.update(keys, keys)
    copy.copy_prefix(donor, 30)
    donor.crop(10)
    donor.update(torch.zeros(1, 2, 30, 8), torch.zeros(1, 2, 30, 8))
    assert copy.length == 30 and torch.equal(copy.keys, keys[:, :, :30])
    assert copy._keys is not None and copy._keys.shape[-2] >= MIN_CAPACITY


def test_forwards_and_rollbacks_across_growth_equal_one_fresh_pass():
    """An int4 model's cache written in pieces, cut back and rewritten past its first
    capacity gives the logits of one fresh pass over the same tokens, bit for bit."""
    model = make_int4_batch_invariant(tiny_llama(seed=0))
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (MIN_CAPACITY + 80,), generator=torch.Generator().manual_seed(3))
    tokens = ids.tolist()
    fresh = HFModel(model).forward(tokens)
    backend = HFModel(model)
    backend.forward(tokens[:200])
    backend.forward([(t + 1) % vocab for t in tokens[200:280]])  # a rejected stretch
    backend.truncate(200)
    pieces = [backend.forward(tokens[200:250])]
    pieces += [backend.forward([t]) for t in tokens[250:270]]
    pieces.append(backend.forward(tokens[270:]))
    assert torch.equal(torch.cat(pieces), fresh[200:])


# ---- the CPU-specific clones against baseline code -----------------------------------------


@pytest.mark.parametrize("build", ["_baseline", "_avx2"])
def test_the_clones_this_cpu_runs_give_the_narrower_builds_bits(ops, threads, build):
    """The vectorized loops are compiled as AVX-512, AVX2 and baseline clones, one chosen per
    CPU: this CPU's clone and a build of baseline code only (or of clones up to AVX2, which
    ``SPECDEC_INT4_PATH=avx2`` loads) give the same bits at the 1.5B's sizes (norm, gated
    product, rotary mix, attention, and the int4 product's activation quantizer), so another
    kind of CPU computes the same numbers."""
    baseline = kernels.built(build)
    torch.set_num_threads(2)
    x, weight = randn(5, 1536, seed=20, scale=3.0), randn(1536, seed=21)
    assert torch.equal(ops.rms_norm(x, weight, 1e-6), baseline.rms_norm(x, weight, 1e-6))
    gate_up = randn(5, 2 * 8960 + 6, seed=22, scale=6.0)  # a width that leaves a tail
    assert torch.equal(ops.silu_mul(gate_up), baseline.silu_mul(gate_up))
    rows, cos, sin = randn(5, 12, 128, seed=23), randn(5, 128, seed=24), randn(5, 128, seed=25)
    mine, theirs = rows.clone(), rows.clone()
    ops.rope_(mine, cos, sin)
    baseline.rope_(theirs, cos, sin)
    assert torch.equal(mine, theirs)
    # the 1.5B's heads, the 0.5B's, and a head size that leaves every loop a tail
    for heads, kv_heads, dim in [(12, 2, 128), (14, 2, 64), (4, 4, 36)]:
        query = randn(5, heads, dim, seed=23 + dim, scale=3.0)
        keys, values = randn(kv_heads, 203, dim, seed=26), randn(kv_heads, 203, dim, seed=27)
        for parents in ([], [-1, 0, 0, 1, 3]):  # causal rows, a draft tree's
            assert torch.equal(
                ops.causal_attention(query, keys, values, dim**-0.5, parents),
                baseline.causal_attention(query, keys, values, dim**-0.5, parents),
            ), (dim, parents)
    layer = int4.RowInt4Linear(torch.nn.Linear(8960, 64))
    activations = randn(3, 8960, seed=28, scale=2.0)
    for path in range(kernels.best_path() + 1):
        assert torch.equal(
            ops.int4_linear(activations, layer.packed, layer.bias, path),
            baseline.int4_linear(activations, layer.packed, layer.bias, path),
        )
