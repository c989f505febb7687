"""Tiny models and tokenizers built in code (no downloads), and a chi-square helper."""

from __future__ import annotations

import numpy as np
from scipy import stats as scipy_stats

from specdec.backends.hf import HFModel
from specdec.bench.tiny import CHARS, EOS_ID, VOCAB, char_tokenizer, perturbed_copy, tiny_llama  # noqa: F401

# Chi-square tests reject at this level: with fresh random seeds a correct sampler would fail
# about 1 run in 10,000. The seeds are fixed, so the suite itself is deterministic.
SIGNIFICANCE = 1e-4


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
