"""EAGLE beside the int4 or int8 target: its layer on int8 with a float32 ``fc`` (where the
int4 kernel does not build) against the whole head on int4 (what ``load_heads`` does where
it builds, ``heads.load.eagle_on_int4``).

python bench/eagle_int4.py [--prompts-per-workload 2] [--max-tokens 48] [--target-runtime int4]

Needs heads trained for the default target (``specdec heads train --kind eagle``). Decodes
the shipped code and chat prompts greedily with k auto, plain and with each head form, and
reports tokens/s, drafts accepted / drafted, milliseconds a draft (drafter seconds / drafted
tokens) and whether each output equals plain decoding on the same target runtime.
"""

from __future__ import annotations

import argparse
import json
from importlib import resources
from unittest import mock

from specdec import Engine, SamplingParams, SpecConfig
from specdec.heads import load as heads_load
from specdec.loading import load_backend
from specdec.machine import cpu_name
from specdec.prompting import encode_prompt

TARGET = "qwen2.5-coder-1.5b-instruct"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts-per-workload", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--target-runtime", choices=["int4", "int8"], default="int4")
    args = parser.parse_args()
    runtime = args.target_runtime
    target = load_backend(TARGET, runtime)
    target.keep_hidden_states()
    with mock.patch.object(heads_load, "eagle_on_int4", return_value=True):
        forms = {"int4 head": heads_load.load_heads("eagle", target, None, TARGET)}
    with mock.patch.object(heads_load, "eagle_on_int4", return_value=False):
        forms["int8 layer, float32 fc"] = heads_load.load_heads("eagle", target, None, TARGET)
    print(
        f"CPU: {cpu_name()}; python bench/eagle_int4.py --target-runtime {runtime} "
        f"--prompts-per-workload {args.prompts_per_workload} --max-tokens {args.max_tokens}"
    )
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    for workload in ("code", "chat"):
        text = resources.files("specdec.bench").joinpath(f"workloads/{workload}.jsonl")
        items = [json.loads(line) for line in text.read_text().splitlines() if line.strip()]
        for item in items[: args.prompts_per_workload]:
            prompt = encode_prompt(target.tokenizer, item["prompt"], item["template"])
            plain = Engine(target).generate(prompt, params)
            rate = plain.stats.generated_tokens / plain.stats.total_seconds
            print(f"{workload}: plain {runtime} {rate:.1f} tok/s")
            for name, heads in forms.items():
                out = Engine(target, heads.drafter(target)).generate(
                    prompt, params, SpecConfig(k="auto")
                )
                s = out.stats
                print(
                    f"  {name}: {s.generated_tokens / s.total_seconds:.1f} tok/s, "
                    f"accepted {s.accepted_tokens}/{s.drafted_tokens}, "
                    f"{1e3 * s.drafter_seconds / max(1, s.drafted_tokens):.2f} ms a draft, "
                    f"{'identical' if out.token_ids == plain.token_ids else 'DIFFERENT'}"
                )


if __name__ == "__main__":
    main()
