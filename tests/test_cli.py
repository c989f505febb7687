"""The CLI on two local model directories (tiny models saved by the test)."""

import json
import re
import statistics
import subprocess
import sys

import pytest

from helpers import VOCAB, fim_tokenizer, perturbed_copy, tiny_llama
from specdec.cli import main
from specdec.prompting import fim_ids


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Runtime forms of the tiny models go to a temporary cache, not the user's."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory, target_model, draft_model, tokenizer):
    root = tmp_path_factory.mktemp("models")
    for name, model in (("target", target_model), ("draft", draft_model)):
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return root / "target", root / "draft"


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "specdec.cli", *args], capture_output=True, text=True
    )


def exit_code(args) -> int:
    """main() in-process; argparse errors leave through SystemExit."""
    try:
        return main(args)
    except SystemExit as leaving:
        return leaving.code


@pytest.mark.parametrize("tree", ["full", "auto"])
def test_generate_with_a_draft_tree_is_plain_decodings_text(model_dirs, capsys, tree):
    target, draft = model_dirs
    args = ["generate", "hello", "--target", str(target), "--draft", str(draft)]
    args += ["--drafter", "model", "--tree", tree, "--max-tokens", "24", "--dtype", "int8"]
    assert main([*args, "--json", "--compare"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["compare"]["identical"] is True
    assert result["stats"]["drafted_tokens"] > 0
    if tree == "full":
        assert result["stats"]["sibling_tokens"] > 0


def test_compare_runs_measures_pairs_side_by_side(model_dirs, capsys):
    """--compare-runs N: N (speculative, plain) pairs, the speedup their median, each pair
    identical; on the terminal the median and range; N implies --compare; 0 is refused."""
    target, draft = model_dirs
    args = ["generate", "hello", "--target", str(target), "--draft", str(draft)]
    args += ["--max-tokens", "16", "--dtype", "int8", "-k", "3"]
    assert main([*args, "--json", "--compare-runs", "3"]) == 0
    compare = json.loads(capsys.readouterr().out)["compare"]
    assert len(compare["speedups"]) == 3 and all(x > 0 for x in compare["speedups"])
    assert compare["speedup"] == statistics.median(compare["speedups"])
    assert compare["identical"] is True
    assert main([*args, "--compare", "--compare-runs", "2"]) == 0
    printed = capsys.readouterr().err
    assert "median of 2)" in printed and "identical to plain decoding" in printed
    assert exit_code([*args, "--compare-runs", "0"]) == 2
    assert "expected 1 or more" in capsys.readouterr().err


def test_summary_lines_stay_whole_on_a_narrow_console(model_dirs, capsys, monkeypatch):
    """The summary and the comparison are one line each on stderr however narrow the
    console (a log reader greps them); the terminal wraps them, not specdec."""
    target, draft = model_dirs
    monkeypatch.setenv("COLUMNS", "40")
    args = ["generate", "hello", "--target", str(target), "--draft", str(draft)]
    assert main([*args, "--max-tokens", "8", "--dtype", "int8", "-k", "2", "--compare"]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert any("tok/s" in line and "finish:" in line for line in lines), lines
    assert any("plain decoding:" in line and "identical" in line for line in lines), lines


def test_generate_json(model_dirs, capsys):
    target, draft = model_dirs
    code = main(
        [
            "generate",
            "hello",
            "--target",
            str(target),
            "--draft",
            str(draft),
            "-k",
            "3",
            "--max-tokens",
            "20",
            "--dtype",
            "float32",
            "--json",
        ]
    )
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) == {"text", "token_ids", "finish_reason", "stats"}
    assert len(result["token_ids"]) <= 20
    for field in (
        "drafted_tokens",
        "accepted_tokens",
        "rounds",
        "target_forwards",
        "acceptance_rate",
        "mean_accepted_length",
        "per_position_acceptance",
        "drafter_seconds",
        "target_seconds",
        "overhead_seconds",
        "tokens_per_second",
    ):
        assert field in result["stats"]
    plain = main(
        [
            "generate",
            "hello",
            "--target",
            str(target),
            "--drafter",
            "none",
            "--max-tokens",
            "20",
            "--dtype",
            "float32",
            "--json",
        ]
    )
    assert plain == 0
    assert json.loads(capsys.readouterr().out)["token_ids"] == result["token_ids"]


def test_generate_streams_text_and_a_summary(model_dirs):
    target, draft = model_dirs
    done = run_cli(
        "generate",
        "hello",
        "--target",
        str(target),
        "--draft",
        str(draft),
        "--max-tokens",
        "12",
        "--temperature",
        "0.8",
        "--top-p",
        "0.9",
    )
    assert done.returncode == 0, done.stderr
    assert "tok/s" in done.stderr and "acceptance" in done.stderr


def test_show_drafts_colours(model_dirs, capsys):
    target, draft = model_dirs
    assert (
        main(
            [
                "generate",
                "hello",
                "--target",
                str(target),
                "--draft",
                str(draft),
                "--max-tokens",
                "12",
                "--show-drafts",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.strip()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--temperature", "-1"], "temperature"),
        (["--top-p", "2"], "top_p"),
        (["-k", "-2"], "k must be"),
        (["--max-tokens", "0"], "max_tokens"),
        (["--dtype", "float8"], "invalid choice"),
        (["--top-k", "-1"], "top_k"),
        (["--drafter", "magic"], "use none, a"),
        (["--drafter", "ngram"], "--ngram-model"),
        (["--drafter", "model/lookup", "-k", "3"], "use -k auto"),
        (["--drafter", "model/model"], "each choice once"),
        (["--target-runtime", "llamacpp:q9"], "unknown runtime"),
        (["--draft-runtime", "fp16"], "unknown runtime"),
        (["--drafter", "lookup", "--tree", "full"], "use --drafter model"),
        (["--drafter", "lookup+eagle", "--tree", "auto"], "use --drafter model"),
        (["--tree", "bushy"], "invalid choice"),
    ],
)
def test_bad_arguments_give_one_line_and_exit_2(model_dirs, args, message, capsys):
    target, _ = model_dirs
    assert exit_code(["generate", "hello", "--target", str(target), *args]) == 2
    stderr = capsys.readouterr().err
    assert message in stderr
    assert len(stderr.strip().splitlines()) == 1, stderr


def test_missing_model_directory(tmp_path):
    done = run_cli("generate", "hi", "--target", str(tmp_path / "nope"), "--drafter", "none")
    assert done.returncode == 2 and "neither a catalog model" in done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "prompt, is_code",
    [
        ("def quicksort(arr):", True),
        ("import os\n", True),
        ("# sort a list\n", True),
        ("for x in range(3):", True),
        ("Explain recursion to a child.", False),
        ("What is the capital of France?", False),
    ],
)
def test_code_looking_prompts_are_completed_raw(prompt, is_code):
    from specdec.prompting import looks_like_code

    assert looks_like_code(prompt) is is_code


def test_models_lists_the_catalog(capsys, tmp_path):
    assert main(["models", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for name in (
        "qwen2.5-coder-1.5b-instruct",
        "qwen2.5-coder-0.5b-instruct",
        "smollm2-135m-instruct",
    ):
        assert name in out


@pytest.mark.parametrize("columns", [80, 200])
def test_models_shows_every_cell_whole_at_any_width(capsys, tmp_path, monkeypatch, columns):
    """A table too wide for the terminal would cut its cells short ("Q4_K…"): narrow
    terminals get a model a block instead, every value whole."""
    from specdec.models import CATALOG

    monkeypatch.setenv("COLUMNS", str(columns))
    assert main(["models", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    assert all(len(line) <= columns for line in out.splitlines() if str(tmp_path) not in line)
    for entry in CATALOG.values():
        assert entry.name in out and entry.description in out


def test_unknown_target_is_a_one_line_error(capsys):
    assert exit_code(["generate", "hi", "--target", "no-such-model", "--drafter", "none"]) == 2
    err = capsys.readouterr().err
    assert "neither a catalog model" in err and len(err.strip().splitlines()) == 1


def test_lookup_and_ngram_drafters_from_the_cli(model_dirs, tmp_path, capsys):
    target, draft = model_dirs
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("hello world. hello there. hello world!\n" * 5)
    assert (
        main(
            [
                "ngram",
                "build",
                str(corpus),
                "--tokenizer",
                str(target),
                "--order",
                "3",
                "-o",
                str(tmp_path / "ngram.json"),
            ]
        )
        == 0
    )
    capsys.readouterr()
    plain = None
    for drafter in ("none", "lookup", "ngram", "lookup+model", "lookup+ngram", "model/ngram"):
        assert (
            main(
                [
                    "generate",
                    "hello world. hello",
                    "--target",
                    str(target),
                    "--draft",
                    str(draft),
                    "--drafter",
                    drafter,
                    "--ngram-model",
                    str(tmp_path / "ngram.json"),
                    "--dtype",
                    "float32",
                    "--max-tokens",
                    "24",
                    "--json",
                ]
            )
            == 0
        )
        result = json.loads(capsys.readouterr().out)
        plain = plain or result["token_ids"]
        assert result["token_ids"] == plain, drafter
        if drafter != "none":
            assert result["stats"]["drafted_tokens"] > 0, drafter


def test_ngram_build_bad_input(capsys, tmp_path):
    assert (
        exit_code(["ngram", "build", str(tmp_path / "missing.txt"), "-o", str(tmp_path / "x.json")])
        == 2
    )
    assert "not a file" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["ngram", "vocab"])
def test_an_output_it_cannot_write_is_one_line_before_the_counting(command, capsys, tmp_path):
    """-o in a folder that cannot be (a file's path): one line, exit 2, before the tokenizer
    loads (--tokenizer names no model: loading it would fail with another message)."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("def f():\n    return 1\n")
    output = tmp_path / "corpus.txt" / "out.json"
    args = [command, "build", str(corpus), "-o", str(output), "--tokenizer", "no-such-model"]
    assert exit_code(args) == 2
    err = capsys.readouterr().err
    assert f"-o {output}: cannot write there" in err and err.count("\n") == 1, err


def test_a_pair_with_different_tokenizers_is_refused(model_dirs, tmp_path, capsys):
    """Same vocabulary size and EOS, but every other id means another character."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    from specdec.bench.tiny import CHARS

    target, draft = model_dirs
    other = tmp_path / "other"
    other.mkdir()
    for source in draft.iterdir():
        if not source.name.startswith("tokenizer"):
            (other / source.name).write_bytes(source.read_bytes())
    rotated = {"<eos>": 0, **{c: 1 + (i + 1) % len(CHARS) for i, c in enumerate(CHARS)}}
    tokenizer = Tokenizer(models.BPE(vocab=rotated, merges=[], unk_token=None))
    tokenizer.decoder = decoders.Fuse()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>").save_pretrained(other)
    code = main(
        [
            "generate",
            "hello",
            "--target",
            str(target),
            "--draft",
            str(other),
            "--dtype",
            "float32",
            "--max-tokens",
            "4",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "the tokenizers differ" in err, err


def test_cost_curve_command(model_dirs, capsys):
    target, _ = model_dirs
    assert (
        main(
            ["cost", "--model", str(target), "--dtype", "float32", "--max-n", "4", "--repeats", "2"]
        )
        == 0
    )
    lines = capsys.readouterr().out.strip().splitlines()
    assert "1-token step" in lines[0]
    rows = [line.split() for line in lines[2:]]
    assert [int(row[0]) for row in rows] == [1, 2, 3, 4] and float(rows[0][2]) == 1.0


def test_cost_curve_after_a_longer_context_and_one_that_does_not_fit(model_dirs, capsys):
    target, _ = model_dirs
    command = ["cost", "--model", str(target), "--dtype", "float32", "--max-n", "2"]
    assert main([*command, "--repeats", "1", "--context", "40"]) == 0
    assert "after 40 tokens: 1-token step" in capsys.readouterr().out
    assert main([*command, "--context", "100000"]) == 2
    assert "do not fit in the model's" in capsys.readouterr().err
    assert main([*command, "--context", "0"]) == 2


def test_tune_command_prints_table_and_saves_plot(model_dirs, tmp_path, capsys):
    target, draft = model_dirs
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello world\nthe cat sat on\n")
    out = tmp_path / "tune"
    assert (
        main(
            [
                "tune",
                "--target",
                str(target),
                "--draft",
                str(draft),
                "--dtype",
                "bfloat16",
                "--target-runtime",  # the runtime values override --dtype
                "float32",
                "--draft-runtime",
                "float32",
                "--prompts",
                str(prompts),
                "--max-k",
                "3",
                "--max-tokens",
                "8",
                "--repeats",
                "2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "predicted vs measured" in printed and "recommended k" in printed
    saved = json.loads((out / "tune.json").read_text())
    assert [row["k"] for row in saved["rows"]] == [1, 2, 3]
    assert saved["alpha"]["repeats"] == 2 and saved["alpha"]["target_step_seconds"] > 0
    assert (out / "tune.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("probe_ok", [True, False])
def test_draft_runtime_auto_uses_llamacpp_only_when_its_self_test_passes(
    monkeypatch, tmp_path, capsys, probe_ok
):
    import importlib.util

    from specdec import models
    from specdec import runtime as choosing
    from specdec.backends import probe, runtime_choice
    from specdec.backends.quant import kernels
    from specdec.runtime import Runtime
    from specdec.runtime import choose_draft_runtime as choose_draft

    monkeypatch.setattr(kernels, "kernel", lambda: None)  # int4 builds: a candidate too
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())  # "installed"
    monkeypatch.setattr(models, "ensure_gguf", lambda entry, root, *rest: tmp_path / "d.gguf")
    verdict = probe.ProbeResult(probe_ok, "ok" if probe_ok else "llama.cpp crashed with SIGILL")
    monkeypatch.setattr(probe, "llamacpp_works", lambda gguf, cache_file: verdict)
    measured = {"int8": 21.0, "int4": 15.0, "llamacpp:q4_0": 11.0}  # ms a step, as if timed
    monkeypatch.setattr(Runtime, "load", lambda self, spec, cache_dir, progress: self.name)
    # int8 and int4 are timed on stand-ins of the model (quant.stand_in)
    monkeypatch.setattr(choosing, "stand_in_backend", lambda spec, runtime, *rest: runtime)
    monkeypatch.setattr(runtime_choice, "step_ms", lambda loaded: measured[loaded])
    chosen = choose_draft("auto", "qwen2.5-coder-0.5b-instruct", str(tmp_path))
    assert chosen == ("llamacpp:q4_0" if probe_ok else "int4")
    err = capsys.readouterr().err
    if probe_ok:  # measured once, said once
        assert "draft runtime auto -> llamacpp:q4_0" in err and err.count("\n") == 1
        assert choose_draft("auto", "qwen2.5-coder-0.5b-instruct", str(tmp_path)) == chosen
        assert capsys.readouterr().err == ""
    else:  # llama.cpp left out, the transformers runtimes still measured
        assert "SIGILL" in err and "draft runtime auto -> int4" in err and err.count("\n") == 2
    # a directory: no GGUF for llama.cpp, int8 and int4 measured
    assert choose_draft("auto", "/models/my-draft", str(tmp_path)) == "int4"
    assert choose_draft("auto", "/models/my-draft", dtype="int8") == "int8"  # as given
    assert choose_draft("transformers", "qwen2.5-coder-0.5b-instruct") == "transformers"


@pytest.mark.parametrize("llamacpp_ms", [11.0, 19.0])
def test_the_llamacpp_file_made_only_to_time_the_draft_is_removed_when_it_loses(
    monkeypatch, tmp_path, capsys, llamacpp_ms
):
    """Issue 49: a Q4_0 copy of the draft made to time llama.cpp stays only if llama.cpp is
    chosen, and a run with a cached verdict assembles no GGUF at all."""
    import importlib.util

    from specdec import models
    from specdec import runtime as choosing
    from specdec.backends import probe, runtime_choice
    from specdec.backends.quant import kernels
    from specdec.runtime import Runtime
    from specdec.runtime import choose_draft_runtime as choose_draft

    draft = "qwen2.5-coder-0.5b-instruct"
    q4_0 = models.gguf_path(models.lookup(draft), tmp_path, "q4_0")
    assembled = []

    def ensure_gguf(entry, root, *rest):
        assembled.append(entry.name)
        return tmp_path / "d.gguf"

    def load(runtime, spec, cache_dir, progress):  # llama.cpp's load makes its file
        if runtime.library == "llamacpp":
            q4_0.parent.mkdir(parents=True, exist_ok=True)
            q4_0.write_bytes(b"GGUF")
        return runtime.name

    monkeypatch.setattr(kernels, "kernel", lambda: None)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(models, "ensure_gguf", ensure_gguf)
    monkeypatch.setattr(probe, "run_probe", lambda gguf, command: probe.ProbeResult(True, "ok"))
    measured = {"int8": 21.0, "int4": 15.0, "llamacpp:q4_0": llamacpp_ms}
    monkeypatch.setattr(Runtime, "load", load)
    monkeypatch.setattr(choosing, "stand_in_backend", lambda spec, runtime, *rest: runtime)
    monkeypatch.setattr(runtime_choice, "step_ms", lambda loaded: measured[loaded])
    wins = llamacpp_ms < measured["int4"]
    assert choose_draft("auto", draft, str(tmp_path)) == ("llamacpp:q4_0" if wins else "int4")
    assert q4_0.is_file() == wins
    assert assembled == [draft]  # for llama.cpp's self-test, once
    assert choose_draft("auto", draft, str(tmp_path)) == ("llamacpp:q4_0" if wins else "int4")
    assert assembled == [draft]  # the verdicts cached: no model file read
    assert q4_0.is_file() == wins


def test_a_seeded_sampled_run_reproduces_and_compares_identical(model_dirs, capsys):
    """The reproducibility contract through the CLI: -k auto, temperature 0.8, a seed."""
    target, draft = model_dirs
    args = ["generate", "hello", "--target", str(target), "--draft", str(draft)]
    args += ["--temperature", "0.8", "--top-k", "12", "--seed", "5", "--max-tokens", "24"]
    args += ["--dtype", "float32", "--json", "--compare"]
    runs = []
    for _ in range(2):
        assert main(args) == 0
        runs.append(json.loads(capsys.readouterr().out))
    assert runs[0]["token_ids"] == runs[1]["token_ids"]
    assert runs[0]["compare"]["identical"] is True
    assert main([*args, "--verification", "rejection"]) == 0
    assert json.loads(capsys.readouterr().out)["compare"]["identical"] is None


def test_generate_logprobs_in_json_identical_to_plain_on_int8(model_dirs, capsys):
    """--logprobs N with --json: each token's value and its N most likely tokens; --compare
    says they are plain decoding's very floats on the batch-invariant runtime."""
    target, draft = model_dirs
    args = ["generate", "hello", "--target", str(target), "--draft", str(draft), "-k", "3"]
    args += ["--temperature", "0", "--max-tokens", "16", "--dtype", "int8", "--logprobs", "2"]
    assert main([*args, "--json", "--compare"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [e["token_id"] for e in result["logprobs"]] == result["token_ids"]
    assert all(
        len(e["top"]) == 2 and e["top"][0]["token_id"] == e["token_id"] for e in result["logprobs"]
    )
    assert result["compare"]["identical"] is True
    assert result["compare"]["identical_logprobs"] is True
    assert main(args) == 2  # without --json there is nowhere to print them
    assert "--logprobs is printed with --json" in capsys.readouterr().err


def test_generate_prompt_logprobs_in_json(model_dirs, capsys):
    """--prompt-logprobs N with --json: one entry per prompt token, the first null, each
    with its N most likely tokens; without --json, a usage error."""
    target, draft = model_dirs
    args = ["generate", "hello there", "--target", str(target), "--draft", str(draft), "--raw"]
    args += ["--temperature", "0", "--max-tokens", "4", "--dtype", "int8", "--prompt-logprobs", "3"]
    assert main([*args, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    entries = result["prompt_logprobs"]
    assert entries[0] is None and len(entries) == result["stats"]["prompt_tokens"] > 2
    assert all(e["logprob"] <= 0 and len(e["top"]) == 3 for e in entries[1:])
    assert "logprobs" not in result
    assert main(args) == 2
    assert "--prompt-logprobs is printed with --json" in capsys.readouterr().err


def test_generate_with_a_suffix_fills_in_the_middle(model_dirs, tmp_path, capsys):
    """--suffix: the prompt ids are the model's fill-in-the-middle form of prompt and
    suffix, speculation keeps plain decoding's text; a tokenizer without the markers, or
    --chat, is a usage error."""
    tokenizer = fim_tokenizer()
    target = tiny_llama(seed=0, vocab=VOCAB + 3)
    for name, model in (("target", target), ("draft", perturbed_copy(target, 0.03, seed=1))):
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    args = ["generate", "def f(a", "--suffix", "return b", "--target", str(tmp_path / "target")]
    args += ["--draft", str(tmp_path / "draft"), "--temperature", "0", "--max-tokens", "12"]
    assert main([*args, "--dtype", "int8", "--json", "--compare"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["stats"]["prompt_tokens"] == len(fim_ids(tokenizer, "def f(a", "return b"))
    assert result["compare"]["identical"] is True
    assert main([*args, "--chat"]) == 2
    assert "--suffix fills in the middle of raw text" in capsys.readouterr().err
    target_dir, draft_dir = model_dirs
    plain = ["generate", "ab", "--suffix", "cd", "--target", str(target_dir), "--drafter", "none"]
    assert main(plain) == 2
    assert "suffix needs a model trained to fill in the middle" in capsys.readouterr().err


def test_generate_with_a_prediction_drafts_it_and_keeps_plain_decodings_text(
    model_dirs, tmp_path, capsys
):
    """--prediction FILE: its tokens drafted in front of --drafter (or alone with
    --drafter none), the text plain decoding's; an unreadable file is a usage error."""
    target, draft = model_dirs
    args = ["generate", "hello", "--target", str(target), "--draft", str(draft), "--raw"]
    args += ["--temperature", "0", "--max-tokens", "30", "--dtype", "int8", "-k", "4", "--json"]
    assert main(args) == 0
    text = json.loads(capsys.readouterr().out)["text"]
    predicted = tmp_path / "predicted.txt"
    predicted.write_text(text[:8] + "zz" + text[10:])
    for drafter in ("model", "none"):
        run = [*args, "--prediction", str(predicted), "--drafter", drafter, "--compare"]
        assert main(run) == 0
        result = json.loads(capsys.readouterr().out)
        assert result["text"] == text and result["compare"]["identical"] is True
        assert result["stats"]["by_drafter"]["prediction"]["accepted"] > len(text) // 2
    assert main([*args, "--prediction", str(tmp_path / "missing.txt")]) == 2
    assert "--prediction: cannot read" in capsys.readouterr().err


def test_generate_ignore_eos_and_stop_token_ids(model_dirs, capsys):
    """--ignore-eos runs to --max-tokens; --stop-token-id ends the output at the first such
    token (kept in the tokens, not in the text), not before --min-tokens; an id outside the
    vocabulary, or --min-tokens past --max-tokens, is an error."""
    target, draft = model_dirs
    args = ["generate", "hello", "--target", str(target), "--draft", str(draft), "--raw"]
    args += ["--temperature", "0", "--max-tokens", "20", "--dtype", "int8", "--json"]
    assert main([*args, "--ignore-eos"]) == 0
    free = json.loads(capsys.readouterr().out)
    assert len(free["token_ids"]) == 20
    stop_id = free["token_ids"][7]
    first = free["token_ids"].index(stop_id)
    assert main([*args, "--ignore-eos", "--stop-token-id", str(stop_id), "--compare"]) == 0
    cut = json.loads(capsys.readouterr().out)
    assert cut["token_ids"] == free["token_ids"][: first + 1] and cut["finish_reason"] == "stop"
    assert cut["text"] == free["text"][:first] and cut["compare"]["identical"] is True
    held = [*args, "--ignore-eos", "--stop-token-id", str(stop_id), "--min-tokens", str(first + 3)]
    assert main([*held, "--compare"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert len(result["token_ids"]) > first + 3 and result["compare"]["identical"] is True
    assert main([*args, "--min-tokens", "21"]) == 2
    assert "min_tokens must be in [0, max_tokens = 20]" in capsys.readouterr().err
    assert main([*args, "--stop-token-id", "999"]) == 2
    assert "stop_token_ids names ids outside the vocabulary" in capsys.readouterr().err


def test_generate_with_penalties_and_a_bias_is_plain_decodings_text(model_dirs, capsys):
    """--presence-penalty, --frequency-penalty, --repetition-penalty and --logit-bias change
    the text (a -100 bias bans its token), speculation keeps plain decoding's; a bias that is
    not ID=BIAS and a penalty out of range are usage errors."""
    target, draft = model_dirs
    args = ["generate", "hello", "--target", str(target), "--draft", str(draft), "-k", "3"]
    args += ["--temperature", "0", "--max-tokens", "24", "--dtype", "int8", "--json"]
    assert main(args) == 0
    before = json.loads(capsys.readouterr().out)["token_ids"]
    banned = before[0]
    changed = ["--presence-penalty", "0.5", "--frequency-penalty", "0.5"]
    changed += ["--repetition-penalty", "1.2", "--logit-bias", f"{banned}=-100"]
    assert main([*args, *changed, "--compare"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["compare"]["identical"] is True and result["stats"]["drafted_tokens"] > 0
    assert banned not in result["token_ids"] and result["token_ids"] != before
    assert main([*args, "--logit-bias", "7:-100"]) == 2
    assert "--logit-bias takes ID=BIAS" in capsys.readouterr().err
    assert main([*args, "--presence-penalty", "3"]) == 2
    assert "presence_penalty must be a number in [-2, 2]" in capsys.readouterr().err


def test_generate_follows_a_regex_and_names_a_missing_schema_file(model_dirs, capsys, tmp_path):
    target, draft = model_dirs
    args = ["generate", "hello", "--target", str(target), "--draft", str(draft), "-k", "3"]
    args += ["--temperature", "0", "--max-tokens", "30", "--dtype", "float32", "--json"]
    assert main([*args, "--regex", "(ab|cd)+e!"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert re.fullmatch("(ab|cd)+e!", result["text"]) or result["finish_reason"] == "length"
    assert result["stats"]["by_drafter"]["grammar"]["accepted"] > 0
    missing = tmp_path / "none.json"
    assert main([*args, "--json-schema", str(missing)]) == 2
    assert f"--json-schema {missing}: No such file" in capsys.readouterr().err
    assert main([*args, "--regex", "a(b"]) == 2
    assert "constraint" in capsys.readouterr().err


def test_one_runtime_value_or_the_older_spelling_give_the_same_run(model_dirs, capsys):
    """--target-runtime float32 --draft-runtime float32 is --dtype float32; cost and tune
    take the same values."""
    target, draft = model_dirs
    common = ["generate", "hello", "--target", str(target), "--draft", str(draft), "-k", "2"]
    common += ["--max-tokens", "12", "--json"]
    assert main([*common, "--dtype", "float32"]) == 0
    older = json.loads(capsys.readouterr().out)
    runtimes = ["--target-runtime", "float32", "--draft-runtime", "float32", "--dtype", "int8"]
    assert main([*common, *runtimes]) == 0
    newer = json.loads(capsys.readouterr().out)
    assert newer["token_ids"] == older["token_ids"]
    assert main(["cost", "--model", str(target), "--runtime", "float32", "--max-n", "2"]) == 0
    assert "on float32" in capsys.readouterr().out


def test_serve_takes_a_runtime_per_model(model_dirs, tmp_path):
    """serve --target-runtime/--draft-runtime: the runtime values every command takes; by
    default both chosen as generate chooses (auto: int8 or int4, measured), so requests
    batch."""
    from specdec.backends.batched import BatchedModel
    from specdec.backends.quant.int8 import RowInt8Linear
    from specdec.backends.transformers_forward import TransformersModel
    from specdec.cli import build_parser
    from specdec.cli.serve import server_config as _server_config
    from specdec.server.setup import build_scheduler

    target, draft = model_dirs
    args = build_parser().parse_args(
        ["serve", "--target", str(target), "--draft", str(draft), "--drafter", "model"]
        + ["--target-runtime", "float32", "--draft-runtime", "int8"]
    )
    config = _server_config(args, threads=None)
    assert (config.target_runtime, config.draft_runtime) == ("float32", "int8")
    scheduler = build_scheduler(config)
    assert scheduler.batched is None  # a float32 target: requests take turns
    # the scheduler holds models: the int8 draft's on the layer stack, the float32
    # target's on transformers' forward
    assert isinstance(scheduler.draft_model, BatchedModel)
    assert isinstance(scheduler.draft_model.model.get_output_embeddings(), RowInt8Linear)
    assert isinstance(scheduler.target_model, TransformersModel)
    assert exit_code(["serve", "--target-runtime", "tpu:fp8"]) == 2
    # --drafter auto without heads: the draft model, without generate's lookup in front
    args = build_parser().parse_args(
        ["serve", "--target", str(target), "--draft", str(draft), "--cache-dir", str(tmp_path)]
    )
    config = _server_config(args, threads=None)
    assert (config.dtype, config.target_runtime, config.draft_runtime) == (None, "auto", "auto")
    scheduler = build_scheduler(config)
    assert scheduler.default_drafter == "model"
    assert scheduler.batched is not None and scheduler.draft_batched is not None
    verdicts = json.loads((tmp_path / "draft-runtime.json").read_text())
    measured = [set(v["step_ms"]) for v in verdicts.values()]
    assert {"int8", "int4"} in measured or {"int8"} in measured  # int4 where its kernel builds


@pytest.mark.parametrize("int4_ms, expected", [(12.4, "int4"), (13.0, "llamacpp:q4_0")])
def test_the_draft_keeps_the_targets_runtime_when_nearly_as_fast(
    monkeypatch, tmp_path, capsys, int4_ms, expected
):
    """Measured here: an int4 draft at 12.4 ms beat llama.cpp's at 12.0 ms end to end beside
    an int4 target; more than 5% slower, the fastest wins."""
    import importlib.util

    from specdec import models
    from specdec import runtime as choosing
    from specdec.backends import probe, runtime_choice
    from specdec.backends.quant import kernels
    from specdec.runtime import Runtime
    from specdec.runtime import choose_draft_runtime as choose_draft

    monkeypatch.setattr(kernels, "kernel", lambda: None)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(models, "ensure_gguf", lambda entry, root, *rest: tmp_path / "d.gguf")
    monkeypatch.setattr(probe, "llamacpp_works", lambda gguf, f: probe.ProbeResult(True, "ok"))
    measured = {"int8": 20.7, "int4": int4_ms, "llamacpp:q4_0": 12.0}
    monkeypatch.setattr(Runtime, "load", lambda self, spec, cache_dir, progress: self.name)
    # int8 and int4 are timed on stand-ins of the model (quant.stand_in)
    monkeypatch.setattr(choosing, "stand_in_backend", lambda spec, runtime, *rest: runtime)
    monkeypatch.setattr(runtime_choice, "step_ms", lambda loaded: measured[loaded])
    draft = "qwen2.5-coder-0.5b-instruct"
    chosen = choose_draft("auto", draft, str(tmp_path), target_runtime="int4")
    assert chosen == expected
    err = capsys.readouterr().err
    assert f"draft runtime auto -> {expected}" in err
    assert ("the target's own int4 is within 5%" in err) == (expected == "int4")
    # the same cached verdict beside an int8 target: the fastest, llama.cpp
    assert choose_draft("auto", draft, str(tmp_path), target_runtime="int8") == ("llamacpp:q4_0")


def test_progress_lines_time_each_step_and_show_a_step_run_again(monkeypatch, capsys):
    """In a log file (stderr not a terminal) progress is a line at every tenth of a step,
    with the seconds since that step began; a step reported again from its start (the
    training of a later 'heads make' phase) is shown again, timed from its new start."""
    import time

    from specdec import progress

    clock = iter([100.0, 103.0, 110.0, 500.0, 507.0])
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    update = progress.progress_lines()
    for done, total in [(0, 10), (5, 10), (10, 10), (0, 4), (4, 4)]:
        update("training (seconds)", done, total)
    assert capsys.readouterr().err.splitlines() == [
        "training (seconds): 0/10 (0 s)",
        "training (seconds): 5/10 (3 s)",
        "training (seconds): 10/10 (10 s)",
        "training (seconds): 0/4 (0 s)",
        "training (seconds): 4/4 (7 s)",
    ]


def test_serve_reports_an_address_it_cannot_listen_on_before_loading(tmp_path, capsys):
    """A port another server holds, an impossible port, a host this machine does not have:
    one line and exit 2 at once, before the models load (the target does not exist: reaching
    the loading would say so instead)."""
    import socket

    missing = str(tmp_path / "no-such-model")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert exit_code(["serve", "--target", missing, "--port", str(port)]) == 2
        error = capsys.readouterr().err
        assert f"cannot listen on 127.0.0.1:{port}" in error and "another server" in error
        assert "no-such-model" not in error
    for bad in ("0", "65536", "99999", "http"):
        assert exit_code(["serve", "--target", missing, "--port", bad]) == 2
        assert "--port" in capsys.readouterr().err
    assert exit_code(["serve", "--target", missing, "--host", "no-such-host.invalid"]) == 2
    assert "--host no-such-host.invalid" in capsys.readouterr().err
    # the port free again: the check passes and the missing model is what fails
    assert exit_code(["serve", "--target", missing, "--port", str(port)]) == 2
    assert "no-such-model" in capsys.readouterr().err


def test_serve_prefill_rows_sets_the_servers_step_budget(tmp_path, capsys):
    """--prefill-rows N: the prompt tokens a step prefills (0: each prompt whole, None in
    the config); a negative one is a usage error before anything loads."""
    from specdec.cli import build_parser
    from specdec.cli.serve import server_config as _server_config
    from specdec.config import DEFAULT_PREFILL_ROWS

    def config(*flags):
        return _server_config(build_parser().parse_args(["serve", *flags]), threads=None)

    assert config().prefill_rows == DEFAULT_PREFILL_ROWS
    assert config("--prefill-rows", "64").prefill_rows == 64
    assert config("--prefill-rows", "0").prefill_rows is None
    missing = str(tmp_path / "no-such-model")
    assert exit_code(["serve", "--target", missing, "--prefill-rows", "-1"]) == 2
    error = capsys.readouterr().err
    assert "--prefill-rows" in error and "no-such-model" not in error


def test_serve_prefix_cache_mb_reaches_the_models(tmp_path, capsys):
    """--prefix-cache-mb N: the memory each batched model keeps for ended requests' caches
    (the scheduler sets it on target and draft); a negative one is a usage error before
    anything loads."""
    from specdec.backends.quant.convert import make_int8_batch_invariant
    from specdec.cli import build_parser
    from specdec.cli.serve import server_config as _server_config
    from specdec.config import DEFAULT_PREFIX_CACHE_MB
    from specdec.server.scheduler import Scheduler

    def config(*flags):
        return _server_config(build_parser().parse_args(["serve", *flags]), threads=None)

    assert config().prefix_cache_mb == DEFAULT_PREFIX_CACHE_MB
    assert config("--prefix-cache-mb", "0").prefix_cache_mb == 0
    model = make_int8_batch_invariant(tiny_llama(seed=0))
    scheduler = Scheduler(model, None, model, prefix_cache_mb=3)
    assert scheduler.batched.keep_bytes == scheduler.draft_batched.keep_bytes == 3 << 20
    missing = str(tmp_path / "no-such-model")
    assert exit_code(["serve", "--target", missing, "--prefix-cache-mb", "-1"]) == 2
    error = capsys.readouterr().err
    assert "--prefix-cache-mb" in error and "no-such-model" not in error


def test_an_error_of_the_machine_is_one_line(model_dirs, tmp_path, capsys):
    """An OSError (here a cache folder under a file) ends in one line and exit 1, not a
    traceback."""
    target, draft = model_dirs
    (tmp_path / "a-file").write_text("")
    args = ["generate", "hi", "--target", str(target), "--draft", str(draft), "--dtype", "int8"]
    args += ["--max-tokens", "2", "--cache-dir", str(tmp_path / "a-file" / "cache")]
    assert exit_code(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("specdec: error: ") and err.count("\n") == 1, err
    assert "a-file" in err


def test_a_prompt_read_from_standard_input(model_dirs, monkeypatch, capsys):
    """generate -: the prompt from standard input, its trailing newlines dropped (as the
    shell's "$(cat FILE)"), the same output as the same text given as an argument; an empty
    input is one line and exit 2."""
    import io

    target, draft = model_dirs
    common = ["--target", str(target), "--draft", str(draft), "--dtype", "int8"]
    common += ["--max-tokens", "12", "--json", "--raw"]
    text = "hello world.\nhello"
    assert main(["generate", text, *common]) == 0
    given = json.loads(capsys.readouterr().out)
    monkeypatch.setattr(sys, "stdin", io.StringIO(text + "\n\n"))
    assert main(["generate", "-", *common]) == 0
    read = json.loads(capsys.readouterr().out)
    assert read["token_ids"] == given["token_ids"] and read["text"] == given["text"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n \n"))
    assert main(["generate", "-", *common]) == 2
    assert "standard input is empty" in capsys.readouterr().err


def test_version(capsys):
    from specdec import __version__

    assert exit_code(["--version"]) == 0
    assert capsys.readouterr().out == f"specdec {__version__}\n"
