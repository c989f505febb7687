"""Tiny models and tokenizers built in code (no downloads), and a chi-square helper."""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats as scipy_stats

from specdec.backends.hf import HFModel
from specdec.bench.tiny import CHARS, EOS_ID, VOCAB, char_tokenizer, perturbed_copy, tiny_llama  # noqa: F401

# Chi-square tests reject at this level: with fresh random seeds a correct sampler would fail
# about 1 run in 10,000. The seeds are fixed, so the suite itself is deterministic.
SIGNIFICANCE = 1e-4


def random_ids(seed: int, count: int, vocab: int = 20) -> list[int]:
    """``count`` token ids in 1 .. vocab - 1, drawn from their own seeded generator."""
    return torch.randint(1, vocab, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


def decode_together(runs, forward, check=None) -> list[list[int]]:
    """Step ``runs`` (started ``engine.Run``s) together with ``engine.step_together`` over
    the batched ``forward`` until each has finished; each run's tokens. ``check(chunk)``
    is called on every chunk."""
    from specdec.engine import step_together

    tokens: list[list[int]] = [[] for _ in runs]
    active = list(range(len(runs)))
    while active:
        chunks = step_together([runs[i] for i in active], forward)
        for i, chunk in zip(list(active), chunks, strict=True):
            assert not isinstance(chunk, Exception), chunk
            if check is not None:
                check(chunk)
            tokens[i] += chunk.token_ids
            if chunk.finish_reason is not None:
                active.remove(i)
    return tokens


def backend(model, tokenizer=None) -> HFModel:
    return HFModel(model, tokenizer)


def assert_same_distribution(counts: np.ndarray, expected_probs: np.ndarray) -> float:
    """Chi-square goodness of fit; cells expected < 5 are pooled. Returns the p-value.

    A token the target gives zero probability must never appear at all.
    """
    counts = np.asarray(counts, dtype=float)
    expected_probs = np.asarray(expected_probs, dtype=float)
    expected_probs = expected_probs / expected_probs.sum()
    impossible = expected_probs == 0
    assert counts[impossible].sum() == 0, (
        f"sampled impossible tokens: {np.nonzero(counts * impossible)}"
    )
    expected = expected_probs * counts.sum()
    small = (expected < 5) & ~impossible
    big = ~small & ~impossible
    observed_cells = list(counts[big]) + ([counts[small].sum()] if small.any() else [])
    expected_cells = list(expected[big]) + ([expected[small].sum()] if small.any() else [])
    if len(observed_cells) == 1:
        return 1.0  # one possible token: the check above is the whole test
    p_value = float(scipy_stats.chisquare(observed_cells, expected_cells).pvalue)
    assert p_value > SIGNIFICANCE, (
        f"distribution differs from the target (chi-square p = {p_value:.2e})"
    )
    return p_value


def tiny_heads(
    model,
    kind: str,
    steps: int = 240,
    vocab_count: int = 24,
    seed: int = 0,
    precision="auto",
    minutes: float = 10.0,
):
    """Heads of ``kind`` trained for ``steps`` steps (seconds) on the tiny ``model``'s own
    samples, or ``minutes`` if they end first. Returns (heads, training record)."""
    import torch

    from specdec import Engine, SamplingParams
    from specdec.backends.trim import TrimmedHead
    from specdec.heads.data import Shard
    from specdec.heads.load import Heads
    from specdec.heads.nets import HeadsConfig, build
    from specdec.heads.train import output_rows, train, trimmed_vocabulary

    target = HFModel(model)
    target.keep_hidden_states()
    tokens, features = [], []
    for s in range(12):
        text = Engine(target).generate(
            [1 + s % 20, 2], SamplingParams(temperature=1.0, max_tokens=62, seed=s, ignore_eos=True)
        )
        chunk = [1 + s % 20, 2] + text.token_ids
        target.truncate(0)
        target.forward(chunk)
        tokens.append(chunk)
        features.append(target.hidden_states().to(torch.float16).clone())
    shard = Shard(torch.tensor(tokens), torch.stack(features))
    config = HeadsConfig(
        kind=kind,
        fingerprint="tiny",
        hidden_size=model.config.hidden_size,
        vocab_size=model.config.vocab_size,
        token_ids=trimmed_vocabulary(shard.tokens, vocab_count, [EOS_ID]),
        num_heads=4,
        intermediate_size=64,
        target_config=model.config.to_dict(),
    )
    torch.manual_seed(seed)  # test-only: the heads' initial weights
    net = build(config)
    record = train(
        config,
        net,
        output_rows(target, config.token_ids),
        shard,
        minutes,
        model.get_input_embeddings(),
        batch_chunks=4,
        learning_rate=3e-3,
        max_steps=steps,
        precision=precision,
    )
    output = TrimmedHead(model.get_output_embeddings(), config.token_ids, config.vocab_size)
    return Heads(config, net, output), record


def fim_tokenizer():
    """``char_tokenizer`` with Qwen2.5-Coder's fill-in-the-middle markers as ids 32-34 (a
    tiny model for it needs ``vocab=VOCAB + 3``)."""
    from specdec.prompting import FIM_MARKERS

    tokenizer = char_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": list(FIM_MARKERS[0])})
    return tokenizer
