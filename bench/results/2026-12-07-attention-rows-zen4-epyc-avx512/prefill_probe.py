"""A long prompt's prefill on the int4 target alone: time to the first token of a
4,000-token prompt (plain decoding, 1 token), 3 tries, the fastest and the median."""

import statistics
import time
from pathlib import Path

import torch

from specdec import Engine, SamplingParams, SpecConfig
from specdec.loading import load_backend

target = load_backend("qwen2.5-coder-1.5b-instruct", "int4")
tok = target.tokenizer
text = Path(torch.__file__).with_name("nn").joinpath("modules", "module.py").read_text()
ids = tok.encode(text)[:4000]
engine = Engine(target, None)
times = []
for _ in range(3):
    target.truncate(0)
    began = time.perf_counter()
    out = engine.generate(ids, SamplingParams(max_tokens=1, temperature=0), SpecConfig(k=0))
    times.append(time.perf_counter() - began)
print(
    f"prefill of {len(ids)} tokens + 1: median {statistics.median(times):.2f} s, "
    f"fastest {min(times):.2f} s; token {out.token_ids}"
)
