"""``RotaryTokenByToken``'s table of positions: the same bits as its one-position calls, however
the positions are asked for, and no table where the embedding changes with the text."""

import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from specdec.backends.quant.rows import RotaryTokenByToken


def rotary(**rope) -> LlamaRotaryEmbedding:
    config = LlamaConfig(
        hidden_size=256,
        num_attention_heads=4,
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, **rope},
    )
    return LlamaRotaryEmbedding(config)


def one_at_a_time(inner, x, positions: list[int]):
    """What the wrapper computed before it kept a table: one call per position."""
    rows = [inner(x, torch.tensor([[p]])) for p in positions]
    return torch.cat([c for c, _ in rows], dim=1), torch.cat([s for _, s in rows], dim=1)


def test_the_table_gives_each_position_the_bits_of_its_own_call():
    inner = rotary()
    wrapped = RotaryTokenByToken(inner)
    assert wrapped._static
    x = torch.randn(1, 1, 256)
    # steps, out of order, across the table's steps and its doublings, then blocks
    asks = [[5], [0], [63], [64], [200], [3], list(range(60, 70)), list(range(250, 400)), [1000]]
    for positions in asks:
        cos, sin = wrapped(x, torch.tensor([positions]))
        ref_cos, ref_sin = one_at_a_time(inner, x, positions)
        assert cos.shape == ref_cos.shape == (1, len(positions), 64)
        assert torch.equal(cos, ref_cos) and torch.equal(sin, ref_sin), positions
    assert wrapped._tables[torch.float32][2] == 1024  # up to a multiple of TABLE_STEP


def test_a_table_per_dtype():
    inner = rotary()
    wrapped = RotaryTokenByToken(inner)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(1, 1, 256).to(dtype)
        cos, sin = wrapped(x, torch.tensor([[7, 8, 9]]))
        ref_cos, ref_sin = one_at_a_time(inner, x, [7, 8, 9])
        assert cos.dtype == dtype and torch.equal(cos, ref_cos) and torch.equal(sin, ref_sin)
    assert set(wrapped._tables) == {torch.float32, torch.bfloat16}


def test_no_table_where_the_embedding_changes_with_the_text():
    inner = rotary(rope_type="dynamic", factor=2.0)
    wrapped = RotaryTokenByToken(inner)
    assert not wrapped._static
    x = torch.randn(1, 1, 256)
    cos, _ = wrapped(x, torch.tensor([[1, 2, 3]]))
    assert torch.equal(cos, one_at_a_time(inner, x, [1, 2, 3])[0])
    assert not wrapped._tables


def test_a_batch_of_position_rows_is_computed_as_before():
    inner = rotary()
    wrapped = RotaryTokenByToken(inner)
    x = torch.randn(2, 1, 256)
    positions = torch.tensor([[1, 2], [5, 6]])
    cos, sin = wrapped(x, positions)
    rows = [inner(x, positions[:, i : i + 1]) for i in range(2)]
    assert torch.equal(cos, torch.cat([c for c, _ in rows], dim=1))
    assert not wrapped._tables
