"""Benchmark reports: JSON (everything), a Markdown table, PNG plots."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from specdec.theory import expected_tokens_per_round


def _fmt(value, spec: str = ".2f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def _positions(rates: list[float] | None) -> str:
    return "-" if not rates else " ".join(f"{rate:.2f}" for rate in rates)


def markdown_table(rows: list[dict], descriptions: dict[str, str]) -> str:
    lines = [
        "| workload | system | tok/s median (min–max) | ms/token | speedup vs plain (min–max) "
        "| acceptance | by position (1, 2, 3) | mean accepted length | draft ms/token "
        "| identical to plain* |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        identical = (
            "n/a"
            if row["identical"] is None
            else "reference"
            if row["system"] == row["reference"]
            else f"{row['identical'] * 100:.0f}%"
        )
        lines.append(
            f"| {row['workload']} | {row['system']} | {row['tokens_per_second']:.2f} "
            f"({row['tokens_per_second_min']:.2f}–{row['tokens_per_second_max']:.2f}) | "
            f"{_fmt(row['ms_per_token'], '.0f')} | "
            f"{_fmt(row['speedup'])}x ({_fmt(row['speedup_min'])}–{_fmt(row['speedup_max'])}) | "
            f"{_fmt(row['acceptance_rate'])} | {_positions(row.get('acceptance_by_position'))} | "
            f"{_fmt(row['mean_accepted_length'])} | {_fmt(row.get('draft_ms_per_token'), '.1f')} | "
            f"{identical} |"
        )
    lines.append("")
    lines.append(
        "\\* identical: the same tokens as the plain run on the system's own target runtime "
        "(`plain@RUNTIME`) when the run has one, else as `plain`; runtimes round differently. "
        "A peer's own speculation (`llamacpp-lookup`, `openvino-lookup`, `onnx-int4-model`, "
        "...) is judged against that peer's own plain run (`llamacpp`, `openvino`, "
        "`onnx-int4`) when the run has it; a peer's acceptance is from its own counters where "
        "it exposes them (ONNX Runtime GenAI does). Sampled with a "
        "seed, specdec systems verify with coupled randomness (unless `--verification "
        "rejection`), so their text must equal specdec plain's; peers and rejection-sampled "
        "runs are not compared by text (n/a); sampled specdec runs are tested against the "
        "target's distribution instead (a section below the table when the run sampled)."
    )
    lines.append("")
    lines += [f"- `{name}`: {text}" for name, text in descriptions.items()]
    return "\n".join(lines) + "\n"


def theory_points(runs: list[dict]) -> list[dict]:
    """Per speculative run with a fixed k: measured speedup vs the paper's prediction
    E[tokens](alpha, k) / (k c + v), with alpha, c and v measured in the same run
    (c, v relative to the decode step of its reference plain run: same prompt, same pass,
    same target runtime)."""
    steps = {}
    for run in runs:
        stats = run["stats"]
        if run["system"] == run["reference"] and stats and stats["rounds"]:
            steps[(run["system"], run["prompt_id"], run["repeat"])] = (
                stats["target_seconds"] / stats["rounds"]
            )
    points = []
    for run in runs:
        stats = run["stats"]
        step = steps.get((run["reference"], run["prompt_id"], run["repeat"]))
        if (
            not stats
            or not step
            or not stats["drafted_tokens"]
            or run["system"] == run["reference"]
        ):
            continue
        drafting = {int(k): n for k, n in stats["k_per_round"].items() if k != "0"}
        if not drafting:
            continue  # a peer counting its own drafts: no k per round, no costs to divide
        k = max(drafting, key=lambda size: drafting[size])
        if drafting[k] < 0.8 * sum(drafting.values()):
            continue  # adaptive k: no single k for the formula (rounds cut by max_tokens aside)
        c = stats["drafter_seconds"] / stats["drafted_tokens"] / step
        v = stats["target_seconds"] / stats["rounds"] / step
        predicted = expected_tokens_per_round(min(stats["acceptance_rate"], 0.999999), k) / (
            k * c + v
        )
        decode_seconds = stats["total_seconds"] - stats["prefill_seconds"]
        measured = (
            (stats["generated_tokens"] / decode_seconds) * step if decode_seconds > 0 else 0.0
        )
        points.append(
            {
                "system": run["system"],
                "prompt_id": run["prompt_id"],
                "k": k,
                "alpha": stats["acceptance_rate"],
                "c": c,
                "v": v,
                "predicted": predicted,
                "measured": measured,
            }
        )
    return points


def plot_speedups(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    systems = [s for s in dict.fromkeys(r["system"] for r in rows)]
    width = 0.8 / max(1, len(systems))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(workloads) * len(systems) / 3), 4.5))
    for i, system in enumerate(systems):
        values = [
            next(
                (r["speedup"] or 0 for r in rows if r["workload"] == w and r["system"] == system), 0
            )
            for w in workloads
        ]
        ax.bar([x + i * width for x in range(len(workloads))], values, width, label=system)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([x + width * (len(systems) - 1) / 2 for x in range(len(workloads))], workloads)
    ax.set_ylabel("speedup over plain decoding (median)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_theory(points: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 5))
    for system in dict.fromkeys(p["system"] for p in points):
        mine = [p for p in points if p["system"] == system]
        ax.scatter(
            [p["predicted"] for p in mine], [p["measured"] for p in mine], label=system, s=18
        )
    top = max([1.0] + [max(p["predicted"], p["measured"]) for p in points]) * 1.1
    ax.plot([0, top], [0, top], color="grey", linewidth=0.8, label="measured = predicted")
    ax.set_xlabel("predicted speedup, (1-α^(k+1)) / ((1-α)(kc+v))")
    ax.set_ylabel("measured decode speedup")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_table(
    lines: list[str], data: object, out: Path | None, table: str, data_file: str
) -> int:
    """A bench script's Markdown ``lines`` to stdout and, with ``out``, to its files there:
    ``table`` (the Markdown) and ``data_file`` (``data`` as JSON). Returns 0, the exit
    status."""
    report = "\n".join(lines) + "\n"
    sys.stdout.write(report)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / table).write_text(report)
        (out / data_file).write_text(json.dumps(data, indent=1) + "\n")
    return 0


def write_reports(
    out_dir: Path,
    meta: dict,
    rows: list[dict],
    runs: list[dict],
    descriptions: dict[str, str],
    distribution: dict | None = None,
) -> dict[str, Path]:
    """``distribution``: per system, its sampled tokens' test against the target
    (``bench/distribution.py``), for sampled runs."""
    from dataclasses import asdict

    from specdec.bench.distribution import markdown as distribution_markdown

    distribution = distribution or {}
    out_dir.mkdir(parents=True, exist_ok=True)
    points = theory_points(runs)
    paths = {
        "json": out_dir / "results.json",
        "markdown": out_dir / "results.md",
        "speedup_plot": out_dir / "speedup.png",
        "theory_plot": out_dir / "theory.png",
    }
    tests = {name: asdict(test) for name, test in distribution.items()}
    paths["json"].write_text(
        json.dumps(
            {"meta": meta, "summary": rows, "theory": points, "distribution": tests, "runs": runs},
            indent=1,
        )
    )
    header = f"# specdec bench, {meta['date']}\n\n{meta['machine']}\n\n`{meta['command']}`\n\n"
    if meta.get("draft_vocab"):
        header += f"Draft vocabulary: {meta['draft_vocab']}.\n\n"
    text = header + markdown_table(rows, descriptions)
    if distribution:
        text += distribution_markdown(distribution)
    paths["markdown"].write_text(text)
    plot_speedups(rows, paths["speedup_plot"])
    plot_theory(points, paths["theory_plot"])
    return paths
