"""The decode loop: the only module that touches both the drafter and the target.

One round: the drafter proposes k tokens; the target scores ``[last token] + drafts`` in one
forward pass (k + 1 distributions); ``verify`` accepts a prefix and adds one token; the
target cache is cut back to what was accepted. ``drafter=None`` or ``k == 0`` runs the same
loop with empty proposals: plain autoregressive decoding, the baseline.

Cache invariant between rounds: the target has processed every context token but the
last, whose logits the next round needs anyway.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from specdec.backends.base import Backend, sync_cache
from specdec.config import SamplingParams, SpecConfig
from specdec.controller import AdaptiveK
from specdec.detokenizer import Detokenizer
from specdec.drafters.base import Drafter, Proposal
from specdec.metrics import SpecStats
from specdec.sampling import Sampler, logits_to_probs
from specdec.verify import VerifyResult, verify_coupled, verify_greedy, verify_stochastic


@dataclass(frozen=True)
class Chunk:
    """What one round emitted. The first ``num_from_draft`` of ``token_ids`` are accepted
    drafts; the rest is the target's own token (``extra_kind``: "recovered" after a
    rejection, "bonus" after full acceptance, "target" in a round without drafts), unless
    the output ended before it."""

    token_ids: list[int]
    text: str
    num_from_draft: int
    rejected_ids: list[int]
    extra_kind: str
    finish_reason: str | None
    stats: SpecStats


@dataclass(frozen=True)
class Output:
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" (EOS or a stop string) or "length"
    stats: SpecStats
    chunks: list[Chunk] = field(default_factory=list, repr=False)

    @classmethod
    def from_chunks(cls, chunks: list[Chunk]) -> Output:
        """The whole output of a finished stream."""
        last = chunks[-1]
        return cls(
            [t for chunk in chunks for t in chunk.token_ids],
            "".join(c.text for c in chunks),
            last.finish_reason or "length",
            last.stats,
            chunks,
        )


class Engine:
    def __init__(
        self,
        target: Backend,
        drafter: Drafter | None = None,
        controller: AdaptiveK | None = None,
    ):
        """``controller``: the k policy of ``k="auto"`` requests. Pass one to share what it
        learns (acceptance, costs) between engines, as the server does per drafter; else
        the engine makes its own on the first adaptive request."""
        if drafter is not None and drafter.vocab_size not in (None, target.vocab_size):
            raise ValueError(
                f"draft vocabulary ({drafter.vocab_size} tokens) differs from the target's "
                f"({target.vocab_size}): pick a drafter of the same model family/tokenizer"
            )
        self.target = target
        self.drafter = drafter
        # k="auto" learns acceptance and costs; they carry over to the next request.
        self.controller = controller

    def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams | None = None,
        spec: SpecConfig | None = None,
    ) -> Output:
        return Output.from_chunks(list(self.stream(prompt_ids, params, spec)))

    def stream(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams | None = None,
        spec: SpecConfig | None = None,
    ) -> Iterator[Chunk]:
        """Yield one ``Chunk`` per round, as soon as the round is verified."""
        params = params or SamplingParams()
        spec = spec or SpecConfig()
        prompt = self._check_prompt(prompt_ids)
        detokenizer = Detokenizer(self.target.tokenizer, params.stop)
        run = _Run(self, prompt, params, spec, detokenizer)
        yield from run.rounds()

    def _check_prompt(self, prompt_ids: Sequence[int]) -> list[int]:
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("prompt_ids is empty: give at least one token (e.g. BOS)")
        bad = [t for t in prompt if not 0 <= t < self.target.vocab_size]
        if bad:
            raise ValueError(
                f"prompt_ids contains ids outside the vocabulary [0, {self.target.vocab_size}): "
                f"{bad[:5]}"
            )
        limit = self.target.max_length
        if limit is not None and len(prompt) >= limit:
            raise ValueError(
                f"prompt has {len(prompt)} tokens but the target's context is {limit}: shorten it"
            )
        return prompt


class _Run:
    """The state of one request: its context, generator, stats and text."""

    def __init__(
        self,
        engine: Engine,
        prompt: list[int],
        params: SamplingParams,
        spec: SpecConfig,
        detokenizer: Detokenizer,
    ):
        self.target = engine.target
        self.drafter = engine.drafter
        self.params = params
        self.controller = None
        if engine.drafter is None:
            self.k = 0
        elif spec.adaptive:
            if engine.controller is None or engine.controller.max_k != spec.max_k:
                engine.controller = AdaptiveK(max_k=spec.max_k)
            self.controller = engine.controller
            self.k = spec.max_k
        else:
            assert isinstance(spec.k, int), "a fixed k is an int ('auto' is adaptive)"
            self.k = spec.k
        self.sampler = Sampler(params, coupled=spec.coupled(params))
        self.detokenizer = detokenizer
        self.context = list(prompt)
        self.generated: list[int] = []
        self.stats = SpecStats(prompt_tokens=len(prompt))

    def rounds(self) -> Iterator[Chunk]:
        started = time.perf_counter()
        self._prefill()
        self.stats.prefill_seconds = time.perf_counter() - started
        finish_reason = None
        while finish_reason is None:
            chunk = self._round()
            finish_reason = chunk.finish_reason
            self.stats.total_seconds = time.perf_counter() - started
            yield chunk

    def _prefill(self) -> None:
        """Bring the target cache to ``context[:-1]``, reusing a prefix it already holds, and
        let the drafter fill its own cache. Timed as prefill, not as decode-phase costs."""
        if sync_cache(self.target, self.context[:-1]):
            self.stats.target_forwards += 1
        drafting = self.controller.choose_k() > 0 if self.controller is not None else self.k != 0
        if self.drafter is not None and drafting:
            # A controller that has learned not to draft skips the draft's prefill; should it
            # draft later, the drafter catches up on the context in its first proposal.
            self.drafter.prepare(self.context)

    def _round(self) -> Chunk:
        proposal, draft_seconds = self._propose()
        k = len(proposal.token_ids)
        started = time.perf_counter()
        logits = self.target.forward([self.context[-1]] + proposal.token_ids)  # [k + 1, vocab]
        pass_seconds = time.perf_counter() - started
        self.stats.target_forwards += 1
        result = self._verify(proposal, logits)
        started = time.perf_counter()
        # Keep the last context token and the accepted drafts; the new token is fed next round.
        self.target.truncate(len(self.context) + result.num_accepted)
        self.stats.target_seconds += pass_seconds + time.perf_counter() - started
        self.stats.drafter_seconds += draft_seconds
        self.stats.record_round(
            k, result.num_accepted, result.bonus, result.residual_fallback, proposal.drafter
        )
        if self.controller is not None:
            self.controller.observe(
                k, result.num_accepted, proposal.confidences, draft_seconds, pass_seconds
            )
        return self._emit(result, proposal)

    def _propose(self) -> tuple[Proposal, float]:
        remaining = self.params.max_tokens - len(self.generated)
        k = self.controller.choose_k() if self.controller is not None else self.k
        # A round emits up to k + 1 tokens; never draft past max_tokens or the context.
        k = min(k, remaining - 1)
        if self.target.max_length is not None:
            k = min(k, self.target.max_length - len(self.context) - 1)
        if k <= 0:
            return Proposal([]), 0.0
        assert self.drafter is not None, "k > 0 only with a drafter"
        keep_going = self.controller.keep_going if self.controller is not None else None
        started = time.perf_counter()
        proposal = self.drafter.propose(self.context, k, self.sampler, keep_going)
        assert len(proposal.token_ids) <= k, "drafter proposed more than k tokens"
        return proposal, time.perf_counter() - started

    def _verify(self, proposal: Proposal, logits: torch.Tensor) -> VerifyResult:
        draft_ids = torch.tensor(proposal.token_ids, dtype=torch.long)
        if self.params.greedy:
            return verify_greedy(draft_ids, logits)
        target_probs = logits_to_probs(logits, self.params)
        if self.sampler.coupled:
            # Row i scores sequence position len(context) + i.
            noise = self.sampler.noise(len(self.context), len(draft_ids) + 1, logits.shape[1])
            return verify_coupled(draft_ids, target_probs, noise)
        return verify_stochastic(
            draft_ids, proposal.draft_probs, target_probs, self.sampler.generator
        )

    def _emit(self, result: VerifyResult, proposal: Proposal) -> Chunk:
        remaining = self.params.max_tokens - len(self.generated)
        emitted = result.token_ids[:remaining]
        finish_reason = None
        eos_at = self._first_eos(emitted)
        if eos_at is not None:
            emitted, finish_reason = emitted[: eos_at + 1], "stop"
        self.generated.extend(emitted)
        keep, text, stopped = self.detokenizer.update(self.generated, len(emitted))
        if stopped:
            emitted = emitted[: len(emitted) - (len(self.generated) - keep)]
            del self.generated[keep:]
            finish_reason = "stop"
        self.context.extend(emitted)
        if finish_reason is None and self._out_of_room():
            finish_reason = "length"
        if finish_reason is not None and not stopped:
            text += self.detokenizer.flush(self.generated)
        self.stats.generated_tokens = len(self.generated)
        if not proposal.token_ids:
            extra_kind = "target"
        else:
            extra_kind = "bonus" if result.bonus else "recovered"
        return Chunk(
            token_ids=emitted,
            text=text,
            num_from_draft=min(result.num_accepted, len(emitted)),
            rejected_ids=proposal.token_ids[result.num_accepted :],
            extra_kind=extra_kind,
            finish_reason=finish_reason,
            stats=self.stats,
        )

    def _first_eos(self, token_ids: list[int]) -> int | None:
        if self.params.ignore_eos:
            return None
        for i, token_id in enumerate(token_ids):
            if token_id in self.target.eos_token_ids:
                return i
        return None

    def _out_of_room(self) -> bool:
        if len(self.generated) >= self.params.max_tokens:
            return True
        limit = self.target.max_length
        return limit is not None and len(self.context) >= limit
