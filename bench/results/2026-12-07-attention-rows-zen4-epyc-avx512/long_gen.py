"""Speculative and plain decoding after a long prompt (int4 pair, default drafter, k auto,
greedy, 128 tokens): decode tok/s after the prefill, side by side; outputs identical."""

import json
import subprocess
import sys
from pathlib import Path

import torch

text = Path(torch.__file__).with_name("nn").joinpath("modules", "module.py").read_text()[:11000]
prompt = "Explain what this code does, function by function:\n```python\n" + text + "\n```"


def run(drafter):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "specdec.cli",
            "generate",
            "-",
            "--dtype",
            "int4",
            "--drafter",
            drafter,
            "--max-tokens",
            "128",
            "--json",
        ],
        input=prompt,
        capture_output=True,
        text=True,
        check=True,
    )
    d = json.loads(out.stdout)
    s = d["stats"]
    return (
        d["token_ids"],
        s["prompt_tokens"],
        s["generated_tokens"] / (s["total_seconds"] - s["prefill_seconds"]),
        s["mean_accepted_length"],
    )


for _ in range(2):
    ids_s, p, spec, mal = run("auto")
    ids_p, _, plain, _ = run("none")
    print(
        f"prompt {p} tokens: speculative {spec:.1f} tok/s (mean accepted {mal:.2f}), "
        f"plain {plain:.1f}, {spec / plain:.2f}x, identical {ids_s == ids_p}"
    )
