"""Would a draft of fewer bits guess as well? Teacher-forced agreement of the 0.5B draft with
its layers' weights rounded to 4 or 3 bits (issue 47: a cheaper draft).

python bench/draft_bits.py [--prompts-per-workload 20] [--max-tokens 128] [--forms 4@128,3@128]

The draft's one-token step reads its weights once (it runs at 1.1x its memory floor), so its
cost is its bytes: the int4 draft's layers hold 4.25 bits a weight (a float16 scale and
minimum per 128 inputs), a 3-bit form with the same scales 3.25 (24% fewer bytes). This
measures what the rounding alone costs in guessing, before any kernel is written: the draft
in float32 (transformers) with each layer's linear weights replaced by their rounded values
(codes 0..2^bits - 1 per group of inputs, the scale and minimum fitted by least squares as
``backends.quant.int4`` fits the draft's; its output layer and embeddings left in float), read
over the int4 target's greedy replies to the shipped prompts as ``bench/draft_agreement.py``
does. ``float`` is the draft unrounded. Forms: BITS@GROUP.
"""

from __future__ import annotations

import argparse
import time

import torch
from draft_agreement import agreement, greedy_replies

from specdec.backends.trim import trim_to_vocabulary_file
from specdec.loading import load_backend
from specdec.machine import cpu_name
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.runtime import draft_vocabulary

FIT_ROUNDS = 4


def rounded(weight: torch.Tensor, bits: int, group: int) -> torch.Tensor:
    """``weight``  # [out, in] with each group of ``group`` inputs rounded to 2^bits levels
    (min-max first, then least-squares refits of scale and minimum, each kept where it lowers
    the group's squared error), scales and minimums in float16, as float32."""
    levels = 2**bits - 1
    rows, width = weight.shape
    w = weight.float().reshape(rows, width // group, group)
    low, high = torch.aminmax(w, dim=-1)
    minimum = low.half().float()
    scale = ((high - minimum) / levels).half().float()

    def codes_for(scale, minimum):
        safe = scale.clamp(min=torch.finfo(torch.float16).tiny).unsqueeze(-1)
        return ((w - minimum.unsqueeze(-1)) / safe).round().clamp(0, levels)

    def error(scale, minimum, codes):
        return ((scale.unsqueeze(-1) * codes + minimum.unsqueeze(-1) - w) ** 2).sum(-1)

    codes = codes_for(scale, minimum)
    best = error(scale, minimum, codes)
    n = group
    for _ in range(FIT_ROUNDS):
        sum_c, sum_cc = codes.sum(-1), (codes * codes).sum(-1)
        sum_cw, sum_w = (codes * w).sum(-1), w.sum(-1)
        spread = n * sum_cc - sum_c * sum_c
        fit = (n * sum_cw - sum_c * sum_w) / spread.clamp(min=1e-12)
        new_scale = torch.where(spread > 0, fit, scale).half().float()
        new_minimum = ((sum_w - new_scale * sum_c) / n).half().float()
        new_codes = codes_for(new_scale, new_minimum)
        new_error = error(new_scale, new_minimum, new_codes)
        better = new_error < best
        scale = torch.where(better, new_scale, scale)
        minimum = torch.where(better, new_minimum, minimum)
        codes = torch.where(better.unsqueeze(-1), new_codes, codes)
        best = torch.where(better, new_error, best)
    return (scale.unsqueeze(-1) * codes + minimum.unsqueeze(-1)).reshape(rows, width)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts-per-workload", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--forms", default="float,4@128,3@128,3@64,3@32")
    args = parser.parse_args()
    print(f"CPU: {cpu_name()}; torch {torch.__version__}")
    target = load_backend(DEFAULT_TARGET, "int4")
    replies = greedy_replies(target, args.prompts_per_workload, args.max_tokens)
    del target
    for form in args.forms.split(","):
        started = time.perf_counter()
        draft = load_backend(DEFAULT_DRAFT, "float32")
        # the shipped vocabulary, as the int4 draft scores it
        trim_to_vocabulary_file(draft, draft_vocabulary(DEFAULT_DRAFT, "auto", "int4"))
        if form != "float":
            bits, group = (int(part) for part in form.split("@"))
            with torch.no_grad():
                for layer in draft.model.model.layers:
                    for module in layer.modules():
                        if isinstance(module, torch.nn.Linear):
                            module.weight.copy_(rounded(module.weight, bits, group))
        print(f"{form}: {agreement(draft, replies)} ({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
