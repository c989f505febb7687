"""The paper's cost model (Leviathan et al. 2023, section 3.3 and 4).

alpha: probability that one drafted token is accepted (assumed i.i.d. per position).
c:     cost of one draft step / cost of one target step.
v:     cost of a (k + 1)-token verify pass / cost of one target step (1 when memory-bound).
"""

from __future__ import annotations


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
