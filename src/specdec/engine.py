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
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from specdec.adjustments import (
    DraftRows,
    adjusted,
    adjusts,
    check_token_ids,
    columns,
    held_back,
    row_paths,
)
from specdec.backends.base import Backend, held_prefix, sync_cache, sync_cache_scoring_last
from specdec.config import SamplingParams, SpecConfig
from specdec.controller import BatchDrafting, KPolicy
from specdec.detokenizer import Detokenizer
from specdec.drafters.base import Drafter, Drafting, Proposal, after_given, drive, pass_work
from specdec.grammar import Grammar
from specdec.logprobs import TokenLogprob, token_logprobs
from specdec.metrics import FORCED, SpecStats
from specdec.sampling import Sampler, logits_to_probs
from specdec.speculation import new_policy, policy_fits, speculation_for
from specdec.tree import chain_length, path_rows, row_depths, row_parents
from specdec.verify import VerifyResult, verify_coupled, verify_greedy, verify_stochastic
from specdec.verify_tree import verify_tree_coupled, verify_tree_greedy, verify_tree_stochastic


@dataclass(frozen=True)
class Chunk:
    """What one round emitted. The first ``num_from_draft`` of ``token_ids`` are accepted
    drafts; the rest is the target's own token (``extra_kind``: "recovered" after a
    rejection, "bonus" after full acceptance, "target" in a round without drafts), unless
    the output ended before it. ``logprobs``: one per token, when the request asked for them
    (``SamplingParams.logprobs``). ``prompt_logprobs``: on a request's first chunk, one per
    prompt token, the first None (``SamplingParams.prompt_logprobs``)."""

    token_ids: list[int]
    text: str
    num_from_draft: int
    rejected_ids: list[int]
    extra_kind: str
    finish_reason: str | None
    stats: SpecStats
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None


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

    @property
    def logprobs(self) -> list[TokenLogprob] | None:
        """One per token of ``token_ids``, when the request asked for them."""
        if not self.chunks or self.chunks[0].logprobs is None:
            return None
        return [entry for chunk in self.chunks for entry in chunk.logprobs or []]

    @property
    def prompt_logprobs(self) -> list[TokenLogprob | None] | None:
        """One per prompt token (the first None: nothing comes before it), when the request
        asked for them (``SamplingParams.prompt_logprobs``)."""
        return self.chunks[0].prompt_logprobs if self.chunks else None


class Engine:
    def __init__(
        self,
        target: Backend,
        drafter: Drafter | None = None,
        controller: KPolicy | None = None,
    ):
        """``controller``: the k policy of ``k="auto"`` requests (``new_controller``). Pass
        one to share what it learns (acceptance, costs) between engines, as the server does
        per drafter; else the engine makes its own on the first adaptive request."""
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
        yield from self.begin(prompt_ids, params, spec).rounds()

    def begin(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams | None = None,
        spec: SpecConfig | None = None,
    ) -> Run:
        """A request's decoding state, for callers that drive rounds themselves (a batch:
        ``step_together``); ``stream`` is ``begin(...).rounds()``."""
        params = params or SamplingParams()
        spec = spec or SpecConfig()
        prompt = self._check_prompt(prompt_ids)
        check_token_ids(params, self.target.vocab_size)
        detokenizer = Detokenizer(
            self.target.tokenizer, params.stop, params.stop_token_ids, params.min_tokens
        )
        return Run(self, prompt, params, spec, detokenizer)

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


def new_controller(drafter: Drafter | None, max_k: int) -> KPolicy:
    """The k policy of adaptive requests with ``drafter`` (``drafting.new_policy``)."""
    return new_policy(drafter, max_k)


class Run:
    """The state of one request: its context, generator, stats, text and drafting (the
    drafter, its k policy and what the drafter has followed: ``speculation.Speculation``)."""

    # A request's grammar masks the rows its drafter draws from as well as the target's (the
    # statistical tests turn this off to send forbidden drafts through verification).
    mask_drafts = True
    # Its logit bias and penalties change the drafter's rows as the target's (for acceptance
    # alone: ``adjustments.DraftRows``; the statistical tests turn it off to check both).
    adjust_drafts = True

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
        self.controller: KPolicy | None = None
        # k auto learns acceptance and costs, and so does a tree "auto" (its shape) at a fixed k
        if engine.drafter is not None and (spec.adaptive or spec.tree in ("auto", "deep")):
            if not policy_fits(engine.controller, engine.drafter, spec.max_k):
                engine.controller = new_controller(engine.drafter, spec.max_k)
            self.controller = engine.controller
        self.speculation = speculation_for(engine.drafter, self.controller, spec)
        self.sampler = Sampler(params, coupled=spec.coupled(params))
        self.grammar = None
        if params.constraint is not None:
            self.grammar = Grammar(
                params.constraint, self.target.tokenizer, self.target.vocab_size,
                self.target.eos_token_ids,
            )  # fmt: skip
        # the tokens that end the output: EOS (unless ignored; a grammar ends at its EOS) and
        # the stop tokens
        ends = set(params.stop_token_ids)
        if not params.ignore_eos or self.grammar is not None:
            ends |= self.target.eos_token_ids
        self.end_ids = sorted(ends)
        self.forced_drafts = spec.forced_drafts and spec.k != 0
        # Rounds the target scores alone (``propose``, not a batch's) draft trees
        self.tree = spec.tree != "off" and engine.drafter is not None and spec.k != 0
        if self.tree and not getattr(self.target, "scores_trees", False):
            raise ValueError(
                "draft trees are scored by specdec's layer stack (the int4 and int8 runtimes); "
                "this target runs elsewhere: use tree='off'"
            )
        if self.tree and self.grammar is not None:
            raise ValueError("draft trees are not combined with a grammar: use tree='off'")
        self.detokenizer = detokenizer
        self.context = list(prompt)
        self.generated: list[int] = []
        # What the request's logit_bias and penalties read (``adjustments``): the output's
        # token counts, and the tokens of the prompt and output.
        self.adjusts = adjusts(params)
        self.counts: Counter[int] = Counter()
        self.seen = set(prompt) if params.repetition_penalty != 1.0 else set()
        self.columns = columns(params, self.counts, self.seen)  # of them, this round
        self.stats = SpecStats(prompt_tokens=len(prompt))
        # ``prompt_logprobs``: one per prompt token scored so far (the first has none), given
        # out with the first chunk (``_score_prompt``)
        self.prompt_logprobs: list[TokenLogprob | None] | None = None
        if params.prompt_logprobs is not None:
            self.prompt_logprobs = [None]
        self._prompt_given = False
        self.started = 0.0  # set by the first prefill_part() (start() is one)
        self.prefilled = False  # set by prefill_part()
        self._drafter_given = 0  # how much of the prompt the drafter's prefill has seen

    # From this many prompt tokens on, the first token comes from the prefill's own pass
    # (``first_token``) and the drafter's prefill follows it. A shorter prompt leaves its last
    # token to the first round, as a round's pass scores it anyway: the drafter's prefill is
    # then a few milliseconds, and the statistical exactness tests, whose power is worked out
    # for a first token drafted and verified, keep their premise (tests/test_engine_statistical
    # checks the long path apart).
    FIRST_TOKEN_FROM_PREFILL = 32

    def rounds(self) -> Iterator[Chunk]:
        finish_reason = None
        if len(self.context) >= self.FIRST_TOKEN_FROM_PREFILL:
            chunk = self.first_token()
            yield chunk
            finish_reason = chunk.finish_reason
        if finish_reason is None:
            self.start()  # the drafter's prefill (and, for a short prompt, the target's)
        while finish_reason is None:
            chunk = self._round()
            finish_reason = chunk.finish_reason
            yield chunk

    def first_token(self) -> Chunk:
        """The prompt into the target's cache, its last token in the same pass, and the
        first token from that pass's last row (masked, sampled and verified as a round
        with no drafts would: ``_verify``). So it comes out before the drafter's prefill
        (a streaming client sees it as soon as plain decoding's), and without a pass of its
        own (plain decoding saves a one-token step; speculation scores the last prompt token
        in the prefill instead of in its first round). On specdec's runtimes the row is
        the one a round's pass would give, bit for bit (every row is computed as alone).
        Timed as prefill and not counted as a round (vLLM's count: the first token comes
        from the prefill)."""
        began = time.perf_counter()
        self.started = self.started or began
        self._score_prompt(None)
        logits = sync_cache_scoring_last(self.target, self.context)
        self.stats.target_forwards += 1
        proposal = Proposal([])
        result = self._verify(proposal, logits)
        self.target.truncate(len(self.context))  # the new token is fed next round
        self.stats.prefill_seconds += time.perf_counter() - began
        chunk = self._emit(result, proposal, logits)
        self.stats.total_seconds = time.perf_counter() - self.started
        return chunk

    def start(self, prepare_drafter: bool = True) -> None:
        """The prefill (what ``prefill_part`` has not fed yet); rounds follow.
        ``prepare_drafter=False``: the drafter's own prefill is left for its first proposal
        (a batch that is not drafting now)."""
        self.prefill_part(None, prepare_drafter)

    def first_token_part(self, rows: int | None) -> Chunk | None:
        """For a server that prefills in parts (``prefill_part``): where the prompt takes its
        first token from the prefill as ``rounds`` does (``FIRST_TOKEN_FROM_PREFILL`` tokens
        or more) and the rest of the target's prefill fits in ``rows`` (None: any), that
        last part, scoring the prompt's last token: its first token (``first_token``), for
        the client at once, before the drafter's prefill and the step the request joins.
        None: not this part (``prefill_part`` goes on as before)."""
        if self.generated or len(self.context) < self.FIRST_TOKEN_FROM_PREFILL:
            return None
        if not self._prompt_scored():  # ``prefill_part`` scores it first
            return None
        left = len(self.context) - held_prefix(self.target, self.context)
        if rows is not None and left > max(rows, 1):
            return None
        return self.first_token()

    def prefill_part(self, rows: int | None, prepare_drafter: bool = True) -> int:
        """The prefill, or a part of it so that a server can step other requests between
        the parts of a long prompt: at most ``rows`` (None: all) more prompt tokens into the
        target's cache, reusing a prefix it holds, and, once it holds the prompt, at most
        ``rows`` into the drafter's (``Drafter.prepare`` on a longer prefix of the prompt).
        Returns how many it fed; ``prefilled`` says when nothing is left. The caches end as
        one prefill leaves them: bit for bit on specdec's own runtimes, which compute every
        row as alone. Timed as prefill, not as decode-phase costs."""
        began = time.perf_counter()
        self.started = self.started or began
        if not self._prompt_scored():
            fed = self._score_prompt(rows)
            if not self._prompt_scored():  # the rest at the next parts
                self.stats.prefill_seconds += time.perf_counter() - began
                return fed
        else:
            fed = sync_cache(self.target, self.context[:-1], most=rows)
            if fed:
                self.stats.target_forwards += 1
        target_done = len(self.target.cached_token_ids) == len(self.context) - 1
        # A policy that has learned not to draft skips the draft's prefill; should it draft
        # later, the drafter catches up on the context first (``speculation``: catching up).
        drafts = prepare_drafter and self.speculation.will_draft()
        if target_done and drafts and self._drafter_given < len(self.context):
            given = len(self.context)
            if rows is not None:
                given = min(given, self._drafter_given + max(rows, 1))
            if given < len(self.context):
                self.speculation.prepare_part(self.context, given)
            else:  # the whole prompt: the drafter has followed the text
                self.speculation.prepare(self.context)
            fed, self._drafter_given = fed + given - self._drafter_given, given
        self.prefilled = target_done and (not drafts or self._drafter_given == len(self.context))
        self.stats.prefill_seconds += time.perf_counter() - began
        return fed

    # Prompt rows scored a pass where the prompt's log-probabilities are asked for: every row's
    # logits are kept (151,936 floats a row for Qwen2.5), so a long prompt goes in parts. 64:
    # one pass of the batched runtime (``BatchedModel.PASS_ROWS``), whose logits then need
    # no joining (128 rows, two passes, took 5% longer to score prompts of ~100 tokens).
    SCORE_ROWS = 64

    def _prompt_scored(self) -> bool:
        scored = self.prompt_logprobs
        return scored is None or len(scored) == self.stats.prompt_tokens

    def _score_prompt(self, rows: int | None) -> int:
        """``prompt_logprobs``: the target's prefill of all but the last prompt token (or
        of ``rows`` more of them) with every row's logits: row i scores prompt token i + 1.
        The first part starts after the scores another sequence of the model has for the
        prompt's beginning, else from an empty cache (``_reuse_scores``). On specdec's
        runtimes each row is the one a pass of any other size gives, so a prompt token's
        values are those its position gets when decoding, bit for bit
        (``tests/test_prompt_logprobs.py``). Returns how many tokens it fed."""
        scored = self.prompt_logprobs
        if scored is None or self._prompt_scored():
            return 0
        top = self.params.prompt_logprobs or 0
        start = len(scored) - 1  # the cache holds the prompt up to here
        if start == 0:
            start = self._reuse_scores(top)
        last = self.stats.prompt_tokens - 1
        end = last if rows is None else min(last, start + max(rows, 1))
        for at in range(start, end, self.SCORE_ROWS):
            upto = min(end, at + self.SCORE_ROWS)
            logits = self.target.forward(self.context[at:upto])  # rows at .. upto - 1
            self.stats.target_forwards += 1
            scored.extend(token_logprobs(logits, self.context[at + 1 : upto + 1], top))
        return end - start

    def _reuse_scores(self, top: int) -> int:
        """Before scoring the prompt: the scores another sequence of this model has for its
        beginning (``ModelSequence.prefix_scores``; the same bits on specdec's runtimes),
        and the cache holding the tokens they cover (copied or kept: ``held_prefix``); the
        cache empty where there are none (a prefix it holds kept no logits). This prompt's
        scores are offered in turn. Returns where scoring goes on."""
        scored = self.prompt_logprobs
        assert scored is not None, "a prompt to score"
        prompt = self.context[: self.stats.prompt_tokens]
        find = getattr(self.target, "prefix_scores", None)
        known = find(prompt, top) if find is not None else [None]
        held = held_prefix(self.target, prompt[: len(known) - 1]) if len(known) > 1 else 0
        if held == 0:
            self.target.truncate(0)
        scored[:] = known[: held + 1]
        keep = getattr(self.target, "keep_scores", None)
        if keep is not None:
            keep(prompt, scored, top)
        return held

    def _round(self) -> Chunk:
        proposal, draft_seconds = self.propose()
        started = time.perf_counter()
        scored = self.scored_tokens(proposal)
        if proposal.parents is None:
            logits = self.target.forward(scored)  # [k + 1, vocab]
        else:  # a tree's rows, each attending to its own path
            logits = self.target.forward_tree(scored, row_parents(proposal.parents))  # type: ignore[attr-defined]
        return self.finish_round(proposal, draft_seconds, logits, time.perf_counter() - started)

    def scored_tokens(self, proposal: Proposal) -> list[int]:
        """What the target scores this round: the last context token and the drafts."""
        return [self.context[-1]] + proposal.token_ids

    def finish_round(
        self,
        proposal: Proposal,
        draft_seconds: float,
        logits: torch.Tensor,
        pass_seconds: float,
        observe: bool = True,
        batch: int = 1,
    ) -> Chunk:
        """Verify the target's ``logits`` of ``scored_tokens(proposal)``, cut the target
        cache back to what was accepted, emit. ``observe=False``: a round the batch kept
        from drafting; its costs say nothing about this run's own choice of k. ``batch``:
        the requests whose rows the pass scored together (the k policy keeps their costs
        apart from a request's alone)."""
        nodes = len(proposal.token_ids)
        self.stats.target_forwards += 1
        result = self._verify(proposal, logits)
        started = time.perf_counter()
        k = chain_length(proposal.parents, nodes)  # a tree's leading chain
        chain_accepted, copy_taken = min(result.num_accepted, k), 0
        if proposal.parents is not None:  # keep the accepted path's rows, drop the rest
            rows = path_rows(result.path)
            self.target.keep_path(len(self.context) - 1, rows)  # type: ignore[attr-defined]
            chain_accepted = sum(node < k for node in result.path)
            copy_taken = sum(node >= nodes - proposal.copied for node in result.path)
            logits = logits[rows]
        # Keep the last context token and the accepted drafts; the new token is fed next round.
        self.target.truncate(len(self.context) + result.num_accepted)
        self.stats.target_seconds += pass_seconds + time.perf_counter() - started
        self.stats.drafter_seconds += draft_seconds
        given = proposal.given  # the grammar's forced drafts ahead of the drafter's
        taken = result.num_accepted > chain_accepted
        self.stats.record_round(
            k - given, result.num_accepted - given, result.bonus, result.residual_fallback,
            proposal.drafter, siblings=nodes - k, sibling_taken=taken, given=given,
        )  # fmt: skip
        if observe and proposal.drafter != FORCED:
            self.speculation.observe(
                k - given, proposal.drafters_part(), chain_accepted - given, draft_seconds,
                pass_seconds, self.stats.rounds - 1, rows=nodes + 1, batch=batch,
                copy_taken=copy_taken,
            )  # fmt: skip
        chunk = self._emit(result, proposal, logits)
        self.stats.total_seconds = time.perf_counter() - self.started
        return chunk

    def propose(self, max_k: int | None = None) -> tuple[Proposal, float]:
        """This round's drafts and the seconds drafting took."""
        forced = self._forced(max_k)
        k = self._draft_k(max_k, forced)
        self.speculation.begin(k, self.stats.rounds)
        if k <= 0:
            return drive(self._drafting(0, given=forced)), 0.0
        # a long way behind: catch up apart, so that the draft's time is a draft's
        self.stats.drafter_seconds += self.speculation.catch_up_apart(self.context)
        started = time.perf_counter()
        proposal = drive(self._drafting(k, tree=self.tree, given=forced))
        return proposal, time.perf_counter() - started

    def drafting(self, max_k: int | None = None) -> Drafting:
        """This round's drafts, step by step (``drafters.base.Drafting``): at most ``max_k``
        (a batch's share of a pass). A drafter behind the text catches up within its first
        pass, batched with the others' (that round's draft time is not counted as a draft
        step: ``finish_round``)."""
        forced = self._forced(max_k)
        k = self._draft_k(max_k, forced)
        self.speculation.begin(k, self.stats.rounds)
        return self._drafting(k, given=forced)

    def _forced(self, max_k: int | None) -> list[int]:
        """The tokens the grammar forces next (q = 1: each is the only token its masked row
        allows, so verification accepts it), when the request speculates: this round's
        first drafts, the drafter's after them (``_drafting``). Empty where the grammar
        offers a choice, or the request has no grammar."""
        if self.grammar is None or not self.forced_drafts:
            return []
        return self.grammar.forced()[: max(self._room(max_k), 0)]

    def _drafting(self, k: int, tree: bool = False, given: Sequence[int] = ()) -> Drafting:
        """``k`` drafts of the drafter after the ``given`` ones (the grammar's forced
        tokens, which it drafts from: its first pass catches up on them); with ``k`` 0
        the given drafts alone (the drafter sits the round out and catches up later)."""
        if k <= 0:
            return Proposal(list(given), drafter=FORCED if given else "", given=len(given))
        context = [*self.context, *given] if given else self.context
        if self.adjusts and self.adjust_drafts:  # the draft's rows changed as the target's
            self.sampler.draft_rows = DraftRows(
                self.params, self.columns, len(self.context), self.target.vocab_size, given
            )
        try:
            if self.grammar is None or not self.mask_drafts:
                proposal = yield from self.speculation.drafting(context, k, self.sampler, tree)
            else:  # drafts drawn from rows the grammar masks, its state rolled back after
                mask = self.sampler.draft_mask = self.grammar.drafts(len(self.context))
                try:
                    mask.follow(given)
                    proposal = yield from self.speculation.drafting(context, k, self.sampler)
                finally:
                    mask.end()
                    self.sampler.draft_mask = None
        finally:
            self.sampler.draft_rows = None
        assert chain_length(proposal.parents, len(proposal.token_ids)) <= k, (
            "drafter proposed more than k tokens"
        )
        return after_given(given, proposal)

    def _draft_k(self, max_k: int | None, given: Sequence[int] = ()) -> int:
        """This round's drafter's k after ``given`` drafts (0 for a request without a
        drafter: its speculation's k is 0)."""
        return min(self.speculation.choose_k(), self._room(max_k) - len(given))

    def _room(self, max_k: int | None) -> int:
        """The most drafts this round may hold: a round emits up to k + 1 tokens, so never
        past max_tokens or the context, nor past ``max_k`` (a batch's share)."""
        room = self.params.max_tokens - len(self.generated) - 1
        if max_k is not None:
            room = min(room, max_k)
        if self.target.max_length is not None:
            room = min(room, self.target.max_length - len(self.context) - 1)
        return room

    def _verify(self, proposal: Proposal, logits: torch.Tensor) -> VerifyResult:
        token_ids, draft_probs = proposal.token_ids, proposal.draft_probs
        held = len(self.generated) < self.params.min_tokens
        if self.adjusts or held:  # each row follows the drafts on its path
            paths = row_paths(token_ids, proposal.parents)
        if self.adjusts:  # the distribution plain decoding samples with them, row by row
            logits = adjusted(logits, self.params, self.columns, paths)
        if held:  # no end yet, row by row
            written = [len(self.generated) + len(path) for path in paths]
            logits = held_back(logits, self.end_ids, written, self.params.min_tokens)
        if proposal.parents is not None:
            return self._verify_tree(proposal, logits)
        if self.grammar is not None:  # rows masked; drafts after a forbidden one dropped
            kept, logits = self.grammar.mask(token_ids, logits)
            token_ids = token_ids[:kept]
            draft_probs = None if draft_probs is None else draft_probs[:kept]
        draft_ids = torch.tensor(token_ids, dtype=torch.long)
        if self.params.greedy:
            return verify_greedy(draft_ids, logits)
        if self.sampler.coupled:
            # Row i scores sequence position len(context) + i.
            start = len(self.context)
            self.sampler.settle(start)
            positions = range(start, start + logits.shape[0])
            return verify_coupled(draft_ids, self.sampler.keyed_samples(logits, positions))
        target_probs = logits_to_probs(logits, self.params)
        return verify_stochastic(draft_ids, draft_probs, target_probs, self.sampler.generator)

    def _verify_tree(self, proposal: Proposal, logits: torch.Tensor) -> VerifyResult:
        token_ids, parents = proposal.token_ids, proposal.parents
        assert parents is not None, "a tree's proposal"
        if self.params.greedy:
            return verify_tree_greedy(token_ids, parents, logits)
        if self.sampler.coupled:  # row r scores position len(context) + its depth
            start = len(self.context)
            self.sampler.settle(start)
            positions = [start + depth for depth in row_depths(row_parents(parents))]
            samples = self.sampler.keyed_samples(logits, positions)
            return verify_tree_coupled(token_ids, parents, samples)
        target_probs = logits_to_probs(logits, self.params)
        return verify_tree_stochastic(
            token_ids, parents, proposal.draft_probs, target_probs, self.sampler.generator
        )

    def _emit(self, result: VerifyResult, proposal: Proposal, logits: torch.Tensor) -> Chunk:
        remaining = self.params.max_tokens - len(self.generated)
        emitted = result.token_ids[:remaining]
        finish_reason = None
        eos_at = self._first_end(emitted)
        if eos_at is not None:
            emitted, finish_reason = emitted[: eos_at + 1], "stop"
        if self.grammar is not None:
            kept = self.grammar.advance(emitted)
            if kept < len(emitted) or self.grammar.done():
                emitted, finish_reason = emitted[:kept], "stop"
        self.generated.extend(emitted)
        keep, text, stopped = self.detokenizer.update(self.generated, len(emitted))
        if stopped:
            emitted = emitted[: len(emitted) - (len(self.generated) - keep)]
            del self.generated[keep:]
            finish_reason = "stop"
        self.context.extend(emitted)
        if self.adjusts:
            self.counts.update(emitted)
            if self.params.repetition_penalty != 1.0:
                self.seen.update(emitted)
            self.columns = columns(self.params, self.counts, self.seen)
        if finish_reason is None and self._out_of_room():
            finish_reason = "length"
        if finish_reason is not None and not stopped:
            text += self.detokenizer.flush(self.generated)
        self.stats.generated_tokens = len(self.generated)
        if not proposal.token_ids:
            extra_kind = "target"
        else:
            extra_kind = "bonus" if result.bonus else "recovered"
        logprobs = None
        if self.params.logprobs is not None:  # emitted token i was scored by row i
            logprobs = token_logprobs(logits, emitted, self.params.logprobs)
        prompt_logprobs = None if self._prompt_given else self.prompt_logprobs
        self._prompt_given = True
        return Chunk(
            token_ids=emitted,
            text=text,
            num_from_draft=min(result.num_accepted, len(emitted)),
            rejected_ids=_rejected(proposal, result),
            extra_kind=extra_kind,
            finish_reason=finish_reason,
            stats=self.stats,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
        )

    def _first_end(self, token_ids: list[int]) -> int | None:
        """Where the first token that ends the output is: EOS (unless ignored; a grammar
        ends at its EOS), or one of ``stop_token_ids``."""
        for i, token_id in enumerate(token_ids):
            if token_id in self.end_ids:
                return i
        return None

    def _out_of_room(self) -> bool:
        if len(self.generated) >= self.params.max_tokens:
            return True
        limit = self.target.max_length
        return limit is not None and len(self.context) >= limit


def _rejected(proposal: Proposal, result: VerifyResult) -> list[int]:
    """The drafts verification turned down: a chain's after the accepted ones; a tree's
    children of the last accepted node (or the root's)."""
    if proposal.parents is None:
        return proposal.token_ids[result.num_accepted :]
    last = result.path[-1] if result.path else -1
    return [
        t for t, parent in zip(proposal.token_ids, proposal.parents, strict=True) if parent == last
    ]


def step_together(
    runs: Sequence[Run],
    forward_many: Callable[[list[tuple[Any, list[int], bool]]], list[torch.Tensor]],
    max_rows: int | None = None,
    policy: BatchDrafting | None = None,
) -> list[Chunk | Exception]:
    """One round of every run (each already ``start``ed) in ONE target pass: continuous
    batching. Each run drafts, at most its share of ``max_rows`` (the rows one pass may
    score, split evenly; every run scores at least its last token); ``forward_many``
    (``BatchedModel.forward_many``) scores every run's tokens against its own cache; each
    run verifies with its own generator and accepts its own count. A run whose drafting or
    verification fails gets its exception; if the pass fails, every run in it does, and
    the target caches are as they were (``BatchedModel`` restores them). ``policy``
    (``BatchDrafting``) decides whether this step drafts at all, from the measured rate of
    whole steps of this many runs; a round it keeps from drafting teaches the run's own k
    controller nothing."""
    if not runs:
        return []
    share = None if max_rows is None else max(max_rows // len(runs) - 1, 0)
    budget_allows = share != 0  # a budget of one row each leaves no room for drafts
    drafting = budget_allows and (policy is None or policy.drafting(len(runs)))
    if not drafting:
        share = 0
    results: list[Chunk | Exception | None] = [None] * len(runs)
    step_started = started = time.perf_counter()
    proposals = _draft_together(runs, share)
    draft_seconds = time.perf_counter() - started
    pending = []
    for i, proposal in enumerate(proposals):
        if isinstance(proposal, Exception):
            results[i] = proposal
        else:
            pending.append((i, runs[i], proposal))
    if pending:
        started = time.perf_counter()
        try:
            logits = forward_many(
                [(run.target, run.scored_tokens(proposal), False) for _, run, proposal in pending]
            )
        except Exception as error:
            for i, *_ in pending:
                results[i] = error
        else:
            pass_seconds = time.perf_counter() - started
            # Each run is charged its share of the pass (by rows scored) and of the lockstep
            # drafting (by tokens drafted): what its rounds cost the batch. Charging each the
            # whole batch's time would teach its k controller that drafting costs N times
            # what it does, and a run left alone would never draft again.
            rows_total = sum(len(proposal.token_ids) + 1 for _, _, proposal in pending)
            drafted_total = sum(len(proposal.token_ids) for _, _, proposal in pending)
            for (i, run, proposal), rows in zip(pending, logits, strict=True):
                k = len(proposal.token_ids)
                draft_share = draft_seconds * k / drafted_total if k else 0.0
                pass_share = pass_seconds * (k + 1) / rows_total
                try:
                    results[i] = run.finish_round(
                        proposal, draft_share, rows, pass_share, drafting, batch=len(pending)
                    )
                except Exception as error:
                    results[i] = error
    done = [result for result in results if result is not None]
    assert len(done) == len(runs), "every run got a chunk or an error"
    if policy is not None and budget_allows:
        tokens = sum(len(chunk.token_ids) for chunk in done if isinstance(chunk, Chunk))
        policy.observe(len(runs), drafting, tokens, time.perf_counter() - step_started)
    return done


def _draft_together(runs: Sequence[Run], share: int | None) -> list[Proposal | Exception]:
    """Every run's drafting in lockstep: at each step the draft passes of sequences of one
    ``BatchedModel`` run as one pass, other passes one by one. A run whose drafting fails
    (or whose batched pass fails) gets the exception."""
    results: list[Proposal | Exception | None] = [None] * len(runs)
    steps = {i: run.drafting(share) for i, run in enumerate(runs)}
    calls: dict[int, tuple[Any, list[int], bool]] = {}  # backend, tokens, last_only

    def advance(i: int, logits: torch.Tensor | None) -> None:
        try:
            calls[i] = pass_work(next(steps[i]) if logits is None else steps[i].send(logits))
        except StopIteration as done:
            results[i] = done.value
            calls.pop(i, None)
        except Exception as error:
            results[i] = error
            calls.pop(i, None)

    for i in steps:
        advance(i, None)
    while calls:
        groups: dict[int, tuple[Any, list[int]]] = {}  # a batched model (or None), its runs
        for i, (backend, _, _) in calls.items():
            batched = getattr(backend, "batched", None)
            key = id(batched) if batched is not None else -1 - i
            groups.setdefault(key, (batched, []))[1].append(i)
        for batched, members in groups.values():
            try:
                if batched is not None:
                    outs = batched.forward_many([calls[i] for i in members])
                else:
                    backend, tokens, last_only = calls[members[0]]
                    outs = [backend.forward(tokens, last_only=last_only)]
            except Exception as error:
                for i in members:
                    results[i] = error
                    calls.pop(i)
                    steps[i].close()
                continue
            for i, out in zip(members, outs, strict=True):
                advance(i, out)
    done = [result for result in results if result is not None]
    assert len(done) == len(runs), "every run drafted or failed"
    return done
