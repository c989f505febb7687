"""Drafters propose k tokens per round; see ``base.Drafter``."""

from specdec.drafters.base import Drafter, Proposal
from specdec.drafters.composite import ChoiceDrafter, FallbackDrafter
from specdec.drafters.lookup import PromptLookupDrafter
from specdec.drafters.model import ModelDrafter
from specdec.drafters.ngram import NGramDrafter, NGramModel
from specdec.drafters.prediction import PredictionDrafter

__all__ = [
    "ChoiceDrafter",
    "Drafter",
    "FallbackDrafter",
    "ModelDrafter",
    "NGramDrafter",
    "NGramModel",
    "PredictionDrafter",
    "PromptLookupDrafter",
    "Proposal",
]
