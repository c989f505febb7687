"""Drafter recipes, parsed and built in one place for the CLI, the server and the bench.

A recipe is ``none`` or a '+'-joined fallback chain of drafter kinds: ``model``,
``lookup+model``. ``build_drafter`` turns the kinds into drafters with the factories the
caller has (a server without a draft model offers no ``model``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from specdec.drafters.base import Drafter
from specdec.drafters.composite import FallbackDrafter

KINDS = {
    "model": "draft model",
    "lookup": "prompt lookup",
    "ngram": "n-gram model",
    "medusa": "Medusa heads",
    "eagle": "EAGLE head",
}


def parse_recipe(recipe: str) -> list[str]:
    """'lookup+model' -> ['lookup', 'model']; 'none' -> []."""
    if recipe == "none":
        return []
    kinds = recipe.split("+")
    if any(kind not in KINDS for kind in kinds) or len(set(kinds)) != len(kinds):
        raise ValueError(
            f"drafter {recipe!r}: use none or a '+'-joined chain of {', '.join(KINDS)}"
        )
    return kinds


def describe_recipe(recipe: str) -> str:
    """'lookup+model' -> 'prompt lookup else draft model'."""
    kinds = parse_recipe(recipe)
    return " else ".join(KINDS[kind] for kind in kinds) if kinds else "no drafter"


def build_drafter(recipe: str, factories: Mapping[str, Callable[[], Drafter]]) -> Drafter | None:
    """The drafter for ``recipe`` (None for ``none``); a kind without a factory is refused."""
    kinds = parse_recipe(recipe)
    missing = [kind for kind in kinds if kind not in factories]
    if missing:
        raise ValueError(
            f"drafter {recipe!r} needs {', '.join(missing)}, which is not available here"
        )
    members = [factories[kind]() for kind in kinds]
    if not members:
        return None
    return members[0] if len(members) == 1 else FallbackDrafter(members)


def available_recipes(kinds: list[str]) -> list[str]:
    """Every recipe buildable from ``kinds`` that the CLI and server offer: each kind alone,
    and lookup in front of each other kind."""
    recipes = ["none", *kinds]
    if "lookup" in kinds:
        recipes += [f"lookup+{kind}" for kind in kinds if kind != "lookup"]
    return recipes
