"""The benchmark harness itself, on tiny random models (quick mode)."""

import importlib.util
import json
import re
from pathlib import Path

import pytest

from specdec.bench import pairs
from specdec.bench.harness import WORKLOADS, load_workloads
from specdec.cli import main


def test_workloads_ship_eight_prompts_each():
    items = load_workloads()
    for workload in WORKLOADS:
        assert len([i for i in items if i.workload == workload]) >= 8
    assert len({i.id for i in items}) == len(items)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    assert (
        main(
            [
                "bench",
                "--quick",
                "--repeats",
                "2",
                "--workloads",
                "code,edit",
                "--systems",
                "plain,model-k4,lookup-k4,model-auto,hf-generate,hf-assisted",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    return out


def test_writes_every_report(report):
    for name in ("results.json", "results.md", "speedup.png", "theory.png"):
        assert (report / name).stat().st_size > 0
    assert (report / "speedup.png").read_bytes()[:4] == b"\x89PNG"


def test_summary_rows_and_exactness(report):
    result = json.loads((report / "results.json").read_text())
    rows = result["summary"]
    systems = {row["system"] for row in rows}
    assert systems == {"plain", "model-k4", "lookup-k4", "model-auto", "hf-generate", "hf-assisted"}
    assert {row["workload"] for row in rows} == {"code", "edit"}
    for row in rows:
        assert row["runs"] == 2 * 2  # 2 prompts x 2 passes
        if row["system"] == "plain":
            assert row["speedup"] == 1.0
        if row["system"] in ("model-k4", "lookup-k4", "model-auto"):
            # int8 is batch-invariant: specdec's greedy output equals plain, every time.
            assert row["identical"] == 1.0
    model_rows = [row for row in rows if row["system"] == "model-k4"]
    assert all(
        0 <= row["acceptance_rate"] <= 1 and row["mean_accepted_length"] >= 1 for row in model_rows
    )
    for row in model_rows:  # the first draft is reached every round; later ones less often
        runs = [
            r
            for r in result["runs"]
            if (r["workload"], r["system"]) == (row["workload"], "model-k4")
        ]
        drafted = [sum(r["stats"]["drafted_per_position"][j] for r in runs) for j in range(3)]
        accepted = [sum(r["stats"]["accepted_per_position"][j] for r in runs) for j in range(3)]
        assert row["acceptance_by_position"] == [
            a / d for a, d in zip(accepted, drafted, strict=True)
        ]
        assert row["draft_ms_per_token"] > 0
    assert result["theory"], "fixed-k runs give measured-vs-predicted points"
    passes = [run["repeat"] for run in result["runs"]]
    assert sorted(set(passes)) == [0, 1]


def test_markdown_table_lists_each_system(report):
    table = (report / "results.md").read_text()
    assert "| code | model-k4 |" in table and "speedup vs plain" in table
    assert "by position (1, 2, 3)" in table
    assert "Draft vocabulary: full." in table  # tiny models: no vocabulary ships for them


def test_the_report_says_what_the_draft_scores():
    from specdec.bench.command import _vocab_label

    auto = _vocab_label("auto", "qwen2.5-coder-0.5b-instruct")
    assert auto == "auto (qwen2.5.vocab.json on int8 and int4, else full)"
    assert _vocab_label("auto", "./my-draft").startswith("auto (full")
    assert _vocab_label("full", "qwen2.5-coder-0.5b-instruct") == "full"
    assert _vocab_label("code.vocab.json", "./my-draft") == "code.vocab.json"


def test_unknown_system_is_an_error(capsys):
    assert main(["bench", "--quick", "--systems", "plain,warp-drive"]) == 2
    assert "unknown system" in capsys.readouterr().err


def test_a_target_that_is_no_model_is_one_line(tmp_path, capsys):
    """The tokenizer is read from the same model directory loading uses: a target that is
    neither a catalog name nor a directory is one line, not transformers' traceback."""
    args = ["bench", "--target", str(tmp_path / "nowhere"), "--systems", "plain"]
    assert main([*args, "--max-tokens", "2", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "is neither a catalog model" in err and err.count("\n") == 1, err


def test_an_out_folder_it_cannot_write_is_one_line_before_any_run(tmp_path, capsys):
    """--out under a file: one line and exit 2 before anything loads or runs (the target
    does not exist either: reaching the loading would have said so instead)."""
    (tmp_path / "a-file").write_text("")
    args = ["bench", "--target", str(tmp_path / "nowhere"), "--systems", "plain"]
    assert main([*args, "--out", str(tmp_path / "a-file" / "out")]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "cannot write there" in err and err.count("\n") == 1, err
    assert "catalog model" not in err


def test_system_names_parse_drafter_k_and_runtime():
    from specdec.bench.systems import ModelPool, RuntimePair, describe, make_system, reference_of

    pool = ModelPool(None, lambda role, runtime, progress: None)
    assert make_system("model-k6", pool).spec.k == 6
    assert make_system("lookup+model-auto", pool).spec.k == "auto"
    assert make_system("eagle/lookup+model-auto@int4", pool).needs == {
        ("target", "int4"),
        ("draft", "int4"),
    }
    assert describe("eagle/model-auto") == (
        "specdec, EAGLE head or draft model, whichever measures faster, adaptive k [int8]"
    )
    with pytest.raises(ValueError, match="needs k auto"):
        make_system("model/eagle-k4", pool)
    assert describe("lookup-k2") == "specdec, prompt lookup, k=2 [int8]"
    mixed = make_system("model-auto@int8/q4_0", pool)
    assert mixed.runtime == RuntimePair("int8", "q4_0") and mixed.needs == {
        ("target", "int8"),
        ("draft", "q4_0"),
    }
    assert make_system("lookup-k4@q8_0", pool).needs == {("target", "q8_0")}
    assert make_system("llamacpp", pool).runtime == RuntimePair("q4_k_m", "q4_k_m")
    assert make_system("hf-assisted", pool, default_runtime="bfloat16").needs == {
        ("target", "bfloat16"),
        ("draft", "bfloat16"),
    }
    names = ["plain", "plain@q4_0", "model-k4@q4_0", "model-k4", "llamacpp"]
    assert reference_of("model-k4@q4_0", names, "int8") == "plain@q4_0"
    assert reference_of("model-k4", names, "int8") == "plain"
    assert reference_of("llamacpp", names, "int8") == "plain"  # no plain@q4_k_m in this run
    # llama.cpp's own speculation is judged against llama.cpp's own plain loop.
    assert reference_of("llamacpp-lookup", names, "int8") == "llamacpp"
    assert make_system("llamacpp-lookup", pool).runtime == RuntimePair("q4_k_m", "q4_k_m")
    assert "prompt-lookup" in describe("llamacpp-lookup")
    assert reference_of("openvino-int4-model", ["plain", "openvino-int4"], "int8") == (
        "openvino-int4"
    )
    assert reference_of("onnx-int4-lookup", ["plain", "onnx-int4"], "int8") == "onnx-int4"
    assert reference_of("onnx-int4-model", ["plain"], "int8") == "plain"  # no onnx-int4 run
    assert "ONNX Runtime GenAI" in describe("onnx-int4-model")
    assert make_system("onnx-int4-model", pool).needs == set()  # it runs its own models

    with pytest.raises(ValueError, match="needs --ngram-model"):
        make_system("ngram-k4", pool)
    with pytest.raises(ValueError, match="unknown system"):
        make_system("model-fast", pool)
    with pytest.raises(ValueError, match="unknown runtime"):
        make_system("model-k4@q3_xs", pool)
    with pytest.raises(ValueError, match="needs a transformers runtime"):
        make_system("hf-generate@q8_0", pool)
    with pytest.raises(ValueError, match="GGUF type"):
        make_system("llamacpp@int8", pool)


def test_openvino_int4_systems_say_how_to_export(tmp_path):
    from specdec.bench.openvino import exported_dir

    with pytest.raises(ValueError, match="bench/openvino_export.sh"):
        exported_dir(tmp_path, "qwen2.5-coder-1.5b-instruct")


def test_systems_on_other_runtimes_are_judged_by_their_own_plain(tmp_path):
    """float32 systems beside an int8 baseline: ratios against plain (int8), token identity
    against plain@float32, and the theory plot's c and v against that run's step."""
    assert (
        main(
            [
                "bench",
                "--quick",
                "--repeats",
                "1",
                "--workloads",
                "code",
                "--systems",
                "plain,plain@float32,model-k2@float32,model-k2",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    result = json.loads((tmp_path / "results.json").read_text())
    rows = {row["system"]: row for row in result["summary"]}
    assert rows["model-k2@float32"]["reference"] == "plain@float32"
    assert rows["model-k2"]["reference"] == "plain"
    assert rows["plain"]["speedup"] == 1.0 and rows["plain@float32"]["ms_per_token"] > 0
    # float32 tiny models: a k=2 verify pass and plain steps agree token for token here
    assert rows["model-k2@float32"]["identical"] == 1.0
    assert {p["system"] for p in result["theory"]} == {"model-k2@float32", "model-k2"}
    assert "ms/token" in (tmp_path / "results.md").read_text()


def test_a_workload_file_of_the_users_own_prompts(tmp_path):
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text(
        '{"id": "a", "prompt": "the cat", "template": "raw"}\n\n{"prompt": "a dog"}\n'
    )
    out = tmp_path / "out"
    args = ["bench", "--quick", "--systems", "plain,lookup-k2", "--repeats", "1"]
    assert main([*args, "--workload-file", str(prompts), "--out", str(out)]) == 0
    rows = json.loads((out / "results.json").read_text())["summary"]
    assert {row["workload"] for row in rows} == {"mine"}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"prompt": "ok"}\n{"prompt": 3}\n', "line 2: needs a non-empty string field 'prompt'"),
        ('{"prompt": "ok"}\nnot json\n', "line 2: not valid JSON"),
        ('{"prompt": "ok", "template": "poem"}\n', "line 1: template must be raw or chat"),
        ("\n\n", "no prompts in it"),
    ],
)
def test_a_bad_workload_file_is_one_clear_line(tmp_path, capsys, content, message):
    prompts = tmp_path / "bad.jsonl"
    prompts.write_text(content)
    assert main(["bench", "--quick", "--workload-file", str(prompts)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_sampled_runs_with_a_seed_are_judged_by_text_for_specdec_systems(tmp_path):
    """Coupled verification: sampled specdec output equals specdec plain's with the seed."""
    out = tmp_path / "sampled"
    args = ["bench", "--quick", "--systems", "plain,model-k2,lookup+model-auto", "--repeats", "1"]
    args += ["--temperature", "0.8", "--seed", "7", "--workloads", "code,chat"]
    assert main([*args, "--out", str(out)]) == 0
    rows = json.loads((out / "results.json").read_text())["summary"]
    speculative = [row for row in rows if row["system"] != "plain"]
    assert speculative and all(row["identical"] == 1.0 for row in speculative)
    assert any(row["acceptance_rate"] for row in speculative)


def test_rejection_sampled_runs_are_tested_against_the_target_distribution(tmp_path):
    """--verification rejection: no text identity; every generated position of each specdec
    system is tested against the target's conditional distribution (PIT + KS)."""
    out = tmp_path / "rejection"
    args = ["bench", "--quick", "--systems", "plain,model-k3", "--repeats", "3"]
    args += ["--temperature", "1.0", "--verification", "rejection"]
    assert main([*args, "--out", str(out)]) == 0
    report = json.loads((out / "results.json").read_text())
    assert all(row["identical"] is None for row in report["summary"])
    tests = report["distribution"]
    assert set(tests) == {"plain", "model-k3"}
    for test in tests.values():
        assert test["positions"] >= 200 and test["p_value"] > 1e-4
    assert "Sampled tokens against the target" in (out / "results.md").read_text()
    model = [r for r in report["summary"] if r["system"] == "model-k3"]
    assert all(0.05 < r["acceptance_rate"] < 0.99 for r in model)


def test_the_distribution_test_rejects_tokens_from_another_distribution():
    """The check has teeth: 2,000 draws from a distribution too sharp (logits x 1.3, total
    variation ~0.1 from the claimed one) or with 20% of each token's mass moved to its
    neighbour id are flagged; draws from the claimed one are not."""
    import torch

    from specdec.bench.distribution import ks_uniform, pit_values

    generator = torch.Generator().manual_seed(0)
    claimed = torch.softmax(torch.randn(2000, 32, generator=generator), dim=-1)
    sharp = torch.softmax(torch.log(claimed) * 1.3, dim=-1)
    moved = 0.8 * claimed + 0.2 * torch.roll(claimed, 1, dims=-1)

    def drawn(probs):
        return torch.multinomial(probs, 1, generator=generator)[:, 0].tolist()

    assert ks_uniform(pit_values(claimed, drawn(claimed), generator)).p_value > 1e-3
    assert ks_uniform(pit_values(claimed, drawn(sharp), generator)).p_value < 1e-3
    assert ks_uniform(pit_values(claimed, drawn(moved), generator)).p_value < 1e-3


def test_a_peer_with_its_own_draft_counts_is_left_out_of_the_theory_plot():
    """ONNX Runtime GenAI reports drafted/accepted counts but no k per round or costs: the
    measured-vs-predicted points skip it instead of failing on it."""
    from specdec.bench.report import theory_points
    from specdec.metrics import SpecStats

    plain = SpecStats(rounds=10, target_seconds=0.5, total_seconds=0.5).to_dict()
    peer = SpecStats(rounds=3, drafted_tokens=12, accepted_tokens=9, bonus_tokens=2).to_dict()
    runs = [
        {"system": "plain", "reference": "plain", "prompt_id": "a", "repeat": 0, "stats": plain},
        {
            "system": "onnx-int4-model",
            "reference": "plain",
            "prompt_id": "a",
            "repeat": 0,
            "stats": peer,
        },
    ]
    assert theory_points(runs) == []


def test_the_machine_line_names_the_cpu_kind_and_any_held_kernels(monkeypatch):
    """The two EPYC kinds share a model name: the line adds family/model and the widest
    vector set from /proc/cpuinfo, and names every kernel held to a smaller instruction set
    (a run so held is not this CPU's own speed)."""
    from pathlib import Path

    from specdec.backends.runtime_choice import ISA_VARIABLES
    from specdec.bench.command import machine

    for name in ISA_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert "kernels held" not in machine()
    monkeypatch.setenv("FBGEMM_ENABLE_INSTRUCTIONS", "AVX2")
    monkeypatch.setenv("SPECDEC_INT4_PATH", "avx2")
    held = machine()
    assert held.endswith("; kernels held: FBGEMM_ENABLE_INSTRUCTIONS=AVX2 SPECDEC_INT4_PATH=avx2")
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file() and "cpu family" in cpuinfo.read_text():
        assert "family " in held and " model " in held
        has_amx = " amx_int8" in cpuinfo.read_text()
        assert (", AMX)" in held) == has_amx  # the tile path's CPUs are a kind of their own


def _run_by_run():
    path = Path(__file__).resolve().parents[2] / "bench" / "run_by_run.py"
    spec = importlib.util.spec_from_file_location("run_by_run", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_run_by_run_pairs_each_prompt_and_repeat(report, capsys):
    """bench/run_by_run.py: paired ratios (same prompt, same repeat), their median and how
    many were faster, per workload; bad pairs and files are one line, exit 2."""
    run_by_run = _run_by_run()
    runs = [
        {
            "system": system,
            "workload": "code",
            "prompt_id": f"p{p}",
            "repeat": r,
            "tokens_per_second": rate,
            "identical_to_reference": True,
        }
        for system, rates in (("a", [10, 20, 30, 40]), ("b", [5, 40, 15, 80]))
        for (p, r), rate in zip([(0, 0), (1, 0), (0, 1), (1, 1)], rates, strict=True)
    ]
    runs[-1]["identical_to_reference"] = False
    assert run_by_run.paired_ratios(runs, "a", "b", "code") == [2.0, 2.0, 0.5, 0.5]
    assert run_by_run.lines({"runs": runs}, [("a", "b")]) == [
        "a over b code: median 1.250 faster 2/4 (sign test p 1)",
        "not identical: ['b p1 repeat 1']",
    ]
    # several runs pooled: each run's pairs its own, a differing output named with its run
    assert run_by_run.lines([{"runs": runs}, {"runs": runs}], [("a", "b")]) == [
        "a over b code: median 1.250 faster 4/8 (sign test p 1)",
        "not identical: ['run 1 b p1 repeat 1', 'run 2 b p1 repeat 1']",
    ]
    assert pairs.sign_test(8, 0) == 2 / 256 and pairs.sign_test(0, 8) == 2 / 256
    assert pairs.sign_test(7, 1) == 2 * 9 / 256 and pairs.sign_test(0, 0) == 1.0
    results = report / "results.json"
    assert run_by_run.main([str(results), "model-k4/plain"]) == 0
    out = capsys.readouterr().out
    assert "model-k4 over plain code: median" in out and "not identical: []" in out
    single = re.search(r"median (\S+) faster (\d+)/(\d+)", out).groups()
    assert run_by_run.main([str(results), str(results), "model-k4/plain"]) == 0
    pooled = re.search(r"median (\S+) faster (\d+)/(\d+)", capsys.readouterr().out).groups()
    assert pooled == (single[0], str(2 * int(single[1])), str(2 * int(single[2])))
    assert run_by_run.main([str(results), "eagle/plain"]) == 2
    assert run_by_run.main(["model-k4/plain"]) == 2
    assert run_by_run.main([str(report / "missing.json")]) == 2
    assert "is not a specdec bench results.json" in capsys.readouterr().out


def test_every_system_the_help_names_is_one_the_bench_makes():
    """--systems' help is written from the registries make_system reads; each name it lists,
    and each drafter kind as DRAFTER-k2 and DRAFTER-auto, makes a system (the names are
    checked before anything loads, as the command checks them)."""
    from specdec.bench.systems import ModelPool, make_system, systems_help
    from specdec.drafters.recipe import KINDS

    text = systems_help()
    listed = re.findall(r"(?:^|; )([a-z0-9+-]+): ", text.removeprefix("comma-separated"))
    assert {"plain", "llamacpp", "hf-assisted", "openvino-int4-model", "onnx-int4"} <= set(listed)
    checker = ModelPool(None, lambda role, runtime, progress: None)
    drafters = [f"{kind}-{k}" for kind in KINDS for k in ("k2", "auto")]
    for name in [*listed, *drafters, "lookup+model-auto@int4", "model/eagle-auto"]:
        assert make_system(name, checker, ngram=object()).name == name
    assert all(kind in text for kind in KINDS)
    with pytest.raises(ValueError, match="unknown system"):
        make_system("warp-drive", checker)


def test_tree_systems_are_named_on_a_recipe_with_the_draft_model():
    from specdec.bench.systems import ModelPool, describe, make_system

    pool = ModelPool(None, lambda role, runtime, progress: None)
    system = make_system("lookup+model-auto:tree-auto@int4", pool)
    assert system.spec.tree == "auto" and system.spec.k == "auto"
    assert make_system("model-k3:tree-full", pool).spec.tree == "full"
    assert "draft tree full" in describe("model-k3:tree-full")
    for bad in ("lookup-k3:tree-full", "model/eagle-auto:tree-auto", "model-k3:tree-bushy"):
        with pytest.raises(ValueError, match="tree"):
            make_system(bad, pool)
