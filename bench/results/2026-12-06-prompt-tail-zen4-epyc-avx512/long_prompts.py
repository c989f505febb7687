"""What the two A/B scripts here share: long prompts from specdec's own source (~760, ~400
and ~1,424 tokens through the chat template) and the model drafter inside a drafter."""

from pathlib import Path

import specdec
from specdec.drafters.model import ModelDrafter
from specdec.prompting import encode_prompt

_SOURCE = (Path(specdec.__file__).parent / "engine.py").read_text()
TEXTS = {
    "long-760": "Summarize what this code does:\n" + _SOURCE[:3000],
    "long-400": "Explain this code:\n" + _SOURCE[3000:4600],
    "long-1500": "What could go wrong in this code?\n" + _SOURCE[4600:10600],
}


def long_prompts(tokenizer, names=tuple(TEXTS)) -> dict[str, list[int]]:
    """The prompts ``names``' token ids, by name."""
    return {name: encode_prompt(tokenizer, TEXTS[name], "chat") for name in names}


def model_member(drafter):
    """The ModelDrafter in a drafter (itself, or a member of a fallback chain)."""
    if isinstance(drafter, ModelDrafter):
        return drafter
    for member in getattr(drafter, "drafters", []):
        if (found := model_member(member)) is not None:
            return found
    return None
