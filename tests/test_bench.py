"""The benchmark harness itself, on tiny random models (quick mode)."""

import json

import pytest

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
    assert main(["bench", "--quick", "--repeats", "2", "--workloads", "code,edit",
                 "--systems", "plain,model-k4,lookup-k4,model-auto,hf-generate,hf-assisted",
                 "--out", str(out)]) == 0
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
    assert all(0 <= row["acceptance_rate"] <= 1 and row["mean_accepted_length"] >= 1 for row in model_rows)
    assert result["theory"], "fixed-k runs give measured-vs-predicted points"
    passes = [run["repeat"] for run in result["runs"]]
    assert sorted(set(passes)) == [0, 1]


def test_markdown_table_lists_each_system(report):
    table = (report / "results.md").read_text()
    assert "| code | model-k4 |" in table and "speedup vs plain" in table


def test_unknown_system_is_an_error(capsys):
    assert main(["bench", "--quick", "--systems", "plain,warp-drive"]) == 2
    assert "unknown system" in capsys.readouterr().err


def test_system_names_parse_drafter_and_k():
    from specdec.bench.systems import Models, describe, make_system

    models = Models(None, None, None)
    assert make_system("model-k6", models).spec.k == 6
    assert make_system("lookup+model-auto", models).spec.k == "auto"
    assert describe("lookup-k2") == "specdec, prompt lookup, k=2"
    with pytest.raises(ValueError, match="needs --ngram-model"):
        make_system("ngram-k4", models)
    with pytest.raises(ValueError, match="unknown system"):
        make_system("model-fast", models)
