"""The target's kept features (what heads read): they follow forward and truncate."""

from __future__ import annotations

import random

import pytest
import torch

from helpers import VOCAB, backend, tiny_llama
from specdec.backends.quant.convert import make_int8_batch_invariant

# ---- hidden states ---------------------------------------------------------------------


@pytest.mark.parametrize("int8", [False, True])
def test_hidden_states_follow_forward_and_truncate(int8):
    model = tiny_llama(seed=3)
    model = make_int8_batch_invariant(model) if int8 else model
    target = backend(model)
    target.keep_hidden_states()
    rng = random.Random(0)
    tokens: list[int] = []
    for _ in range(30):
        if tokens and rng.random() < 0.35:
            keep = rng.randrange(len(tokens) + 1)
            target.truncate(keep)
            del tokens[keep:]
        else:
            new = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 6))]
            target.forward(new, last_only=rng.random() < 0.5)
            tokens += new
        if not tokens:
            continue
        fresh = backend(model)
        fresh.keep_hidden_states()
        fresh.forward(tokens)
        kept, expected = target.hidden_states(), fresh.hidden_states()
        assert kept.shape == (len(tokens), 32)
        if int8:  # the int8 runtime scores a block as its steps: bit for bit
            assert torch.equal(kept, expected)
        else:
            torch.testing.assert_close(kept, expected, rtol=1e-5, atol=1e-5)


def test_hidden_states_must_be_asked_for(target_model):
    with pytest.raises(ValueError, match="keep_hidden_states"):
        backend(target_model).hidden_states()


def test_one_hook_however_many_backends(target_model):
    norm = target_model.get_decoder().norm
    for _ in range(5):
        backend(target_model).keep_hidden_states()
    assert len(norm._forward_hooks) == 1
