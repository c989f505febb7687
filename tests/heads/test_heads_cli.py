"""specdec heads on a tiny model directory: data, train, eval end to end; one-line errors."""

from __future__ import annotations

import json

from specdec.cli import main
from specdec.heads.nets import KINDS
from specdec.heads.train import training_precision


def test_heads_cli_end_to_end(tmp_path, model_dir, capsys, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    words = "the cat sat on the mat. a dog ran far, and the sun set.\n"
    (corpus / "a.txt").write_text(words * 40)
    common = ["--target", str(model_dir), "--dtype", "float32"]
    assert (
        main(
            [
                "heads",
                "data",
                "--corpus",
                str(corpus),
                "--suffix",
                ".txt",
                "--length",
                "32",
                *common,
            ]
        )
        == 0
    )
    assert "chunks of 32 tokens" in capsys.readouterr().err
    for kind in KINDS:
        unroll = ["--unroll", "2", "--learning-rate", "0.002"] if kind == "eagle" else []
        assert main(["heads", "train", "--kind", kind, "--minutes", "0.1", *unroll, *common]) == 0
        assert "saved" in (err := capsys.readouterr().err)
        assert ("unroll 2" in err) == (kind == "eagle"), err
        saved = next((tmp_path / "cache" / "heads").glob(f"*/{kind}.v*/config.json"))
        training = json.loads(saved.read_text())["training"]
        assert training["learning_rate"] == (0.002 if kind == "eagle" else 1e-3)  # as asked
        assert training.get("init") == ("target" if kind == "eagle" else None)  # the default
        assert main(["heads", "eval", "--kind", kind, "--max-k", "3", *common]) == 0
        result = json.loads(capsys.readouterr().out)
        assert len(result["acceptance_by_position"]) == 3 and result["c_per_draft"] > 0
        # and on the target's replies to the shipped unseen prompts, kept for the next eval
        # (those that fit the tiny target's context of 256 tokens: its tokenizer's tokens
        # are short, and the long edit and summary prompts do not)
        unseen = result["unseen_prompts"]
        kept = next((tmp_path / "cache" / "heads").glob("*/data/unseen-replies-float32.json"))
        replies = json.loads(kept.read_text())["replies"]
        assert unseen["prompts"] == len(replies) >= 3 and "unseen-code-0" in replies
        assert len(unseen["acceptance_by_position"]) == 3 and unseen["predicted_speedup"] > 0
        assert {"code", "chat"} <= set(unseen["by_kind"]) <= {"code", "chat", "edit", "summary"}
        # --positions: every held-out chunk drafts from that many positions (first draft)
        assert main(["heads", "eval", "--kind", kind, "--positions", "5", *common]) == 0
        result = json.loads(capsys.readouterr().out)
        assert result["trials_by_position"][0] == 5 * result["held_out_chunks"]
        assert main(["heads", "eval", "--kind", kind, "--positions", "0", *common]) == 2
        err = capsys.readouterr().err
        assert "--positions must be >= 1" in err and err.count("\n") == 1, err
    model_eval = ["--kind", "model", "--draft", str(model_dir), "--draft-runtime", "transformers"]
    assert main(["heads", "eval", *model_eval, "--max-k", "3", *common]) == 0
    assert json.loads(capsys.readouterr().out)["drafter"].startswith("model-transformers")
    assert main(["heads", "list"]) == 0
    listing = capsys.readouterr().out
    assert "medusa" in listing and "eagle" in listing and "predicted speedup" in listing
    assert "on replies to unseen prompts" in listing
    assert f"min ({training_precision()}), unroll 2" in listing  # EAGLE with --unroll 2

    outputs = {}
    for drafter in ("none", "medusa", "lookup+eagle"):
        args = ["generate", "the cat", "--drafter", drafter, "--max-tokens", "16", "--raw"]
        assert main([*args, "-k", "3", "--json", *common]) == 0
        outputs[drafter] = json.loads(capsys.readouterr().out)["token_ids"]
    assert outputs["medusa"] == outputs["none"] == outputs["lookup+eagle"]
    # The default drafter, auto, names its choice once heads are evaluated.
    auto = [
        "generate",
        "the cat",
        "--max-tokens",
        "8",
        "--raw",
        "--json",
        "--draft",
        str(model_dir),
    ]
    assert main([*auto, "--draft-runtime", "transformers", *common]) == 0
    assert "drafter auto -> " in capsys.readouterr().err
    # Where auto picks the draft model, a prompt of LONG_PROMPT tokens or more (a character
    # a token here) drafts with the heads predicted fastest, prompt lookup in front
    from specdec.heads import store
    from specdec.heads.load import LONG_PROMPT

    (entry,) = (tmp_path / "cache" / "heads").iterdir()
    for kind, speedup in (("model", 1.5), ("eagle", 1.3), ("medusa", 0.9)):
        store.save_eval(entry, kind, {"predicted_speedup": speedup}, "float32")
    long_prompt = ("the cat sat on the mat. " * 8)[: LONG_PROMPT + 8]
    for prompt, picked in (("the cat", "lookup+model"), (long_prompt, "lookup+eagle")):
        at = auto.index("the cat")
        args = [*auto[:at], prompt, *auto[at + 1 :], "--draft-runtime", "transformers"]
        assert main([*args, *common]) == 0
        err = capsys.readouterr().err
        assert f"drafter auto -> {picked} (" in err, err
        assert (f"tokens (>= {LONG_PROMPT})" in err) == (picked == "lookup+eagle"), err
    # --unroll, with data at hand: Medusa refuses it, and it is bounded
    for args, message in [
        (["--kind", "medusa", "--unroll", "2"], "--unroll is for EAGLE"),
        (["--kind", "eagle", "--unroll", "0"], "--unroll must be in 1..8"),
    ]:
        assert main(["heads", "train", *args, "--minutes", "0.03", *common]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    # --init random starts over from random weights, and a checkpoint keeps its start
    train = ["heads", "train", "--kind", "eagle", "--minutes", "0.1", *common]
    assert main([*train, "--init", "random", "--restart"]) == 0
    saved = next((tmp_path / "cache" / "heads").glob("*/eagle.v*/config.json"))
    assert json.loads(saved.read_text())["training"]["init"] == "random"
    capsys.readouterr()
    assert main([*train, "--init", "target"]) == 2
    err = capsys.readouterr().err
    assert "--init target (it started random)" in err and err.count("\n") == 1, err


def test_heads_dtype_defaults_to_the_runtime_generate_chooses(
    tmp_path, model_dir, capsys, monkeypatch
):
    """Without --dtype the heads commands run the target on the runtime 'specdec generate'
    picks for it here (target runtime auto), so the features are the ones drafting reads."""
    import specdec.runtime

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    asked = []

    def chosen(choice, target, cache_dir=None, progress=None, dtype=None):
        asked.append((choice, target, dtype))
        return "bfloat16"

    monkeypatch.setattr(specdec.runtime, "choose_target_runtime", chosen)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("the cat sat on the mat.\n" * 40)
    data = ["heads", "data", "--corpus", str(corpus), "--suffix", ".txt", "--length", "32"]
    assert main([*data, "--target", str(model_dir)]) == 0
    assert asked == [("auto", str(model_dir), None)]
    assert "the target on bfloat16" in capsys.readouterr().err
    assert main([*data, "--target", str(model_dir), "--dtype", "float32"]) == 0
    assert len(asked) == 1  # a given --dtype is used as it is
    assert "the target on float32" in capsys.readouterr().err


def test_heads_cli_errors_are_one_line(tmp_path, model_dir, capsys, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    common = ["--target", str(model_dir), "--dtype", "float32"]
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [
        (["heads", "data", "--corpus", str(empty), *common], "no .py files"),
        (["heads", "data", "--corpus", str(tmp_path / "nope"), *common], "does not exist"),
        (["heads", "data", "--minutes", "0", *common], "--minutes must be > 0"),
        (["heads", "train", "--kind", "eagle", *common], "no heads data"),
        (["heads", "train", "--kind", "eagle", "--distill-every", "0", *common], "1..64"),
        (["heads", "train", "--kind", "medusa", "--distill-every", "2", *common], "for EAGLE"),
        (["heads", "eval", "--kind", "medusa", *common], "no medusa heads trained"),
        (["generate", "hi", "--drafter", "eagle", *common], "no eagle heads trained"),
    ]
    for args, message in cases:
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


def test_a_budget_too_small_to_train_is_one_line_and_loses_nothing(
    tmp_path, model_dir, capsys, monkeypatch
):
    """Fewer steps than the warm-up are not saved as trained heads: one line, exit 2, and a
    rerun with more minutes continues from those steps (the checkpoint keeps them)."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    common = ["--target", str(model_dir), "--dtype", "float32"]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("the cat sat on the mat. a dog ran far.\n" * 40)
    data = ["heads", "data", "--corpus", str(corpus), "--suffix", ".txt", "--length", "32"]
    assert main([*data, *common]) == 0
    capsys.readouterr()
    train = ["heads", "train", "--kind", "medusa", *common]
    assert main([*train, "--minutes", "0.00001"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress line
    assert last.startswith("specdec: error: ") and "step" in last and "too few" in last, last
    assert not list((tmp_path / "cache" / "heads").glob("*/medusa/config.json"))
    assert main(["heads", "eval", "--kind", "medusa", *common]) == 2
    assert "no medusa heads trained" in capsys.readouterr().err
    # settings the checkpoint was not started with: refused, not ignored; nothing lost
    assert main([*train, "--minutes", "0.03", "--num-heads", "3"]) == 2
    said = capsys.readouterr().err
    assert "--num-heads 3 (it has 4)" in said, said
    assert "--restart" in said and said.count("\n") == 1, said
    assert main([*train, "--minutes", "0.1"]) == 0
    assert "continuing from a checkpoint" in capsys.readouterr().err


def test_heads_arguments_are_checked_before_the_target_loads(tmp_path, capsys, monkeypatch):
    """A bad value of a subcommand's own argument is one line at once, not after the
    seconds a target takes to load (and to be timed, for --dtype auto)."""
    import specdec.loading
    import specdec.runtime

    def never(*args, **kwargs):
        raise AssertionError("the target was loaded before the arguments were checked")

    monkeypatch.setattr(specdec.loading, "load_backend", never)
    monkeypatch.setattr(specdec.runtime, "choose_target_runtime", never)
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    cases = [
        (["heads", "data", "--length", "8"], "--length must be >= 16"),
        (["heads", "data", "--chat", "--corpus", "x"], "give one of --corpus, --chat"),
        (["heads", "train", "--kind", "eagle", "--minutes", "0"], "--minutes must be > 0"),
        (["heads", "train", "--kind", "eagle", "--learning-rate", "0"], "--learning-rate must"),
        (["heads", "train", "--kind", "medusa", "--unroll", "2"], "--unroll is for EAGLE"),
        (["heads", "train", "--kind", "medusa", "--init", "target"], "--init is for EAGLE"),
        (["heads", "eval", "--kind", "eagle", "--max-k", "0"], "--max-k must be in 1..16"),
        (["heads", "eval", "--kind", "eagle", "--positions", "0"], "--positions must be >= 1"),
    ]
    for args, message in cases:
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
