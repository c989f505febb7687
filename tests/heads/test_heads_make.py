"""``specdec heads make``: the plan's shares and the whole command on a tiny target."""

import json
import os
import signal
import time

import pytest

from specdec.cli import main
from specdec.heads import make
from specdec.heads.make import Progress, minutes_for, phases


def test_the_plan_runs_the_recipes_commands_in_order():
    plan = phases("eagle", ["src"], [".txt"], chat_prompts="p.jsonl", reply_tokens=64)
    assert [p.name for p in plan] == ["code", "chat", "train", "finish", "eval"]
    assert plan[0].argv == ("data", "--corpus", "src", "--suffix", ".txt")
    assert plan[1].argv == ("data", "--chat-prompts", "p.jsonl", "--reply-tokens", "64")
    assert plan[3].argv == ("train", "--kind", "eagle", "--distill-weight", "1.0")
    assert sum(p.share for p in plan) == pytest.approx(1.0) and plan[-1].share == 0
    compared = phases("eagle", compare=True)  # the default target: its draft model too
    assert [p.name for p in compared][-2:] == ["eval", "compare"]
    assert compared[-1].argv == ("eval", "--kind", "model") and compared[-1].share == 0
    medusa = phases("medusa", chat=False, length=64)
    assert [p.name for p in medusa] == ["code", "train", "eval"]
    assert medusa[0].argv == ("data", "--code", "--length", "64")  # the library completed
    with pytest.raises(ValueError, match="eagle or medusa"):
        phases("hydra")


def test_minutes_follow_the_shares_and_pass_on_what_a_phase_left():
    plan = phases("eagle")
    fresh = Progress("eagle")
    assert minutes_for(plan, fresh, 90, "code") == pytest.approx(18.0)
    # code data read its corpus to the end in 6 of its 18 minutes: the 12 left are shared
    # by the later phases in proportion to their shares (25 : 40 : 15)
    early = Progress("eagle", {"code": 6.0}, ["code"])
    assert minutes_for(plan, early, 90, "chat") == pytest.approx(84 * 25 / 80)
    # an interrupted phase gets the rest of its own share, not a new one
    cut = Progress("eagle", {"code": 18.0, "chat": 10.0}, ["code"])
    assert minutes_for(plan, cut, 90, "chat") == pytest.approx(12.5)
    # phases that overran take from the later ones; the budget is never exceeded
    over = Progress("eagle", {"code": 30.0, "chat": 30.0, "train": 29.0}, ["code", "chat"])
    assert minutes_for(plan, over, 90, "train") == pytest.approx(1.0 * 7 / (7 + 13.5))
    spent = Progress("eagle", {"code": 50.0, "chat": 45.0}, ["code", "chat"])
    assert minutes_for(plan, spent, 90, "train") == 0.0


def test_progress_is_saved_and_read_back(tmp_path):
    path = make.progress_path(tmp_path, "eagle")
    Progress("eagle", {"code": 1.5}, ["code"]).save(path)
    assert Progress.load(path, "eagle") == Progress("eagle", {"code": 1.5}, ["code"])
    assert Progress.load(path, "medusa") is None  # another kind's
    path.write_text("{not json")
    assert Progress.load(path, "eagle") is None
    assert Progress.load(tmp_path / "none.json", "eagle") is None


@pytest.fixture
def sources(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("the cat sat on the mat. a dog ran far, and the sun set.\n" * 40)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(f"tell me about the cat number {i}" for i in range(6)))
    return corpus, prompts


def _make_args(model_dir, corpus, prompts, minutes):
    return [
        "heads",
        "make",
        "--corpus",
        str(corpus),
        "--suffix",
        ".txt",
        "--chat-prompts",
        str(prompts),
        "--reply-tokens",
        "24",
        "--length",
        "32",
        "--minutes",
        str(minutes),
        "--target",
        str(model_dir),
        "--dtype",
        "float32",
    ]


def test_heads_make_end_to_end(tmp_path, model_dir, sources, capsys, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    corpus, prompts = sources
    assert main(_make_args(model_dir, corpus, prompts, 0.4)) == 0
    captured = capsys.readouterr()
    err = captured.err
    # each phase is announced as the command it runs
    assert f"[1/5] code data: specdec heads data --corpus {corpus} --suffix .txt --length 32" in err
    assert "[2/5] chat data: specdec heads data --chat-prompts" in err
    assert "[3/5] training: specdec heads train --kind eagle --minutes" in err
    assert "--restart" in err  # the first training of a make starts from nothing
    assert "--distill-weight 1.0 --minutes" in err
    assert err.count(f"--target {model_dir} --dtype float32\n") == 5  # each as it runs
    assert "made eagle heads: " in err
    (saved,) = (tmp_path / "cache" / "heads").glob("*/eagle.v*")  # the last training's, alone
    entry = saved.parent
    assert (saved / "config.json").exists()
    result = json.loads(captured.out)  # the evaluation, as 'heads eval' prints it
    assert result["drafter"] == "eagle" and result["held_out_chunks"] > 0
    state = json.loads((entry / "data" / "make-eagle.json").read_text())
    assert state["done"] == ["code", "chat", "train", "finish", "eval"]
    in_budget = sum(state["spent"][p] for p in ("code", "chat", "train", "finish"))
    # a phase begins no step or pass it cannot end in its minutes; writing its last one is over
    assert in_budget <= 0.4 + 0.05, state["spent"]
    # a second make has nothing to do
    assert main(_make_args(model_dir, corpus, prompts, 0.4)) == 0
    assert "eagle heads are made (--restart" in capsys.readouterr().err


def test_an_interrupted_make_continues_where_it_stopped(
    tmp_path, model_dir, sources, capsys, monkeypatch
):
    from specdec.heads import train

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    corpus, prompts = sources
    real = train.run_command
    calls = []

    def interrupted(args, *rest):
        calls.append(args.restart)
        if len(calls) == 1:  # terminated (a job killed, a timeout) while training
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the signal arrives at once; never reached
        return real(args, *rest)

    monkeypatch.setattr(train, "run_command", interrupted)
    before = signal.getsignal(signal.SIGTERM)  # another test's (Ray's) or the default
    args = _make_args(model_dir, corpus, prompts, 0.3)
    assert main(args) == 130
    saved = next((tmp_path / "cache" / "heads").glob("*/data/make-eagle.json"))
    state = json.loads(saved.read_text())
    assert state["done"] == ["code", "chat"] and "train" in state["spent"]
    capsys.readouterr()
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "continuing a make of eagle heads" in err and "code, chat done" in err
    assert "[1/5]" not in err and "[3/5] training" in err
    assert calls == [True, False, False]  # continued, not restarted, after the interruption
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is put back


def test_heads_make_errors_are_one_line_before_the_target_loads(
    tmp_path, model_dir, sources, capsys, monkeypatch
):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    corpus, prompts = sources
    base = _make_args(model_dir, corpus, prompts, 0.3)
    cases = [
        ([*base, "--minutes", "0"], "--minutes must be > 0"),
        ([*base, "--no-chat"], "--no-chat or --chat-prompts"),
        ([*base, "--reply-tokens", "0"], "--reply-tokens must be >= 1"),
        ([*base, "--corpus", str(tmp_path / "nope")], "does not exist"),
        ([*base, "--chat-prompts", str(tmp_path / "nope.txt")], "no such file"),
    ]
    for args, message in cases:
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


def test_a_spent_budget_skips_a_finished_share_and_stops_before_training(
    tmp_path, model_dir, sources, capsys, monkeypatch
):
    """A phase interrupted at the end of its share is passed over while the later phases
    have time; with the whole budget spent, a make stops in one line and continues when
    given more minutes. (Training and evaluation are recorded, not run: the orchestration
    is under test; the end-to-end test above runs them.)"""
    from specdec.heads import evaluate, train

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    ran = []
    monkeypatch.setattr(train, "run_command", lambda args, *rest: ran.append(args.minutes))
    monkeypatch.setattr(evaluate, "run_command", lambda args, *rest: ran.append("eval"))
    corpus, prompts = sources
    args = [*_make_args(model_dir, corpus, prompts, 0.3), "--data", str(tmp_path / "data")]
    path = make.progress_path(tmp_path / "data", "eagle")
    path.parent.mkdir()
    Progress("eagle", {"code": 0.3}, []).save(path)  # all of the budget, in code data
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "its share is spent" not in err and not ran  # nothing is left for anyone
    assert "budget of 0.3 minutes is spent" in err and "more --minutes" in err
    assert err.count("\n") == 2, err  # the line saying where it continues, and the error
    # with more minutes it continues: code data gets the rest of its share (0.2 of 2.0)
    assert main([*args, "--minutes", "2.0"]) == 0
    err = capsys.readouterr().err
    assert "[1/5] code data: specdec heads data" in err and "--minutes 0.10" in err
    assert Progress.load(path, "eagle").done == ["code", "chat", "train", "finish", "eval"]
    assert len(ran) == 3 and ran[-1] == "eval"
    # an unreadable progress file is said, and the make starts over
    path.write_text("{cut")
    assert main(args) == 0
    assert "unreadable progress, the make starts over" in capsys.readouterr().err
    # its share already spent, with time left for the others: passed over
    Progress("eagle", {"code": 0.5}, []).save(path)
    assert main([*args, "--minutes", "2.0"]) == 0
    err = capsys.readouterr().err
    assert "code data: its share is spent" in err and "[1/5]" not in err
    assert "[2/5] chat data" in err


def test_for_the_default_target_the_draft_model_is_evaluated_too(
    tmp_path, model_dir, sources, capsys, monkeypatch
):
    """So that --drafter auto compares heads and draft model by measurement, a make for the
    default target ends with 'heads eval --kind model' (outside the budget); a rerun of a
    make done before that phase existed runs just it. (Training and evaluation recorded.)"""
    from specdec.heads import command, evaluate, train

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(command, "DEFAULT_TARGET", str(model_dir))  # the tiny one, here
    ran = []
    monkeypatch.setattr(train, "run_command", lambda args, *rest: ran.append("train"))
    monkeypatch.setattr(evaluate, "run_command", lambda args, *rest: ran.append(args.kind))
    corpus, prompts = sources
    args = [*_make_args(model_dir, corpus, prompts, 0.3), "--data", str(tmp_path / "data")]
    path = make.progress_path(tmp_path / "data", "eagle")
    path.parent.mkdir()
    done = ["code", "chat", "train", "finish", "eval"]
    Progress("eagle", {"code": 0.1, "chat": 0.1, "train": 0.1}, done).save(path)
    assert main(args) == 0
    err = capsys.readouterr().err
    assert ran == ["model"]
    assert "[6/6] the draft model's evaluation, for --drafter auto" in err
    assert "specdec heads eval --kind model --dtype float32" in err
    assert Progress.load(path, "eagle").done == [*done, "compare"]
