"""What one timed run of a system gives the bench, whatever the engine (specdec or a peer)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunOutput:
    token_ids: list[int]
    seconds: float
    stats: dict | None  # SpecStats.to_dict(): specdec systems, and peers that count their own
    peer: bool = False  # another engine's run: its sampler draws differently from ours
