"""Heads in the server per request, evaluation, and --drafter auto's choice."""

from __future__ import annotations

import copy

from helpers import backend, tiny_llama
from specdec.backends.quant.convert import make_int8_batch_invariant
from specdec.heads import store
from specdec.heads.fingerprint import target_fingerprint
from specdec.heads.nets import KINDS

# ---- the server and --drafter auto --------------------------------------------------------


def test_server_drafts_with_heads_per_request(target_model, tokenizer, trained):
    from servers import MODEL, Running, post

    heads = {kind: trained[kind][0] for kind in KINDS}
    running = Running(target_model, None, tokenizer, heads=heads, max_active=4)
    try:
        body = {"model": MODEL, "prompt": "the cat", "max_tokens": 20, "temperature": 0}
        status, plain = post(running, "/v1/completions", body | {"drafter": "none"})
        assert status == 200
        for drafter in ("medusa", "eagle", "lookup+eagle"):
            status, result = post(running, "/v1/completions", body | {"drafter": drafter})
            assert status == 200, result
            assert result["choices"][0]["text"] == plain["choices"][0]["text"]
            assert result["spec_stats"]["drafted_tokens"] > 0
        # A choice (k auto), twice: one controller for the recipe learns over both requests,
        # each member drafting (adaptive k may stop drafting on so cheap a target later).
        choice = body | {"drafter": "medusa/eagle", "num_speculative_tokens": "auto"}
        drafted = 0
        for _ in range(2):
            status, result = post(running, "/v1/completions", choice)
            assert status == 200, result
            assert result["choices"][0]["text"] == plain["choices"][0]["text"]
            drafted += result["spec_stats"]["drafted_tokens"]
        assert drafted > 0
        members = running.scheduler.controllers["medusa/eagle@8"].controllers
        assert all(c.rounds >= 2 for c in members.values())
        status, error = post(running, "/v1/completions", body | {"drafter": "model"})
        assert status == 400 and "eagle" in error["error"]["message"]
        fixed = body | {"drafter": "medusa/eagle", "num_speculative_tokens": 3}
        status, error = post(running, "/v1/completions", fixed)
        assert status == 400 and "must be 'auto'" in error["error"]["message"]
    finally:
        running.close()


def test_heads_draft_after_a_prompt_prefilled_in_parts(target_model, tokenizer, trained):
    """On a batched (int8) target a joining prompt is prefilled in parts of 4 tokens a step,
    the heads' ``prepare`` called on longer prefixes (reading the target's kept features):
    every drafter's output is still plain decoding's, and the heads draft."""
    from servers import MODEL, Running, post

    target = make_int8_batch_invariant(copy.deepcopy(target_model))
    heads = {kind: trained[kind][0] for kind in KINDS}
    running = Running(target, None, tokenizer, heads=heads, max_active=4, prefill_rows=4)
    try:
        assert running.scheduler.batched is not None
        prompt = "the cat sat on the mat and the dog sat on the cat"
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 20, "temperature": 0}
        status, plain = post(running, "/v1/completions", body | {"drafter": "none"})
        assert status == 200, plain
        for drafter in ("medusa", "eagle", "lookup+eagle"):
            status, result = post(running, "/v1/completions", body | {"drafter": drafter})
            assert status == 200, result
            assert result["choices"][0]["text"] == plain["choices"][0]["text"], drafter
            assert result["spec_stats"]["drafted_tokens"] > 0, drafter
    finally:
        running.close()


def test_eval_predicts_every_k_from_its_own_pass_and_keeps_the_best():
    """Acceptance 0.5 at every position, c = 0.05 a draft, passes of 2..5 tokens at 1.1,
    1.3, 2.0, 2.6 steps (a convex int4-like curve): k = 1 gives 1.5 / 1.15, k = 2 gives
    1.75 / 1.4; the prediction is the best k's, not max_k's."""
    from specdec.heads.evaluate import Agreement, summarize

    agree = Agreement([50, 25, 12, 6], [100, 50, 24, 12])
    timing = {
        "step_s": 0.02,
        "pass_s": {2: 0.022, 3: 0.026, 4: 0.040, 5: 0.052},
        "chain_s": 0.004,  # 4 drafts at 0.001 s: c = 0.05
    }
    result = summarize(agree, timing, 4)
    expected = [1.5 / 1.15, 1.75 / 1.4, 1.875 / 2.15, 1.9375 / 2.8]
    assert result["predicted_speedup_by_k"] == [round(x, 3) for x in expected]
    assert result["best_k"] == 1 and result["predicted_speedup"] == round(1.5 / 1.15, 3)
    assert result["v"] == 2.6 and result["c_per_draft"] == 0.05


def test_reply_agreement_drafts_from_the_first_reply_token_on():
    """Hand-built: a drafter that gets the text right but for one token, against a target
    whose argmax is the text (a greedy reply). Drafting starts once the prompt and the reply's
    first token (the prefill's) are known, and each chain stops at its first rejection."""
    import torch
    from torch import nn

    from specdec.drafters.base import Proposal
    from specdec.heads.evaluate import Reply, reply_agreement

    tokens = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]  # prompt 10 11, reply from 12
    features = torch.nn.functional.one_hot(torch.tensor(tokens[1:]), 20).float()

    class Target:
        vocab_size = 20
        model = type("M", (), {"get_output_embeddings": lambda self: nn.Identity()})()

    class Drafter:
        def propose(self, context, k):
            truth = tokens[len(context) : len(context) + k]
            return Proposal([0 if t == 15 else t for t in truth])  # always wrong at 15

    reply = Reply("code", tokens, features, start=2)
    agree = reply_agreement(lambda stored: Drafter(), Target(), [reply], max_k=2)
    # drafts from index 3 on: (13 14) (14 x) (x) (16 17) (17 18), x the wrong 15
    assert agree.trials == [5, 4] and agree.accepted == [4, 3]


def test_unseen_replies_fit_the_targets_context(tmp_path, target_model, tokenizer):
    """A reply ends where the target's context does; a prompt without room for one is left
    out (and with none left, heads eval reports no prediction on unseen prompts)."""
    from specdec.heads.evaluate import MIN_REPLY, unseen_replies

    target = backend(target_model, tokenizer)
    target.max_length = 120  # the character tokenizer's code prompts: 50-90 tokens
    replies = unseen_replies(target, tmp_path, "float32", reply_tokens=400)
    assert replies and all(len(r.tokens) <= target.max_length for r in replies)
    assert all(r.features.shape[0] == len(r.tokens) - 1 for r in replies)
    assert all(len(r.tokens) - r.start >= 1 for r in replies)
    target.max_length = MIN_REPLY  # no prompt leaves room for a reply
    assert unseen_replies(target, tmp_path / "small", "float32", reply_tokens=400) == []


def test_auto_picks_the_best_evaluated_drafter(tmp_path, target_model, trained):
    from specdec.heads.load import NO_HEADS, auto_recipe

    target = backend(target_model)
    fingerprint = target_fingerprint(target_model)
    entry = store.entry_dir(str(tmp_path), fingerprint, "tiny")
    assert auto_recipe(target, str(tmp_path), "tiny") == ("lookup+model", NO_HEADS)
    assert auto_recipe(target, str(tmp_path), "tiny", lookup_in_front=False)[0] == "model"
    heads, _ = trained["eagle"]
    store.save(entry, "eagle", heads.config.to_dict() | {"fingerprint": fingerprint}, {})
    store.save_eval(entry, "eagle", {"predicted_speedup": 0.9})
    recipe, why = auto_recipe(target, str(tmp_path), "tiny")
    assert recipe == "lookup+model" and "0.90x" in why  # heads predicted slower than plain
    # Heads predicted faster than plain, the draft model never evaluated: nothing says which
    # is faster, so both, chosen round by round (the heads alone without a choice). Prompt
    # lookup goes in front of one drafter, not of a choice.
    store.save_eval(entry, "eagle", {"predicted_speedup": 1.05})
    recipe, why = auto_recipe(target, str(tmp_path), "tiny")
    assert recipe == "model/eagle" and "draft model not evaluated" in why
    assert auto_recipe(target, str(tmp_path), "tiny", can_choose=False)[0] == "lookup+eagle"
    store.save_eval(entry, "eagle", {"predicted_speedup": 0.9})
    store.save_eval(entry, "model", {"predicted_speedup": 0.8})
    # Heads predicted fastest, the draft model evaluated too: the heads alone (a choice of
    # both ran behind the faster alone), whether or not a choice could be made.
    assert auto_recipe(target, str(tmp_path), "tiny")[0] == "lookup+eagle"
    assert auto_recipe(target, str(tmp_path), "tiny", can_choose=False)[0] == "lookup+eagle"
    store.save_eval(entry, "eagle", {"predicted_speedup": 2.1})
    store.save_eval(entry, "model", {"predicted_speedup": 1.6})
    recipe, why = auto_recipe(target, str(tmp_path), "tiny")
    assert recipe == "lookup+eagle" and "eagle 2.10x, model 1.60x" in why
    assert "--systems lookup+model-auto,lookup+eagle-auto" in why  # how to check it
    # serve's auto leaves lookup out (it ran behind under load on chat)
    assert auto_recipe(target, str(tmp_path), "tiny", lookup_in_front=False)[0] == "eagle"
    # Predictions on the target's replies to unseen prompts are compared where every
    # drafter has one (the held-out chunks are the heads' own sources and favour them)
    unseen = {"unseen_prompts": {"predicted_speedup": 1.2}}
    store.save_eval(entry, "eagle", {"predicted_speedup": 2.1} | unseen)
    recipe, why = auto_recipe(target, str(tmp_path), "tiny")
    assert recipe == "lookup+eagle" and "again predicts on unseen prompts" in why  # model's old
    store.save_eval(
        entry, "model", {"predicted_speedup": 1.6, "unseen_prompts": {"predicted_speedup": 1.5}}
    )
    recipe, why = auto_recipe(target, str(tmp_path), "tiny")
    assert recipe == "lookup+model" and "replies to unseen prompts" in why
    assert "eagle 1.20x, model 1.50x" in why
    store.save_eval(entry, "eagle", {"predicted_speedup": 2.1})
    store.save_eval(entry, "model", {"predicted_speedup": 1.6})
    store.save_eval(entry, "medusa", {"predicted_speedup": 3.0})  # evaluated, then deleted
    assert auto_recipe(target, str(tmp_path), "tiny", can_choose=False)[0] == "lookup+eagle"
    store.save_eval(entry, "model", {"predicted_speedup": 2.5})
    recipe, why = auto_recipe(target, str(tmp_path), "tiny")
    assert recipe == "lookup+model" and "--workload-file" not in why  # the model kept: no hint


def test_auto_compares_drafters_over_one_verify_cost_curve(tmp_path, target_model, trained):
    """Each evaluation timed the target's passes at its own moment; compared, the drafters'
    predictions are recomputed over the median curve of the two, from each one's acceptance
    and draft cost. Here the heads' evaluation timed its passes in a quiet moment (v(2) 0.95):
    by their own curves the heads come first (1.47x against 1.23x), by the shared one the
    draft model (1.39x against 1.26x)."""
    from specdec.heads.load import auto_recipe

    target = backend(target_model)
    fingerprint = target_fingerprint(target_model)
    entry = store.entry_dir(str(tmp_path), fingerprint, "tiny")
    heads, _ = trained["eagle"]
    store.save(entry, "eagle", heads.config.to_dict() | {"fingerprint": fingerprint}, {})
    eagle = {"acceptance_by_position": [0.5, 0.3], "c_per_draft": 0.07}
    model = {"acceptance_by_position": [0.85, 0.85], "c_per_draft": 0.3}
    store.save_eval(entry, "eagle", eagle | {"predicted_speedup": 1.47})
    store.save_eval(entry, "model", model | {"predicted_speedup": 1.23})
    assert auto_recipe(target, str(tmp_path), "tiny")[0] == "lookup+eagle"  # no curves saved
    store.save_eval(
        entry, "eagle", eagle | {"predicted_speedup": 1.47, "v_by_size": {"2": 0.95, "3": 1.0}}
    )
    assert auto_recipe(target, str(tmp_path), "tiny")[0] == "lookup+eagle"  # one curve only
    store.save_eval(
        entry, "model", model | {"predicted_speedup": 1.23, "v_by_size": {"2": 1.3, "3": 1.5}}
    )
    recipe, why = auto_recipe(target, str(tmp_path), "tiny")
    assert recipe == "lookup+model" and "eagle 1.26x, model 1.39x" in why


def test_auto_gives_a_long_prompt_the_heads_where_it_picks_the_draft_model(
    tmp_path, target_model, trained
):
    """From LONG_PROMPT tokens on, generate's auto drafts with the heads and prompt lookup
    in front where it would take the draft model; the reason says so. A shorter prompt,
    heads predicted no faster than plain, and serve (no lookup in front) keep the choice
    made without the prompt's length."""
    from specdec.heads.load import LONG_PROMPT, NO_HEADS, auto_recipe

    target = backend(target_model)
    fingerprint = target_fingerprint(target_model)
    entry = store.entry_dir(str(tmp_path), fingerprint, "tiny")
    long = {"prompt_tokens": LONG_PROMPT}
    assert auto_recipe(target, str(tmp_path), "tiny", **long) == ("lookup+model", NO_HEADS)
    heads, _ = trained["eagle"]
    store.save(entry, "eagle", heads.config.to_dict() | {"fingerprint": fingerprint}, {})
    store.save_eval(entry, "eagle", {"predicted_speedup": 1.3})
    store.save_eval(entry, "model", {"predicted_speedup": 1.5})
    assert auto_recipe(target, str(tmp_path), "tiny")[0] == "lookup+model"
    short = auto_recipe(target, str(tmp_path), "tiny", prompt_tokens=LONG_PROMPT - 1)
    assert short[0] == "lookup+model"
    recipe, why = auto_recipe(target, str(tmp_path), "tiny", **long)
    assert recipe == "lookup+eagle" and f"a prompt of {LONG_PROMPT} tokens" in why
    assert "eagle 1.30x, model 1.50x" in why  # the predictions still shown
    assert auto_recipe(target, str(tmp_path), "tiny", lookup_in_front=False, **long)[0] == "model"
    store.save_eval(entry, "eagle", {"predicted_speedup": 1.0})  # no faster than plain
    assert auto_recipe(target, str(tmp_path), "tiny", **long)[0] == "lookup+model"
    store.save_eval(entry, "eagle", {"predicted_speedup": 2.0})  # the heads picked anyway
    assert auto_recipe(target, str(tmp_path), "tiny", **long)[0] == "lookup+eagle"


def test_auto_uses_the_evaluations_made_with_the_targets_runtime(tmp_path, trained):
    """An int4 step costs about half an int8 one, so c and v (and the predictions) differ
    by runtime: an int4 target goes by evaluations made with an int4 target, and by the
    int8 ones (saying so) only where no heads were evaluated with int4."""
    from specdec.backends.quant.convert import make_int4_batch_invariant
    from specdec.heads.load import auto_recipe
    from specdec.runtime import model_runtime as target_runtime

    model = make_int4_batch_invariant(tiny_llama(seed=0))
    assert target_runtime(model) == "int4"
    assert target_runtime(tiny_llama(seed=0)) == "float32"
    assert target_runtime(make_int8_batch_invariant(tiny_llama(seed=0))) == "int8"
    target = backend(model)
    fingerprint = target_fingerprint(model)
    entry = store.entry_dir(str(tmp_path), fingerprint, "tiny")
    heads, _ = trained["eagle"]
    store.save(entry, "eagle", heads.config.to_dict() | {"fingerprint": fingerprint}, {})
    store.save_eval(entry, "eagle", {"predicted_speedup": 1.2})
    store.save_eval(entry, "model", {"predicted_speedup": 1.5})
    recipe, why = auto_recipe(target, str(tmp_path), "tiny")
    assert (
        recipe == "lookup+model" and "(int8 target, " in why and "eagle 1.20x, model 1.50x" in why
    )
    store.save_eval(entry, "eagle", {"predicted_speedup": 1.4}, "int4")
    store.save_eval(entry, "model", {"predicted_speedup": 1.1}, "int4")
    recipe, why = auto_recipe(target, str(tmp_path), "tiny", can_choose=False)
    assert (
        recipe == "lookup+eagle" and "(int4 target, " in why and "eagle 1.40x, model 1.10x" in why
    )
    listing = "\n".join(store.list_entries(str(tmp_path)))
    assert "int4 target" in listing and "int8 target" in listing
    # Heads trained again: their old evaluations (every runtime) no longer count.
    store.save(entry, "eagle", heads.config.to_dict() | {"fingerprint": fingerprint}, {})
    assert sorted(store.read_evals(entry)) == [("model", "int4"), ("model", "int8")]
    assert auto_recipe(target, str(tmp_path), "tiny")[0] == "lookup+model"
