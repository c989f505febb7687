"""Continuous batching under load: `specdec serve` on the real default pair, 1 to 16 clients.

python bench/load.py [--concurrency 2,4,8,16] [--workloads code,chat] [--max-tokens 48]
                     [--modes batched,batched-no-prefix,batched-whole-prefill,turns]
                     [--bursts 3] [--out DIR]
                     [--drafter RECIPE] [--runtime int4|int8] [--compare-generate]

Each mode is one `specdec serve --max-active 16` process (the pair on --runtime, else on
the runtimes serve chooses; the default drafter or --drafter's, k auto): `batched` as
shipped (one target pass per step for every active request, the draft passes batched too,
a prompt prefix another request's cache holds copied),
`batched-no-prefix` with --no-prefix-sharing (every prompt computed in full),
`batched-whole-prefill` with --prefill-rows 0 (each joining prompt prefilled whole in the
step it joins, not in parts between steps), `turns` with
--no-batching (requests take turns, one round each: the behaviour before continuous
batching). After a warm-up request, each workload's prompts are
sent one at a time (the solo runs: per-request reference text and speed), then, for each
concurrency N, N streaming clients (the official openai client, greedy) each send one
prompt (the workload's prompts in turn) at the same moment, --bursts times. Reported per
row: aggregate tokens/s (completion tokens / wall time of a burst; median, min and max over
the bursts), median per-request tokens/s, time to
first token p50/p99, and how many outputs equal the same prompt's solo output on that server.
``--compare-generate``: each workload's prompts also through `specdec generate --json` (a
process a prompt, the same runtime, drafter and max tokens), whose tokens/s the solo rows
are set against (the server's goal: a single client within 10% of generate).
Loopback only; the machine should be otherwise idle.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from openai import OpenAI
from serving import stop, wait_ready  # bench/serving.py, beside this script

from specdec.bench.harness import PromptItem, load_workloads
from specdec.machine import cpu_name

PORT = 8791
MODEL = "qwen2.5-coder-1.5b-instruct"
MODES = {
    "batched": [],
    "batched-no-prefix": ["--no-prefix-sharing"],
    "batched-whole-prefill": ["--prefill-rows", "0"],
    "turns": ["--no-batching"],
}


def one(client: OpenAI, item: PromptItem, max_tokens: int) -> dict:
    """One streamed greedy request: its text, completion tokens, seconds, first-token time."""
    began = time.perf_counter()
    first = None
    pieces = []
    common = {"model": MODEL, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    if item.template == "chat":
        stream = client.chat.completions.create(
            messages=[{"role": "user", "content": item.prompt}], **common
        )
        texts = (chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    else:
        stream = client.completions.create(prompt=item.prompt, **common)
        texts = (chunk.choices[0].text or "" for chunk in stream if chunk.choices)
    for text in texts:
        if text and first is None:
            first = time.perf_counter() - began
        pieces.append(text)
    seconds = time.perf_counter() - began
    text = "".join(pieces)
    return {"id": item.id, "text": text, "seconds": seconds, "ttft": first or seconds}


def count_tokens(texts: list[str]) -> list[int]:
    from transformers import AutoTokenizer

    from specdec.models import cache_root, ensure_converted, lookup

    tokenizer = AutoTokenizer.from_pretrained(ensure_converted(lookup(MODEL), cache_root(None)))
    return [len(tokenizer.encode(text, add_special_tokens=False)) for text in texts]


def run_mode(
    flags: list[str], workloads: list[str], levels: list[int], max_tokens: int, bursts: int
) -> dict:
    name = "-".join(flag.strip("-").replace("/", "_") for flag in flags) or "batched"
    log = open(f"/tmp/load-{name}.log", "w")  # noqa: SIM115
    server = subprocess.Popen(
        ["specdec", "serve", "--port", str(PORT), "--max-active", "16", *flags],
        stdout=log,
        stderr=log,
    )
    try:
        wait_ready(PORT)
        client = OpenAI(base_url=f"http://127.0.0.1:{PORT}/v1", api_key="unused", timeout=900)
        one(client, PromptItem("warm", "warm", "raw", "def warm_up():\n"), 8)
        results: dict = {}
        for name in workloads:
            items = load_workloads([name])
            solo = {item.id: one(client, item, max_tokens) for item in items}
            rows = {1: [solo[item.id] for item in items]}
            for level in levels:
                burst = [items[i % len(items)] for i in range(level)]
                rows[level] = []
                for _ in range(bursts):
                    began = time.perf_counter()
                    with ThreadPoolExecutor(level) as pool:
                        answers = list(pool.map(lambda item: one(client, item, max_tokens), burst))
                    rows[level].append(answers + [{"wall": time.perf_counter() - began}])
            results[name] = {"solo": solo, "rows": rows}
        return results
    finally:
        stop(server)


def summarize(results: dict, max_tokens: int) -> list[dict]:
    """One row per (mode, workload, clients): the median aggregate rate over its bursts
    (with min and max), time to first token over all its requests."""
    table = []
    for mode, by_workload in results.items():
        for name, result in by_workload.items():
            solo = result["solo"]
            for level, bursts in result["rows"].items():
                if int(level) == 1:  # the solo runs, one after another: one "burst"
                    bursts = [bursts + [{"wall": sum(a["seconds"] for a in bursts)}]]
                rates, answers = [], []
                for burst in bursts:
                    mine = [a for a in burst if "text" in a]
                    tokens = count_tokens([a["text"] for a in mine])
                    rates.append(sum(tokens) / burst[-1]["wall"])
                    answers += [(a, t) for a, t in zip(mine, tokens, strict=True)]
                ttfts = sorted(a["ttft"] for a, _ in answers)
                table.append(
                    {
                        "mode": mode,
                        "workload": name,
                        "clients": int(level),
                        "bursts": len(bursts),
                        "aggregate_tokens_per_second": round(statistics.median(rates), 2),
                        "aggregate_min": round(min(rates), 2),
                        "aggregate_max": round(max(rates), 2),
                        "per_request_tokens_per_second": round(
                            statistics.median(t / a["seconds"] for a, t in answers), 2
                        ),
                        "ttft_p50": round(statistics.median(ttfts), 3),
                        "ttft_p99": round(ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))], 3),
                        "identical_to_solo": sum(
                            a["text"] == solo[a["id"]]["text"] for a, _ in answers
                        ),
                        "requests": len(answers),
                    }
                )
    return table


def markdown(table: list[dict], command: str) -> str:
    lines = [
        f"CPU: {cpu_name()}, {os.cpu_count()} cores; command: {command}",
        "",
        "| mode | workload | clients | aggregate tok/s median (min–max) | x one stream "
        "| per-request tok/s | TTFT p50 s | TTFT p99 s | identical to solo |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in table:
        base = next(
            r["aggregate_tokens_per_second"]
            for r in table
            if r["mode"] == row["mode"] and r["workload"] == row["workload"] and r["clients"] == 1
        )
        lines.append(
            f"| {row['mode']} | {row['workload']} | {row['clients']} "
            f"| {row['aggregate_tokens_per_second']} "
            f"({row['aggregate_min']}–{row['aggregate_max']}) "
            f"| {row['aggregate_tokens_per_second'] / base:.2f}x "
            f"| {row['per_request_tokens_per_second']} | {row['ttft_p50']} | {row['ttft_p99']} "
            f"| {row['identical_to_solo']}/{row['requests']} |"
        )
    return "\n".join(lines)


def plot(table: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    for mode in sorted({r["mode"] for r in table}):
        for name in sorted({r["workload"] for r in table}):
            rows = sorted(
                (r for r in table if r["mode"] == mode and r["workload"] == name),
                key=lambda r: r["clients"],
            )
            axis.plot(
                [r["clients"] for r in rows],
                [r["aggregate_tokens_per_second"] for r in rows],
                marker="o",
                label=f"{mode}, {name}",
            )
    axis.set_xscale("log", base=2)
    axis.set_xlabel("concurrent streaming clients")
    axis.set_ylabel("aggregate tokens/s")
    axis.set_title(f"specdec serve, int8 1.5B + 0.5B, {cpu_name()}", fontsize=9)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def generate_rates(workloads: list[str], max_tokens: int, flags: list[str]) -> dict:
    """Each prompt through ``specdec generate --json`` (one process each): its tokens/s."""
    rates: dict[str, dict[str, float]] = {}
    for name in workloads:
        rates[name] = {}
        for item in load_workloads([name]):
            template = "--chat" if item.template == "chat" else "--raw"
            command = ["specdec", "generate", item.prompt, "--json", template]
            command += ["--max-tokens", str(max_tokens), *flags]
            if "--drafter" not in flags:
                command += ["--drafter", "model"]  # serve's auto without heads
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                tail = done.stderr.strip().splitlines()[-1:] or ["no message"]
                raise SystemExit(
                    f"specdec generate failed on {item.id} ({done.returncode}): {tail[0]}"
                )
            rates[name][item.id] = json.loads(done.stdout)["stats"]["tokens_per_second"]
    return rates


def generate_lines(table: list[dict], generated: dict) -> str:
    """The solo rows against generate's rate on the same prompts."""
    lines = ["| workload | serve, one client (tok/s, median request) | generate (median) | ratio |"]
    lines.append("|---|---|---|---|")
    for name, by_id in generated.items():
        solo = next(row for row in table if row["workload"] == name and row["clients"] == 1)
        serve_rate = solo["per_request_tokens_per_second"]
        generate_rate = statistics.median(by_id.values())
        lines.append(
            f"| {name} | {serve_rate:.1f} | {generate_rate:.1f} | "
            f"{serve_rate / generate_rate:.2f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", default="2,4,8,16")
    parser.add_argument("--workloads", default="code,chat")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--modes", default="batched,turns")
    parser.add_argument(
        "--bursts", type=int, default=3, help="bursts per concurrency level (default: 3)"
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--drafter", help="the server's --drafter (default: its own, auto), e.g. lookup+model"
    )
    parser.add_argument("--runtime", help="--dtype of both models (default: serve's auto)")
    parser.add_argument("--compare-generate", action="store_true")
    args = parser.parse_args()
    drafter = ["--drafter", args.drafter] if args.drafter else []
    drafter += ["--dtype", args.runtime] if args.runtime else []
    levels = [int(n) for n in args.concurrency.split(",")]
    workloads = args.workloads.split(",")
    results = {
        mode: run_mode(MODES[mode] + drafter, workloads, levels, args.max_tokens, args.bursts)
        for mode in args.modes.split(",")
    }
    table = summarize(results, args.max_tokens)
    text = markdown(table, "python bench/load.py " + " ".join(sys.argv[1:]))
    write(args.out, text, table, results)  # the serve runs kept, whatever generate does next
    if args.compare_generate:
        generated = generate_rates(workloads, args.max_tokens, drafter)
        results["generate"] = generated
        text += "\n\n" + generate_lines(table, generated)
        write(args.out, text, table, results)
    print(text)
    return 0


def write(out: Path | None, text: str, table: list[dict], results: dict) -> None:
    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text(text + "\n")
    (out / "results.json").write_text(json.dumps({"table": table, "raw": results}, indent=1))
    plot(table, out / "load.png")


if __name__ == "__main__":
    sys.exit(main())
