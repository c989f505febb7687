"""Drafter recipes: one parser and builder for the CLI, the server and the bench."""

import pytest

from specdec.drafters import ChoiceDrafter, FallbackDrafter, PromptLookupDrafter
from specdec.drafters.recipe import (
    available_recipes,
    build_drafter,
    describe_recipe,
    in_front,
    parse_choice,
    parse_recipe,
)


def test_parse_and_describe():
    assert parse_recipe("lookup+model") == ["lookup", "model"]
    assert parse_recipe("none") == []
    assert describe_recipe("lookup+ngram") == "prompt lookup else n-gram model"


@pytest.mark.parametrize("bad", ["oracle", "model+model", "lookup+", ""])
def test_bad_recipes_name_the_choices(bad):
    with pytest.raises(ValueError, match="model, lookup, ngram"):
        parse_recipe(bad)


def test_build_uses_the_factories_it_is_given():
    assert build_drafter("none", {}) is None
    assert isinstance(build_drafter("lookup", {"lookup": PromptLookupDrafter}), PromptLookupDrafter)
    chain = build_drafter(
        "lookup+ngram", {"lookup": PromptLookupDrafter, "ngram": PromptLookupDrafter}
    )
    assert isinstance(chain, FallbackDrafter) and len(chain.drafters) == 2
    with pytest.raises(ValueError, match="needs model, which is not available"):
        build_drafter("lookup+model", {"lookup": PromptLookupDrafter})


def test_available_recipes():
    assert available_recipes(["lookup", "model"]) == ["none", "lookup", "model", "lookup+model"]
    assert available_recipes(["lookup", "model", "eagle"]) == [
        "none",
        "lookup",
        "model",
        "eagle",
        "lookup+model",
        "lookup+eagle",
        "model/eagle",
        "lookup+model/lookup+eagle",
    ]


def test_a_choice_of_chains():
    assert parse_choice("model/lookup+eagle") == ["model", "lookup+eagle"]
    assert parse_choice("lookup+model") == ["lookup+model"]
    assert parse_recipe("lookup+model/lookup+eagle") == ["lookup", "model", "eagle"]
    assert describe_recipe("model/lookup+eagle") == (
        "draft model or prompt lookup else EAGLE head, whichever measures faster"
    )
    choice = build_drafter(
        "lookup/ngram+lookup", {"lookup": PromptLookupDrafter, "ngram": PromptLookupDrafter}
    )
    assert isinstance(choice, ChoiceDrafter) and list(choice.members) == ["lookup", "ngram+lookup"]
    assert isinstance(choice.members["ngram+lookup"], FallbackDrafter)
    for bad in ("model/model", "model/", "model/oracle", "none/model"):
        with pytest.raises(ValueError, match="drafter"):
            parse_choice(bad)
    with pytest.raises(ValueError, match="needs eagle, which is not available"):
        build_drafter("lookup/eagle", {"lookup": PromptLookupDrafter})


def test_a_kind_in_front_of_each_chain_that_lacks_it():
    assert in_front("lookup", "model") == "lookup+model"
    assert in_front("lookup", "lookup+model") == "lookup+model"
    assert in_front("lookup", "model/eagle") == "lookup+model/lookup+eagle"
    assert in_front("lookup", "none") == "lookup"
    assert in_front("prediction", "lookup+model") == "prediction+lookup+model"
