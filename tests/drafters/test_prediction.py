"""Predicted outputs (``PredictionDrafter``): following the output through the prediction by
hand, and decoding with it: plain decoding's tokens on float32, int8 and int4, greedy and
seeded, with its drafts both accepted and rejected."""

import copy

import pytest

from helpers import backend, random_ids
from specdec import Engine, SamplingParams, SpecConfig
from specdec.backends.quant.convert import make_int4_batch_invariant, make_int8_batch_invariant
from specdec.drafters import FallbackDrafter, ModelDrafter, PredictionDrafter
from specdec.drafters.prediction import Prediction
from specdec.drafters.recipe import with_prediction

PROMPT = [1, 2, 3]


def proposed(drafter: PredictionDrafter, output: list[int], k: int = 3) -> list[int]:
    return drafter.propose(PROMPT + output, k).token_ids


def test_while_the_output_is_the_predictions_beginning_the_next_tokens_are_proposed():
    drafter = PredictionDrafter([10, 11, 12, 13, 14], prompt_tokens=3)
    assert proposed(drafter, []) == [10, 11, 12]
    assert proposed(drafter, [10, 11]) == [12, 13, 14]
    assert proposed(drafter, [10, 11, 12, 13]) == [14]
    assert proposed(drafter, [10, 11, 12, 13, 14]) == []  # all of it written
    assert proposed(drafter, [10], k=0) == []


def test_after_a_change_it_goes_on_where_the_outputs_last_tokens_are_found_again():
    drafter = PredictionDrafter([10, 11, 12, 13, 14, 15, 16], prompt_tokens=3)
    assert proposed(drafter, [10, 11, 99]) == []  # the change: nothing to match
    assert proposed(drafter, [10, 11, 99, 12]) == []  # one token is not a match (min 2)
    assert proposed(drafter, [10, 11, 99, 12, 13]) == [14, 15, 16]
    assert proposed(drafter, [10, 11, 99, 98, 13, 14]) == [15, 16]  # a token replaced
    assert proposed(drafter, [10, 99, 11, 12]) == [13, 14, 15]  # a token inserted
    assert proposed(drafter, [10, 13, 14]) == [15, 16]  # tokens left out


def test_repeated_lines_are_followed_in_order():
    """The same two tokens at 0, 4 and 8: after a change the match nearest after the last
    proposal's place is taken, not the prediction's first or latest."""
    line = [7, 8]
    prediction = [*line, 20, 21, *line, 22, 23, *line, 24]
    drafter = PredictionDrafter(prediction, prompt_tokens=3)
    assert proposed(drafter, [7, 8, 20, 21, 7]) == [8, 22, 23]  # in step, no search
    assert proposed(drafter, [7, 8, 20, 21, 7, 8, 99, 7, 8]) == [24]  # past 22 23: the last
    drafter = PredictionDrafter(prediction, prompt_tokens=3)
    assert proposed(drafter, [5, 7, 8]) == [20, 21, 7]  # nothing proposed before: the first
    assert proposed(drafter, [5, 7, 8, 20, 21, 7, 8]) == [22, 23, 7]  # longest match wins


def test_min_ngram_is_checked_and_one_index_serves_several_drafters():
    with pytest.raises(ValueError, match="min_ngram"):
        Prediction([1, 2], min_ngram=0)
    indexed = Prediction([10, 11, 12, 13])
    first, second = PredictionDrafter(indexed, 3), PredictionDrafter(indexed, 3)
    assert proposed(first, [10, 99, 11, 12]) == [13]
    assert proposed(second, []) == [10, 11, 12]  # its own place in it


def test_with_prediction_puts_it_in_front_of_each_chain():
    assert with_prediction("none") == "prediction"
    assert with_prediction("lookup+model") == "prediction+lookup+model"
    assert with_prediction("model/eagle") == "prediction+model/prediction+eagle"
    assert with_prediction("prediction+model") == "prediction+model"


@pytest.mark.parametrize("runtime", ["float32", "int8", "int4"])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_decoding_with_a_prediction_is_plain_decoding(
    target_model, draft_model, runtime, temperature
):
    """The prediction: plain decoding's own output with a few tokens changed (an edit),
    in front of the draft model. Its drafts are accepted where it is right and rejected at
    the changes, and the output is plain decoding's, greedy and seeded (coupled)."""
    convert = {"int8": make_int8_batch_invariant, "int4": make_int4_batch_invariant}
    target, draft = target_model, draft_model
    if runtime in convert:  # on copies: the conversion changes a model in place
        make = convert[runtime]
        target, draft = make(copy.deepcopy(target_model)), make(copy.deepcopy(draft_model))
    prompt = random_ids(21, 9)
    params = SamplingParams(max_tokens=40, temperature=temperature, seed=6, ignore_eos=True)
    plain = Engine(backend(target)).generate(prompt, params)
    edited = list(plain.token_ids)
    edited[12:14] = [(t + 1) % 31 + 1 for t in edited[12:14]]  # a change
    del edited[25]  # and a token left out
    drafter = FallbackDrafter(
        [PredictionDrafter(edited, len(prompt)), ModelDrafter(backend(draft))]
    )
    out = Engine(backend(target), drafter).generate(prompt, params, SpecConfig(k=4))
    assert out.token_ids == plain.token_ids
    predicted = out.stats.by_drafter["prediction"]
    assert predicted["accepted"] >= 20, predicted  # half the output or more came from it
    assert predicted["drafted"] > predicted["accepted"], "no prediction draft rejected"
    assert out.stats.rounds < plain.stats.rounds / 3
    drafter = FallbackDrafter(
        [PredictionDrafter(edited, len(prompt)), ModelDrafter(backend(draft))]
    )
    adaptive = Engine(backend(target), drafter).generate(prompt, params, SpecConfig(k="auto"))
    assert adaptive.token_ids == plain.token_ids
