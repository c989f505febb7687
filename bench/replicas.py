"""Aggregate tokens/s of specdec serve: one process, and 1 or 2 Ray Serve replicas.

python bench/replicas.py [--clients 8] [--max-tokens 48] [--out bench/results/DIR]

Each configuration is started as its own `specdec serve` process on the real default pair
(int8, the int8 draft, k auto), warmed up with one request, then sent the 8 shipped code
prompts by --clients concurrent clients (the official openai client, greedy) twice; the
aggregate is completion tokens over wall time. Every output is checked against the same
prompt's output on the single-process server. Loopback only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path

from openai import OpenAI
from serving import stop, wait_ready  # bench/serving.py, beside this script

from specdec.machine import cpu_name

PORT = 8790
CONFIGS = {
    "one process (no Ray)": [],
    "Ray Serve, 1 replica (2 CPUs)": ["--replicas", "1", "--replica-cpus", "2"],
    "Ray Serve, 2 replicas (1 CPU each)": ["--replicas", "2", "--replica-cpus", "1"],
}


def prompts() -> list[str]:
    text = resources.files("specdec.bench").joinpath("workloads/code.jsonl").read_text()
    return [json.loads(line)["prompt"] for line in text.splitlines() if line.strip()]


def run(flags: list[str], clients: int, max_tokens: int) -> dict:
    log = open(f"/tmp/replicas-{len(flags)}.log", "w")  # noqa: SIM115 (the server's life)
    server = subprocess.Popen(
        ["specdec", "serve", "--port", str(PORT), *flags], stdout=log, stderr=log
    )
    try:
        started = time.time()
        wait_ready(PORT)
        client = OpenAI(base_url=f"http://127.0.0.1:{PORT}/v1", api_key="unused", timeout=600)
        texts: dict[str, str] = {}
        replicas: set[str | None] = set()

        def one(prompt: str) -> int:
            answer = client.completions.create(
                model="qwen2.5-coder-1.5b-instruct",
                prompt=prompt,
                max_tokens=max_tokens,
                temperature=0,
            )
            texts[prompt] = answer.choices[0].text
            replicas.add(answer.system_fingerprint)
            return answer.usage.completion_tokens

        one("def warm_up():\n")  # a request through every layer first
        ready = time.time() - started
        work = prompts() * 2
        began = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            tokens = sum(pool.map(one, work))
        wall = time.perf_counter() - began
        return {
            "startup_seconds": round(ready, 1),
            "requests": len(work),
            "completion_tokens": tokens,
            "wall_seconds": round(wall, 2),
            "aggregate_tokens_per_second": round(tokens / wall, 2),
            "replicas_seen": len(replicas),
            "texts": texts,
        }
    finally:
        stop(server)
        subprocess.run(["ray", "stop", "--force"], capture_output=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    results = {name: run(flags, args.clients, args.max_tokens) for name, flags in CONFIGS.items()}
    reference = results["one process (no Ray)"]["texts"]
    lines = [
        f"CPU: {cpu_name()}, {os.cpu_count()} cores; command: python bench/replicas.py "
        + " ".join(sys.argv[1:]),
        "",
        "| configuration | startup s | requests | tokens | wall s | aggregate tok/s "
        "| replicas seen | outputs equal one process |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, result in results.items():
        same = sum(result["texts"][p] == reference[p] for p in reference)
        lines.append(
            f"| {name} | {result['startup_seconds']} | {result['requests']} "
            f"| {result['completion_tokens']} | {result['wall_seconds']} "
            f"| {result['aggregate_tokens_per_second']} | {result['replicas_seen']} "
            f"| {same}/{len(reference)} |"
        )
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.md").write_text(table + "\n")
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
