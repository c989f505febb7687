"""Write bench/results/README.md, the index of the results: per CPU kind, the newest run of
each system on each workload, greedy and sampled apart (from the results.json files
`specdec bench` writes), linked to its folder; then every folder with its README's title.

python bench/index.py [--results bench/results] [--check]

``--check``: exit 1 if the README on disk is not what the results give (CI's test runs it,
so the index cannot go stale).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).parent / "results"

ISA_BY_SUFFIX = {"avx512": "AVX-512", "avx2": "AVX2", "amx": "AVX-512, AMX"}


@dataclass(frozen=True)
class Row:
    cpu: str
    workload: str
    system: str
    runtime: str
    sampling: str  # "greedy", or the temperature sampled at ("T=0.7")
    date: str
    folder: str  # relative to the results directory
    tokens_per_second: float
    speedup: float | None
    identical: float | None
    reference: str  # the run's system the speedup and identical are against


def cpu_kind(machine: str, folder: str) -> str:
    """A CPU kind's label from a run's machine line ("AMD EPYC (family 25 model 17,
    AVX-512), 2 cores, ...") or, where that line names no kind (the earliest runs), from the
    folder's suffix ("...-epyc-avx512")."""
    name = re.split(r" \(|,", machine, maxsplit=1)[0].strip() or "unknown CPU"
    isa = ""
    named_amx = any(part.endswith("-amx") for part in folder.split("/"))  # runs before
    if "AMX" in machine.split("),")[0] or named_amx:  # the machine line said AMX
        isa = "AVX-512, AMX"
    elif "AVX-512" in machine.split("),")[0]:
        isa = "AVX-512"
    elif "AVX2" in machine.split("),")[0]:
        isa = "AVX2"
    else:
        for part in reversed(folder.split("/")):
            suffix = part.rsplit("-", 1)[-1]
            if suffix in ISA_BY_SUFFIX:
                isa = ISA_BY_SUFFIX[suffix]
                break
    label = f"{name} ({isa or 'kind not recorded'})"
    if "kernels held" in machine:
        label += ", kernels held to AVX2"
    return label


def rows(results: Path) -> list[Row]:
    found = []
    for path in sorted(results.rglob("results.json")):
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or "summary" not in data or "meta" not in data:
            continue  # not `specdec bench`'s (bench/load.py's tables, ...)
        meta = data["meta"]
        folder = path.parent.relative_to(results).as_posix()
        cpu = cpu_kind(meta.get("machine", ""), folder)
        for entry in data["summary"]:
            system = entry["system"]
            runtime = system.split("@", 1)[1] if "@" in system else str(meta.get("dtype") or "")
            temperature = float(meta.get("temperature") or 0.0)
            found.append(
                Row(
                    cpu,
                    entry["workload"],
                    system.split("@", 1)[0],
                    runtime,
                    f"T={temperature:g}" if temperature > 0 else "greedy",
                    str(meta.get("date", ""))[:10],
                    folder,
                    float(entry["tokens_per_second"]),
                    entry.get("speedup"),
                    entry.get("identical"),
                    str(entry.get("reference") or ""),
                )
            )
    return found


def newest(found: list[Row]) -> dict[str, list[Row]]:
    """Per CPU kind, the newest row of each (workload, system, runtime, sampling) (a tie:
    the folder that sorts last): a sampled run does not stand for a greedy one."""
    best: dict[tuple[str, str, str, str, str], Row] = {}
    for row in found:
        key = (row.cpu, row.workload, row.system, row.runtime, row.sampling)
        if key not in best or (row.date, row.folder) >= (best[key].date, best[key].folder):
            best[key] = row
    by_cpu: dict[str, list[Row]] = {}
    for key in sorted(best):
        by_cpu.setdefault(key[0], []).append(best[key])
    return by_cpu


def holds_files(path: Path) -> bool:
    """A folder with a file in it (an empty one, which git does not keep, is not listed)."""
    return path.is_dir() and any(inner.is_file() for inner in path.rglob("*"))


def title(folder: Path) -> str:
    readme = folder / "README.md"
    if readme.is_file():
        for line in readme.read_text().splitlines():
            if line.startswith("#"):
                return line.lstrip("# ").strip()
    return ""


def markdown(results: Path) -> str:
    lines = [
        "# Benchmark results",
        "",
        "Written by `python bench/index.py` from the results.json files below; do not edit.",
        "Per CPU kind, the newest `specdec bench` run of each system on each workload, greedy",
        "and sampled apart: its tokens/s and speedup over that run's reference system (both",
        "medians), the fraction of outputs identical to the reference's, and the folder it",
        "came from. Figures from different rows were measured in different runs, often on",
        "different days: compare within one folder.",
    ]
    for cpu, cpu_rows in newest(rows(results)).items():
        lines += ["", f"## {cpu}", ""]
        lines += [
            "| workload | system | runtime | sampling | tok/s | speedup | reference | identical "
            "| run |"
        ]
        lines += ["|---|---|---|---|---|---|---|---|---|"]
        for row in cpu_rows:
            speedup = "" if row.speedup is None else f"{row.speedup:.2f}x"
            identical = "" if row.identical is None else f"{100 * row.identical:.0f}%"
            lines.append(
                f"| {row.workload} | {row.system} | {row.runtime} | {row.sampling} "
                f"| {row.tokens_per_second:.1f} "
                f"| {speedup} | {row.reference} | {identical} | [{row.date}]({row.folder}/) |"
            )
    lines += ["", "## Every folder", ""]
    for folder in sorted(path for path in results.iterdir() if holds_files(path)):
        name = folder.name
        lines.append(f"- [{name}]({name}/)" + (f": {title(folder)}" if title(folder) else ""))
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text = markdown(args.results)
    index = args.results / "README.md"
    if args.check:
        if not index.is_file() or index.read_text() != text:
            sys.stderr.write(f"{index} is stale: run python bench/index.py\n")
            return 1
        return 0
    index.write_text(text)
    print(f"wrote {index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
