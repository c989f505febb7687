"""SpecStats: the one place the field's metrics are defined.

Conventions (written once here; the CLI, server and bench read them, never recompute):
- ``acceptance_rate`` = accepted draft tokens / drafted tokens.
- ``mean_accepted_length`` = tokens the target pass yields per round, *including* the
  recovered/bonus token: 1 + accepted / rounds, as vLLM and Spec-Bench count it. Plain
  decoding gives exactly 1. A first token that comes from the prefill's pass (a long
  prompt's: ``engine.Run.first_token``) is no round, as in vLLM.
- ``by_drafter[name]`` = rounds, drafted, accepted and acceptance_rate of the rounds that
  drafter proposed (a composite drafter names its member).
- ``per_position_acceptance[i]`` = P(draft i accepted | drafts before it accepted).
- Draft trees (``SpecConfig.tree``): a round's drafted tokens are all its nodes, the chain's and
  the siblings' (``sibling_tokens``, of which ``sibling_accepted`` were taken: each ends its
  round's path); a position counts as accepted when any node at that depth was.
- ``alpha`` = the paper's alpha, P(a draft is accepted | the verifier reached it): accepted
  over reached positions, all positions pooled (tune's formula input).
- Aggregates over requests or runs are ``SpecStats.merged(...)`` of them: counters add,
  rates are computed from the sums (never averaged).
- With no rounds, ``mean_accepted_length`` is 0.0 and the rates 0.0.
- ``prefill_seconds`` = processing the prompt (both models); ``drafter_seconds`` and
  ``target_seconds`` = the decode phase only; ``overhead_seconds`` = the rest of the wall
  time (verification, sampling, detokenizing, the loop itself).
- ``tokens_per_second`` = generated tokens / total wall time (prefill included).
"""

from __future__ import annotations

from dataclasses import dataclass, field

FORCED = "grammar"  # the name the grammar's forced drafts go by in ``by_drafter``

_COUNTERS = (
    "prompt_tokens",
    "generated_tokens",
    "rounds",
    "drafted_tokens",
    "accepted_tokens",
    "bonus_tokens",
    "residual_fallbacks",
    "sibling_tokens",
    "sibling_accepted",
    "target_forwards",
    "drafter_seconds",
    "target_seconds",
    "prefill_seconds",
    "total_seconds",
)


@dataclass
class SpecStats:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    rounds: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    bonus_tokens: int = 0
    residual_fallbacks: int = 0
    sibling_tokens: int = 0
    sibling_accepted: int = 0
    target_forwards: int = 0
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    k_per_round: dict[int, int] = field(default_factory=dict)
    by_drafter: dict[str, dict[str, int]] = field(default_factory=dict)  # rounds/drafted/accepted
    drafter_seconds: float = 0.0
    target_seconds: float = 0.0
    prefill_seconds: float = 0.0
    total_seconds: float = 0.0

    def record_round(
        self,
        k: int,
        num_accepted: int,
        bonus: bool,
        residual_fallback: bool,
        drafter: str = "",
        siblings: int = 0,
        sibling_taken: bool = False,
        given: int = 0,
    ) -> None:
        """A verified round: ``k`` chain drafts (a tree's chain) and ``siblings`` more
        nodes, ``num_accepted`` of them on the accepted path (its last a sibling when
        ``sibling_taken``); ``given``: the grammar's forced drafts ahead of them, each
        accepted (``FORCED``), which the counts by position leave out."""
        self.rounds += 1
        if given:
            forced = self.by_drafter.setdefault(FORCED, {"rounds": 0, "drafted": 0, "accepted": 0})
            forced["rounds"] += 1
            forced["drafted"] += given
            forced["accepted"] += given
            self.drafted_tokens += given
            self.accepted_tokens += given
        if k > 0:
            member = self.by_drafter.setdefault(drafter, {"rounds": 0, "drafted": 0, "accepted": 0})
            member["rounds"] += 1
            member["drafted"] += k + siblings
            member["accepted"] += num_accepted
        self.sibling_tokens += siblings
        self.sibling_accepted += int(sibling_taken)
        self.drafted_tokens += k + siblings
        self.accepted_tokens += num_accepted
        self.bonus_tokens += int(bonus and k + given > 0)
        self.residual_fallbacks += int(residual_fallback)
        self.k_per_round[k] = self.k_per_round.get(k, 0) + 1
        while len(self.drafted_per_position) < k:
            self.drafted_per_position.append(0)
            self.accepted_per_position.append(0)
        # Position i is reached only when drafts 0..i-1 were accepted.
        for position in range(min(k, num_accepted + 1)):
            self.drafted_per_position[position] += 1
            self.accepted_per_position[position] += int(position < num_accepted)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        return 1.0 + self.accepted_tokens / self.rounds if self.rounds else 0.0

    @property
    def alpha(self) -> float:
        reached = sum(self.drafted_per_position)
        return sum(self.accepted_per_position) / reached if reached else 0.0

    @classmethod
    def merged(cls, parts: list[SpecStats]) -> SpecStats:
        """One SpecStats for several requests or runs: every counter summed."""
        total = cls()
        for part in parts:
            for name in _COUNTERS:
                setattr(total, name, getattr(total, name) + getattr(part, name))
            for mine, theirs in (
                (total.drafted_per_position, part.drafted_per_position),
                (total.accepted_per_position, part.accepted_per_position),
            ):
                mine.extend([0] * (len(theirs) - len(mine)))
                for i, count in enumerate(theirs):
                    mine[i] += count
            for k, n in part.k_per_round.items():
                total.k_per_round[k] = total.k_per_round.get(k, 0) + n
            for name, counts in part.by_drafter.items():
                member = total.by_drafter.setdefault(
                    name, {"rounds": 0, "drafted": 0, "accepted": 0}
                )
                for key in member:
                    member[key] += counts[key]
        return total

    @classmethod
    def from_dict(cls, data: dict) -> SpecStats:
        """The inverse of ``to_dict`` (counters only; rates are recomputed from them)."""
        stats = cls(**{name: data.get(name, 0) for name in _COUNTERS})
        stats.drafted_per_position = list(data.get("drafted_per_position", []))
        stats.accepted_per_position = list(data.get("accepted_per_position", []))
        stats.k_per_round = {int(k): n for k, n in data.get("k_per_round", {}).items()}
        stats.by_drafter = {
            name: {key: counts[key] for key in ("rounds", "drafted", "accepted")}
            for name, counts in data.get("by_drafter", {}).items()
        }
        return stats

    @property
    def per_position_acceptance(self) -> list[float]:
        return [
            accepted / drafted if drafted else 0.0
            for accepted, drafted in zip(
                self.accepted_per_position, self.drafted_per_position, strict=True
            )
        ]

    @property
    def overhead_seconds(self) -> float:
        busy = self.prefill_seconds + self.drafter_seconds + self.target_seconds
        return max(0.0, self.total_seconds - busy)

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.total_seconds if self.total_seconds > 0 else 0.0

    def to_dict(self) -> dict:
        """Plain JSON-ready dict: counters plus the derived metrics, by their names above."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "rounds": self.rounds,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "bonus_tokens": self.bonus_tokens,
            "residual_fallbacks": self.residual_fallbacks,
            "sibling_tokens": self.sibling_tokens,
            "sibling_accepted": self.sibling_accepted,
            "target_forwards": self.target_forwards,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_length": self.mean_accepted_length,
            "per_position_acceptance": self.per_position_acceptance,
            "drafted_per_position": list(self.drafted_per_position),
            "accepted_per_position": list(self.accepted_per_position),
            "k_per_round": {str(k): n for k, n in sorted(self.k_per_round.items())},
            "by_drafter": {
                name: {**counts, "acceptance_rate": counts["accepted"] / counts["drafted"]}
                for name, counts in self.by_drafter.items()
            },
            "drafter_seconds": self.drafter_seconds,
            "target_seconds": self.target_seconds,
            "overhead_seconds": self.overhead_seconds,
            "prefill_seconds": self.prefill_seconds,
            "total_seconds": self.total_seconds,
            "tokens_per_second": self.tokens_per_second,
        }
