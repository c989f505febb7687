"""The paper's cost model (Leviathan et al. 2023, section 3.3 and 4).

alpha: probability that one drafted token is accepted (assumed i.i.d. per position).
c:     cost of one draft step / cost of one target step.
v:     cost of a (k + 1)-token verify pass / cost of one target step (1 when memory-bound).
"""

from __future__ import annotations

from collections.abc import Mapping


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """E[tokens emitted per round] = (1 - alpha^(k+1)) / (1 - alpha).

    >>> round(expected_tokens_per_round(0.8, 4), 4)
    3.3616
    """
    _check_alpha(alpha)
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def expected_speedup(alpha: float, k: int, c: float, v: float = 1.0) -> float:
    """Speedup over plain decoding: tokens per round over the round's cost k*c + v.

    >>> round(expected_speedup(0.8, 4, 0.05, 1.0), 3)
    2.801
    """
    if c < 0 or v <= 0:
        raise ValueError(f"costs must be c >= 0 and v > 0, got c={c}, v={v}")
    return expected_tokens_per_round(alpha, k) / (k * c + v)


def _check_alpha(alpha: float) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")


def expected_tokens_per_round_by_position(acceptance: list[float], k: int) -> float:
    """1 + sum over j <= k of P(drafts 1..j all accepted), with a rate per position.

    With every rate equal to alpha this is ``expected_tokens_per_round(alpha, k)``.
    """
    expected, reach = 1.0, 1.0
    for position in range(k):
        alpha = acceptance[min(position, len(acceptance) - 1)] if acceptance else 0.0
        reach *= alpha
        expected += reach
    return expected


def speedup_by_position(acceptance: list[float], k: int, c: float, v: float) -> float:
    """The paper's speedup with a rate per position: tokens a round over k c + v, v the
    cost of the (k + 1)-token pass.

    >>> round(speedup_by_position([0.8, 0.5], 2, 0.1, 1.2), 3)
    1.571
    """
    return expected_tokens_per_round_by_position(acceptance[:k], k) / (k * c + v)


def best_speedup_by_position(
    acceptance: list[float], c: float, verify_cost: Mapping[int, float]
) -> float | None:
    """The highest ``speedup_by_position`` over k = 1..len(acceptance), for the k whose
    pass size ``verify_cost`` has; None where it has none of them.

    >>> round(best_speedup_by_position([0.8, 0.5], 0.1, {2: 1.1, 3: 1.2}), 3)
    1.571
    """
    speedups = [
        speedup_by_position(acceptance, k, c, verify_cost[k + 1])
        for k in range(1, len(acceptance) + 1)
        if k + 1 in verify_cost
    ]
    return max(speedups) if speedups else None


def speedup_curve(alpha: float, c: float, verify_cost: list[float], max_k: int) -> list[float]:
    """Expected speedup for k = 0..max_k.

    ``verify_cost[n]`` = v of an n-token pass (index 0 unused).
    """
    return [
        expected_speedup(alpha, k, c, verify_cost[min(k + 1, len(verify_cost) - 1)])
        for k in range(max_k + 1)
    ]


def optimal_k(
    alpha: float, c: float, verify_cost: list[float] | None = None, max_k: int = 16
) -> int:
    """The k in 0..max_k with the highest expected speedup (0 = do not speculate).

    ``verify_cost[n]`` is the cost of an n-token pass over a 1-token step; None means a
    memory-bound target (v = 1 for every n).

    >>> optimal_k(0.8, 0.05)        # cheap draft, good acceptance: speculate deep
    8
    >>> optimal_k(0.3, 0.5)         # poor acceptance, costly draft: don't
    0
    """
    costs = verify_cost or [1.0] * (max_k + 2)
    curve = speedup_curve(alpha, c, costs, max_k)
    return max(range(len(curve)), key=lambda k: (curve[k], -k))
