"""Drafting with heads on the target's own features (``specdec.heads``): Medusa and EAGLE.

Both read the feature of the newest position the target has scored. By the engine's cache
invariant the target holds every context token but the last, so that is ``f_{n-2}`` for a
context of n tokens; a drafter that finds the target's cache elsewhere (a prompt of one
token, a foreign caller) proposes nothing for that round. Their output layer is the
target's own, restricted to the heads' trimmed vocabulary: ``draft_probs`` is exactly the
distribution each draft was sampled from and is zero outside that vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from specdec.backends.base import common_prefix_length
from specdec.backends.layer_stack import StackedDecoder
from specdec.config import SamplingParams
from specdec.drafters.base import KeepGoing, Proposal
from specdec.drafters.model import _confidence
from specdec.sampling import Sampler

_GREEDY = SamplingParams(temperature=0.0)


class _HeadsDrafter:
    name = ""

    def __init__(self, target, output: nn.Module):
        """``target``: an ``HFModel`` (it is told to keep hidden states); ``output``: the
        target's output layer restricted to the heads' vocabulary (``TrimmedHead``)."""
        target.keep_hidden_states()
        self.target = target
        self.output = output
        self.vocab_size = target.vocab_size

    def _newest_feature(self, context: Sequence[int]) -> torch.Tensor | None:
        """f_{n-2}  # [1, hidden], when the target's cache is where the engine keeps it."""
        cached = self.target.cached_token_ids
        n = len(context)
        if n < 2 or len(cached) != n - 1 or cached[-1] != context[-2]:
            return None
        return self.target.hidden_states(n - 2, n - 1)

    def _pick(
        self,
        logits: torch.Tensor,
        position: int,
        sampler: Sampler,
        tokens: list[int],
        probs: list[torch.Tensor],
        confidences: list[float],
        keep_going: KeepGoing | None,
    ) -> bool:
        """Choose the draft for ``position``; False when ``keep_going`` says stop."""
        token_id, token_probs = sampler.pick(logits, position)
        tokens.append(token_id)
        if token_probs is not None:
            probs.append(token_probs)
        if keep_going is None:
            return True
        confidences.append(_confidence(logits, token_id, token_probs))
        return keep_going(confidences)

    def _proposal(self, tokens, probs, confidences, keep_going) -> Proposal:
        return Proposal(
            tokens,
            torch.stack(probs) if probs else None,
            self.name,
            confidences if keep_going is not None else None,
        )


class MedusaDrafter(_HeadsDrafter):
    """Head j proposes the token j positions after the next one, all from ``f_{n-2}``; one
    batched pass of the heads and the output layer drafts the whole chain."""

    name = "medusa"

    def __init__(self, target, heads: nn.Module, output: nn.Module):
        super().__init__(target, output)
        self.heads = heads.eval()
        self.max_k = int(getattr(heads, "num_heads"))  # noqa: B009 (a Module attribute)

    def prepare(self, context: Sequence[int]) -> None:
        pass  # no cache of its own

    @torch.inference_mode()
    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampler: Sampler | None = None,
        keep_going: KeepGoing | None = None,
    ) -> Proposal:
        sampler = sampler or Sampler(_GREEDY)
        feature = self._newest_feature(context)
        k = min(k, self.max_k)
        if feature is None or k <= 0:
            return Proposal([], drafter=self.name)
        logits = self.output(self.heads(feature[0], k))  # [k, vocab]
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        confidences: list[float] = []
        for j in range(k):
            going = self._pick(
                logits[j], len(context) + j, sampler, tokens, probs, confidences, keep_going
            )
            if not going:
                break
        return self._proposal(tokens, probs, confidences, keep_going)


class EagleDrafter(_HeadsDrafter):
    """EAGLE's layer over pairs (f_i, embedding of t_{i+1}), with its own KV cache.

    The cache holds pairs built from the target's real features for the accepted text
    (``_tokens`` records the tokens they were built on), followed by the pairs of the last draft,
    which used predicted features; each ``propose`` cuts it back to the real pairs that
    still match the context and adds the new ones, like ``ModelDrafter``'s cache."""

    name = "eagle"

    def __init__(self, target, head: nn.Module, output: nn.Module, embed: nn.Module):
        super().__init__(target, output)
        self.head: Any = head.eval()  # an EagleHead
        self.embed = embed
        self._cache_config: Any = getattr(head, "body").config  # noqa: B009 (a Module attribute)
        self._cache: Any = None
        # On the int4 runtime the layer runs on the kernel's layer stack with caches of its
        # own (the same calls as transformers' forward, without its per-pass setup).
        self._stacked = StackedDecoder.of(getattr(head, "body"))  # noqa: B009
        self._cached_pairs = 0  # pairs in the cache: real ones, then the last draft's
        self._tokens: list[int] = []  # t_0 .. t_p: the tokens the p real pairs were built on

    def prepare(self, context: Sequence[int]) -> None:
        if self._newest_feature(context) is not None:
            with torch.inference_mode():
                self._sync(context, len(context) - 2, fresh=False)

    def _sync(self, context: Sequence[int], real: int, fresh: bool) -> torch.Tensor | None:
        """Make the cache hold the real pairs 0 .. real - 1, feeding at least the last one
        when ``fresh``; returns the layer's output for the last pair fed  # [hidden]."""
        covered = common_prefix_length(self._tokens, context[: real + 1])
        keep = min(max(0, covered - 1), real - 1 if fresh else real)
        self._truncate(keep)
        if keep >= real:
            return None
        features = self.target.hidden_states(keep, real)  # f_keep .. f_{real-1}
        tokens = torch.tensor([list(context[keep + 1 : real + 1])])  # t_{keep+1} .. t_real
        out = self._step(features.unsqueeze(0), tokens)
        self._tokens = list(context[: real + 1])
        return out[0, -1]

    def _step(self, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        from transformers import DynamicCache

        embeddings = self.embed(tokens).to(features.dtype)
        if self._stacked is not None:
            out = self._stacked.forward(self.head.join(features, embeddings))
        else:
            if self._cache is None:
                self._cache = DynamicCache(config=self._cache_config)
            out = self.head(features, embeddings, self._cache)
        self._cached_pairs += features.shape[1]
        return out

    def _truncate(self, pairs: int) -> None:
        """Keep the first ``pairs`` pairs (all real ones)."""
        drop = self._cached_pairs - pairs
        if drop > 0:
            if self._stacked is not None:
                self._stacked.crop(pairs)
            elif pairs == 0:
                self._cache = None
            else:
                assert self._cache is not None
                self._cache.crop(-drop)
            self._cached_pairs = pairs
        del self._tokens[pairs + 1 if pairs else 0 :]

    @torch.inference_mode()
    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampler: Sampler | None = None,
        keep_going: KeepGoing | None = None,
    ) -> Proposal:
        sampler = sampler or Sampler(_GREEDY)
        if k <= 0 or self._newest_feature(context) is None:
            return Proposal([], drafter=self.name)
        predicted = self._sync(context, len(context) - 1, fresh=True)  # predicts f_{n-1}
        assert predicted is not None, "the newest real pair is always fed here"
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        confidences: list[float] = []
        n = len(context)
        while True:
            logits = self.output(predicted.unsqueeze(0))[0]
            going = self._pick(
                logits, n + len(tokens), sampler, tokens, probs, confidences, keep_going
            )
            if len(tokens) == k or not going:
                break
            token = torch.tensor([[tokens[-1]]])
            predicted = self._step(predicted.view(1, 1, -1), token)[0, -1]
        return self._proposal(tokens, probs, confidences, keep_going)
