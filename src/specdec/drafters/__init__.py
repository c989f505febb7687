"""Drafters propose k tokens per round; see ``base.Drafter``."""

from specdec.drafters.base import Drafter, Proposal
from specdec.drafters.model import ModelDrafter

__all__ = ["Drafter", "ModelDrafter", "Proposal"]
