"""Drafter recipes, parsed and built in one place for the CLI, the server, the bench and
the heads commands.

A recipe is ``none``, a '+'-joined fallback chain of drafter kinds (``model``,
``lookup+model``), or a '/'-joined choice of chains (``model/eagle``,
``lookup+model/lookup+eagle``): each round one chain drafts, chosen from measured rounds
(``controller.DrafterChoice``; k=auto only). ``build_drafter`` turns the kinds into drafters
from the ``DraftSources`` the caller has (a server without a draft model offers no
``model``): a new drafter's parts are made here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from specdec.drafters.base import Drafter
from specdec.drafters.composite import ChoiceDrafter, FallbackDrafter
from specdec.drafters.lookup import PromptLookupDrafter
from specdec.drafters.model import ModelDrafter
from specdec.drafters.ngram import NGramDrafter, NGramModel

KINDS = {
    "model": "draft model",
    "lookup": "prompt lookup",
    "ngram": "n-gram model",
    "medusa": "Medusa heads",
    "eagle": "EAGLE head",
    "prediction": "predicted output",  # a request's own (``DraftSources.prediction``)
}


def parse_recipe(recipe: str) -> list[str]:
    """The kinds a recipe uses, each once: 'lookup+model' -> ['lookup', 'model'];
    'model/eagle' -> ['model', 'eagle']; 'none' -> []."""
    kinds: list[str] = []
    for chain in parse_choice(recipe):
        kinds += [kind for kind in _parse_chain(chain) if kind not in kinds]
    return kinds


def parse_choice(recipe: str) -> list[str]:
    """The chains a recipe chooses among: 'model/eagle' -> ['model', 'eagle']; a chain is
    one ('lookup+model' -> ['lookup+model']); 'none' -> []."""
    if recipe == "none":
        return []
    chains = recipe.split("/")
    for chain in chains:
        _parse_chain(chain)
    if len(set(chains)) != len(chains):
        raise ValueError(f"drafter {recipe!r}: each choice once")
    return chains


def _parse_chain(chain: str) -> list[str]:
    kinds = chain.split("+")
    if any(kind not in KINDS for kind in kinds) or len(set(kinds)) != len(kinds):
        raise ValueError(
            f"drafter {chain!r}: use none, a '+'-joined chain of {', '.join(KINDS)} "
            "(each kind once), or a '/'-joined choice of chains"
        )
    return kinds


def in_front(kind: str, recipe: str) -> str:
    """``recipe`` with ``kind`` in front of each chain that lacks it: ('prediction',
    'lookup+model') -> 'prediction+lookup+model'; ('lookup', 'model/eagle') ->
    'lookup+model/lookup+eagle'; ('lookup', 'none') -> 'lookup'."""
    chains = parse_choice(recipe)
    if not chains:
        return kind
    return "/".join(chain if kind in _parse_chain(chain) else f"{kind}+{chain}" for chain in chains)


def with_prediction(recipe: str) -> str:
    """``recipe`` with a request's predicted output in front of each chain."""
    return in_front("prediction", recipe)


def is_recipe(recipe: str) -> bool:
    """Whether ``recipe`` is a valid drafter recipe (as for ``--drafter``)."""
    try:
        parse_choice(recipe)
    except ValueError:
        return False
    return True


def is_choice(recipe: str) -> bool:
    return len(parse_choice(recipe)) > 1


def describe_recipe(recipe: str) -> str:
    """'lookup+model' -> 'prompt lookup else draft model'; 'model/eagle' -> 'draft model or
    EAGLE head, whichever measures faster'."""
    chains = parse_choice(recipe)
    if not chains:
        return "no drafter"
    described = [" else ".join(KINDS[kind] for kind in _parse_chain(c)) for c in chains]
    if len(described) == 1:
        return described[0]
    return " or ".join(described) + ", whichever measures faster"


@dataclass(frozen=True)
class DraftSources:
    """What a command has to draft with; each part is made only when a recipe needs it.

    ``draft_model``: a new sequence of the draft model (a backend with its own cache), which
    drafts guided by prompt lookup (``ModelDrafter``'s ``guide``: the same proposals, fewer
    passes where the draft confirms the copy); ``heads``: by kind (medusa, eagle), a new heads
    drafter over the request's target; ``ngram_model``: the n-gram model; ``lookup_ngrams``:
    prompt lookup's (max, min) match (min None: 1 alone, 2 in front of another drafter);
    ``prediction``: a new drafter of one request's predicted output (``PredictionDrafter``).
    A kind whose part is missing is not available (``kinds``)."""

    draft_model: Callable[[], Any] | None = None
    heads: Mapping[str, Callable[[], Drafter]] = field(default_factory=dict)
    ngram_model: Callable[[], NGramModel] | None = None
    lookup_ngrams: tuple[int, int | None] = (3, None)
    prediction: Callable[[], Drafter] | None = None

    def factories(self) -> dict[str, Callable[[], Drafter]]:
        """Every available kind's drafter factory."""
        made: dict[str, Callable[[], Drafter]] = {
            "lookup": lambda: PromptLookupDrafter(*self.lookup_ngrams)
        }
        if (draft_model := self.draft_model) is not None:
            made["model"] = lambda: ModelDrafter(draft_model(), self._guide())
        if (ngram_model := self.ngram_model) is not None:
            made["ngram"] = lambda: NGramDrafter(ngram_model())
        if self.prediction is not None:
            made["prediction"] = self.prediction
        return made | dict(self.heads)

    def _guide(self) -> PromptLookupDrafter:
        """The draft model's guide: prompt lookup taking matches of 2+ tokens, as in front
        of another drafter (1-token matches were confirmed by the draft too rarely to pay
        for the rows: bench/results/2026-12-04-draft-guide-epyc-avx512)."""
        guide = PromptLookupDrafter(*self.lookup_ngrams)
        guide.put_in_front()
        return guide

    def kinds(self) -> list[str]:
        """The kinds available: lookup, the draft model, the n-gram model, then the heads."""
        made = self.factories()
        return [k for k in ("lookup", "model", "ngram") if k in made] + sorted(self.heads)


def build_drafter(
    recipe: str, sources: DraftSources | Mapping[str, Callable[[], Drafter]]
) -> Drafter | None:
    """The drafter for ``recipe`` (None for ``none``) from ``sources`` (or factories by
    kind); a kind that is not available is refused."""
    factories = sources.factories() if isinstance(sources, DraftSources) else sources
    chains = parse_choice(recipe)
    missing = [kind for kind in parse_recipe(recipe) if kind not in factories]
    if missing:
        raise ValueError(
            f"drafter {recipe!r} needs {', '.join(missing)}, which is not available here"
        )
    if not chains:
        return None
    if len(chains) == 1:
        return _build_chain(chains[0], factories)
    return ChoiceDrafter({chain: _build_chain(chain, factories) for chain in chains})


def _build_chain(chain: str, factories: Mapping[str, Callable[[], Drafter]]) -> Drafter:
    members = [factories[kind]() for kind in _parse_chain(chain)]
    return members[0] if len(members) == 1 else FallbackDrafter(members)


def available_recipes(kinds: list[str]) -> list[str]:
    """Every recipe buildable from ``kinds`` that the CLI and server offer: each kind alone,
    lookup in front of each other kind, and a choice between any two drafting kinds (with
    lookup in front of both, too)."""
    recipes = ["none", *kinds]
    drafting = [kind for kind in kinds if kind != "lookup"]
    if "lookup" in kinds:
        recipes += [f"lookup+{kind}" for kind in drafting]
    recipes += [f"{a}/{b}" for a, b in combinations(drafting, 2)]
    if "lookup" in kinds:
        recipes += [f"lookup+{a}/lookup+{b}" for a, b in combinations(drafting, 2)]
    return recipes
