"""Whether sampled output follows the target, position by position: a check for bench runs.

Text identity says nothing when tokens are sampled. What exactness promises instead is that
every generated token is drawn from the target's own distribution given everything before
it (after temperature, top-k, top-p). The randomized probability integral transform turns
that promise into something testable on any number of runs: order the vocabulary from the
most to the least probable token under P (ties by id); for a token x drawn from P,

    u = P(tokens before x) + V * P(x),   V ~ Uniform(0, 1) independent,

is Uniform(0, 1), and the u of successive positions are independent (each is uniform given
the past). Ordered by probability, the typical sampler errors move u one way: drawing
likely tokens too often (a draft accepted too easily, a distribution too sharp) piles u up
near 0, too flat a distribution spreads it towards 1; in id order such errors would average
out over positions. So the u of every position of every run of a system, its target's conditional
distributions recomputed by one forward pass over prompt + output, must look like uniform
draws: a Kolmogorov-Smirnov test says how surprising they are. A sampler that is wrong
anywhere (a missing residual, a wrong bonus row, top-p applied to one side only) shifts the
u away from uniform; with n positions, a distance d of their distribution function from the
uniform one is flagged at significance 1e-3 once d exceeds about 1.95 / sqrt(n) (the
Kolmogorov distribution's 0.999 quantile is 1.949).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch


def pit_values(
    probs: torch.Tensor, token_ids: Sequence[int], generator: torch.Generator
) -> list[float]:
    """probs  # [positions, vocab], each row the distribution its token was drawn from."""
    assert probs.shape[0] == len(token_ids), "one distribution per token"
    ids = torch.tensor(list(token_ids), dtype=torch.long)
    order = torch.sort(probs.double(), dim=-1, descending=True, stable=True)
    rank = (order.indices == ids[:, None]).int().argmax(dim=-1)  # x's place in the order
    through = torch.cumsum(order.values, dim=-1).gather(1, rank[:, None])[:, 0]
    at = probs.double().gather(1, ids[:, None])[:, 0]
    below = through - at
    jitter = torch.rand(len(ids), generator=generator, dtype=torch.float64)
    return (below + jitter * at).clamp(0.0, 1.0).tolist()


@dataclass(frozen=True)
class UniformityTest:
    positions: int
    statistic: float  # the Kolmogorov-Smirnov distance to Uniform(0, 1)
    p_value: float


def ks_uniform(values: Sequence[float]) -> UniformityTest:
    """One-sample Kolmogorov-Smirnov test against Uniform(0, 1), with the asymptotic
    Kolmogorov distribution (Stephens' small-sample correction)."""
    n = len(values)
    if n == 0:
        return UniformityTest(0, 0.0, 1.0)
    ordered = sorted(values)
    distance = max(
        max((i + 1) / n - u for i, u in enumerate(ordered)),
        max(u - i / n for i, u in enumerate(ordered)),
    )
    root = math.sqrt(n)
    return UniformityTest(n, distance, kolmogorov_sf((root + 0.12 + 0.11 / root) * distance))


def kolmogorov_sf(x: float) -> float:
    """P(K > x) for the Kolmogorov distribution."""
    if x <= 0.0:
        return 1.0
    if x < 0.3:
        return 1.0  # the series converges slowly here; the probability is 1 to 1e-9
    total = sum((-1) ** (k - 1) * math.exp(-2.0 * k * k * x * x) for k in range(1, 101))
    return min(1.0, max(0.0, 2.0 * total))


def check_runs(backend, prompts: dict[str, list[int]], runs, params, seed: int = 0):
    """The uniformity test of every generated position of ``runs`` (bench ``Run``s of one
    system) against ``backend``'s conditional distributions under ``params``."""
    from specdec.sampling import logits_to_probs

    generator = torch.Generator().manual_seed(seed)
    values: list[float] = []
    for run in runs:
        if not run.token_ids:
            continue
        prompt = prompts[run.prompt_id]
        backend.truncate(0)
        logits = backend.forward(prompt + run.token_ids[:-1])[len(prompt) - 1 :]
        values += pit_values(logits_to_probs(logits, params), run.token_ids, generator)
    backend.truncate(0)
    return ks_uniform(values)


def markdown(tests: dict[str, UniformityTest]) -> str:
    lines = [
        "",
        "## Sampled tokens against the target's own distribution",
        "",
        "Every generated position of every run, as u = P(tokens more likely than x) + "
        "V P(x) under the target's distribution given the text before it (temperature, "
        "top-k, top-p applied; V uniform): exact sampling makes the u uniform. "
        "Kolmogorov-Smirnov test:",
        "",
        "| system | positions | KS distance | p-value |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {name} | {test.positions} | {test.statistic:.4f} | {test.p_value:.3g} |"
        for name, test in tests.items()
    ]
    return "\n".join(lines) + "\n"
