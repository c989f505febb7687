"""bench/index.py: the results index keeps the newest run of each system per CPU kind, links
its folder, and the committed index is what the committed results give."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def index_module():
    spec = importlib.util.spec_from_file_location("bench_index", ROOT / "bench" / "index.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def write_run(
    folder: Path, machine: str, date: str, tokens_per_second: float, temperature: float = 0.0
) -> None:
    folder.mkdir(parents=True)
    summary = [
        {"workload": "code", "system": "plain", "reference": "plain", "tokens_per_second": 20.0,
         "speedup": 1.0, "identical": 1.0},
        {"workload": "code", "system": "model-auto@int4", "reference": "plain",
         "tokens_per_second": tokens_per_second, "speedup": tokens_per_second / 20.0,
         "identical": 1.0},
    ]  # fmt: skip
    meta = {"machine": machine, "date": date, "dtype": "int8", "temperature": temperature}
    (folder / "results.json").write_text(json.dumps({"meta": meta, "summary": summary}))
    (folder / "README.md").write_text(f"# A run of {date}\n\nmore\n")


def test_the_newest_run_of_each_system_per_cpu_kind_is_listed(tmp_path):
    index = index_module()
    zen4 = "AMD EPYC (family 25 model 17, AVX-512), 2 cores, Linux"
    write_run(tmp_path / "2026-12-01-a-epyc-avx512", zen4, "2026-12-01T10:00:00", 30.0)
    write_run(tmp_path / "2026-12-02-b-epyc-avx512", zen4, "2026-12-02T10:00:00", 40.0)
    write_run(tmp_path / "2026-12-03-t-epyc-avx512", zen4, "2026-12-03T10:00:00", 35.0, 0.7)
    write_run(tmp_path / "2026-11-29-old-epyc-avx2", "AMD EPYC, 2 cores", "2026-11-29", 25.0)
    (tmp_path / "2026-12-03-load").mkdir()  # no results.json: listed among the folders only
    (tmp_path / "2026-12-03-load" / "results.json").write_text(json.dumps({"table": []}))
    text = index.markdown(tmp_path)
    avx512 = text.split("## AMD EPYC (AVX-512)")[1].split("## ")[0]
    assert "| code | model-auto | int4 | greedy | 40.0 | 2.00x | plain | 100% |" in avx512
    # a newer sampled run is listed beside the greedy one, not in its place
    assert "| code | model-auto | int4 | T=0.7 | 35.0 | 1.75x | plain | 100% |" in avx512
    assert "[2026-12-02](2026-12-02-b-epyc-avx512/)" in avx512
    assert "| 30.0 |" not in avx512  # the older run of the same system is not
    assert "| code | plain | int8 | greedy | 20.0 |" in avx512  # no @: the run's dtype
    avx2 = text.split("## AMD EPYC (AVX2)")[1].split("## ")[0]  # kind from the folder's name
    assert "| 25.0 |" in avx2
    assert "- [2026-12-03-load](2026-12-03-load/)" in text
    assert "- [2026-12-01-a-epyc-avx512](2026-12-01-a-epyc-avx512/): A run of 2026-12-01" in text


def test_the_committed_index_is_what_the_committed_results_give():
    """Run ``python bench/index.py`` after adding results."""
    index = index_module()
    results = ROOT / "bench" / "results"
    assert (results / "README.md").read_text() == index.markdown(results)
