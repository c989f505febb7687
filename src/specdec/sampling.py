"""Pure functions from logits to probabilities, and sampling with an explicit generator.

The same ``logits_to_probs`` is applied to the draft and the target logits: exactness
needs ``draft_probs`` to be exactly the distribution the draft token was sampled from,
and ``target_probs`` to be the distribution plain decoding would sample from.
"""

from __future__ import annotations

import torch

from specdec.config import SamplingParams


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p (the order transformers uses).

    logits  # [n, vocab] -> probs [n, vocab] float32, rows sum to 1.
    Greedy parameters give one-hot rows on the argmax.
    """
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).float()
    logits = logits / params.temperature
    if 0 < params.top_k < logits.shape[-1]:
        kth_largest = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        probs = _top_p_filter(probs, params.top_p)
    return probs


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches ``top_p``."""
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    # A token stays while the mass before it is still short of top_p; the first always stays.
    keep_sorted = mass_before < top_p
    keep_sorted[..., 0] = True
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    probs = probs * keep
    return probs / probs.sum(dim=-1, keepdim=True)


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token id from a single distribution.  probs  # [vocab]"""
    return int(torch.multinomial(probs, 1, generator=generator).item())


def make_generator(seed: int | None) -> torch.Generator:
    """The request's own random stream; library code never touches the global RNG."""
    generator = torch.Generator()
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


class Sampler:
    """Sampling parameters bound to one request's generator, handed to drafters."""

    def __init__(self, params: SamplingParams, generator: torch.Generator | None = None):
        self.params = params
        self.generator = generator if generator is not None else make_generator(params.seed)

    @property
    def greedy(self) -> bool:
        return self.params.greedy

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return logits_to_probs(logits, self.params)

    def pick(self, logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        """A token from one row of logits, and the distribution it came from (None when
        greedy, where the choice is a point mass on the argmax).  logits  # [vocab]"""
        if self.greedy:
            return int(logits.argmax().item()), None
        probs = self.probs(logits.unsqueeze(0))[0]
        return sample(probs, self.generator), probs
