"""Prompt text to token ids (``prompting``): fill-in-the-middle markers and prompts given as ids."""

import pytest

from helpers import VOCAB, char_tokenizer, fim_tokenizer
from specdec.prompting import FIM_MARKERS, checked_ids, fim_ids, fim_markers


@pytest.mark.parametrize("markers", FIM_MARKERS)
def test_each_familys_markers_are_found(markers):
    tokenizer = char_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": list(markers)})
    assert fim_markers(tokenizer) == (VOCAB, VOCAB + 1, VOCAB + 2)


def test_a_tokenizer_without_markers_has_none_and_fim_says_so():
    assert fim_markers(char_tokenizer()) is None
    assert fim_markers(object()) is None  # no lookup at all
    with pytest.raises(ValueError, match="suffix needs a model trained to fill in the middle"):
        fim_ids(char_tokenizer(), "ab", "cd")


def test_fim_ids_are_prefix_suffix_middle():
    tokenizer = fim_tokenizer()
    before, after, middle = VOCAB, VOCAB + 1, VOCAB + 2
    expected = [before, *tokenizer.encode("ab c"), after, *tokenizer.encode("d"), middle]
    assert fim_ids(tokenizer, "ab c", "d") == expected
    assert fim_ids(tokenizer, tokenizer.encode("ab c"), "d") == expected  # a prefix as ids
    assert fim_ids(tokenizer, "", "") == [before, after, middle]  # at a file's start


def test_prompt_ids_outside_the_vocabulary_are_named():
    assert checked_ids([0, 5, 31], 32) == [0, 5, 31]
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 32\): \[32, 40\]"):
        checked_ids([1, 32, 40], 32)
