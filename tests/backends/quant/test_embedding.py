"""A token embedding kept in GGUF blocks looks up the rows of the dequantized table."""

import numpy as np
import pytest
import torch
from torch import nn

from specdec.backends.quant.embedding import BlockEmbedding
from specdec.backends.quant.int4 import RowInt4Linear
from specdec.backends.quant.int8 import RowInt8Linear

gguf = pytest.importorskip("gguf")


def _embedding_and_table(kind: str, seed: int) -> tuple[BlockEmbedding, torch.Tensor]:
    """A 40 x 64 random table in GGUF ``kind`` blocks, and the whole table dequantized."""
    table = np.random.default_rng(seed).standard_normal((40, 64)).astype(np.float32)
    ggml_type = gguf.GGMLQuantizationType[kind]
    blocks = gguf.quants.quantize(table, ggml_type)
    whole = torch.from_numpy(gguf.dequantize(blocks, ggml_type))
    return BlockEmbedding(torch.from_numpy(blocks.view(np.uint8)), ggml_type, 64), whole


def _dequantized_lookups(embedding: BlockEmbedding, monkeypatch) -> list[list[int]]:
    """The tokens of every dequantizing call ``embedding`` makes from now on, in order."""
    dequantized: list[list[int]] = []
    real_rows = embedding._rows
    monkeypatch.setattr(
        embedding, "_rows", lambda tokens: dequantized.append(tokens) or real_rows(tokens)
    )
    return dequantized


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "F32"])
def test_rows_looked_up_are_the_tables_rows_bit_for_bit(kind):
    embedding, whole = _embedding_and_table(kind, seed=0)
    ids = torch.tensor([[3, 39, 0, 3], [7, 7, 21, 1]])
    assert torch.equal(embedding(ids), whole[ids])
    assert torch.equal(embedding.weight, whole)
    assert torch.equal(embedding(ids), nn.Embedding.from_pretrained(whole)(ids))


@pytest.mark.parametrize("quantized", [RowInt4Linear, RowInt8Linear])
def test_an_output_layer_quantized_from_pieces_is_the_whole(quantized):
    linear = nn.Linear(64, 16 * 7, bias=False)
    pieces = linear.weight.detach().split(32)  # 32, 32, 32, 16 rows
    whole, built = quantized(linear), quantized.from_row_pieces(pieces, None)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
    assert torch.equal(built(x), whole(x))
    if quantized is RowInt8Linear:
        pairs = zip(built.int8_state(), whole.int8_state(), strict=True)
        assert all(torch.equal(a, b) for a, b in pairs)
    else:
        assert torch.equal(built.packed, whole.packed)


def test_rows_kept_between_lookups_stay_the_tables_rows(monkeypatch):
    """A step's few tokens come from rows kept since an earlier lookup (dequantized once,
    the least recently used dropped past the limit): the same bits, and a kept row is never
    the tensor handed out (a caller writing into its rows cannot change the table)."""
    from specdec.backends.quant import embedding as module

    monkeypatch.setattr(module, "CACHED_ROWS", 5)
    embedding, whole = _embedding_and_table("Q5_0", seed=1)
    dequantized = _dequantized_lookups(embedding, monkeypatch)
    for ids in ([[3]], [[3, 9]], [[9, 3, 3]], [[1], [2]], [[30, 31, 32, 33]], [[3]]):
        looked_up = embedding(torch.tensor(ids))
        assert torch.equal(looked_up, whole[torch.tensor(ids)]), ids
        looked_up.fill_(0.0)  # the caller's copy only
    assert dequantized == [[3], [9], [1, 2], [30, 31, 32, 33], [3]]  # 3 dropped, then again
    assert torch.equal(embedding(torch.tensor([[31, 32]])), whole[torch.tensor([[31, 32]])])
    assert len(embedding._kept) <= 5
    assert embedding(torch.zeros(1, 0, dtype=torch.long)).shape == (1, 0, 64)  # no tokens
    prompt = torch.arange(20).reshape(1, 20)  # more than a step's tokens: not kept
    assert torch.equal(embedding(prompt), whole[prompt]) and 19 not in embedding._kept


def test_a_lookup_that_fills_the_kept_rows_keeps_its_own_tokens(monkeypatch):
    """A lookup of a kept token together with new ones, when the new ones fill the kept rows:
    the oldest row dropped may be the kept token's own, and the lookup still returns it (it
    raised KeyError: a verify pass of `heads eval`, and of any long server session, once
    more than CACHED_ROWS distinct tokens had been seen). A row looked up moves to the
    newest end, so the rows in use are the last dropped."""
    from specdec.backends.quant import embedding as module

    monkeypatch.setattr(module, "CACHED_ROWS", 2)
    embedding, whole = _embedding_and_table("Q8_0", seed=2)
    for ids in ([[1]], [[2]], [[1, 3]], [[5, 6, 1]], [[7, 8, 9, 7]]):
        assert torch.equal(embedding(torch.tensor(ids)), whole[torch.tensor(ids)]), ids
        assert len(embedding._kept) <= 2
    dequantized = _dequantized_lookups(embedding, monkeypatch)
    for ids in ([[10]], [[11]], [[10]], [[12]], [[10]]):  # 10 used again: 11 goes first
        assert torch.equal(embedding(torch.tensor(ids)), whole[torch.tensor(ids)]), ids
    assert dequantized == [[10], [11], [12]]
