"""Drafting with a small model of the same family, over its own KV cache."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.backends.base import (
    Backend,
    common_prefix_length,
    shareable_prefixes,
    sync_cache,
)
from specdec.config import SamplingParams
from specdec.drafters.base import (
    Branch,
    CopyLength,
    Drafting,
    Growth,
    KeepGoing,
    Proposal,
    Siblings,
    StepwiseDrafter,
)
from specdec.drafters.lookup import PromptLookupDrafter
from specdec.sampling import Sampler, argmax_rows, sample
from specdec.tree import chain, chain_first, likeliest_first

_GREEDY = SamplingParams(temperature=0.0)


class ModelDrafter(StepwiseDrafter):
    """Samples k tokens autoregressively from a draft model.

    Its cache follows the accepted text lazily: each ``propose`` rolls the cache back to the
    longest prefix it shares with ``context`` and feeds what is missing. After a round in
    which all k drafts were accepted, that is the last draft (never fed) plus the bonus
    token; after a rejection, just the recovered token. Of a prompt longer than
    ``PROMPT_SINK + prompt_tail`` tokens it reads only the first and the last ``prompt_tail``
    or more (a longer window a cache already holds: ``_fit``).

    With a ``guide`` (prompt lookup: what followed an earlier occurrence of the context's
    tail), the draft reads the guide's guesses in the same pass as what it feeds (what it
    catches up on, or its last pick), every row's logits kept: while the draft's own pick at
    a position is the guess it read there, the next row's logits are the ones a step would
    have given, so the chain goes on without another pass; at the first pick that differs
    the guesses after it are cut from the cache, and the pass that feeds that pick reads
    the guide's guesses after it (a copy resumes after an edit). The proposal is the one the
    unguided draft makes (the same tokens from the same logits, the same random numbers
    drawn in the same order; on specdec's runtimes a row in a pass is its step bit for bit),
    for one pass of several rows where it would take as many passes as guesses it confirms
    (CS Drafting's cascade: a statistical draft for the draft model).
    """

    name = "model"
    grows_trees = True  # its second choices, as leaves beside the chain (``SpecConfig.tree``)

    # What of a long prompt the draft reads: its first PROMPT_SINK tokens (the chat
    # template's start; StreamingLLM's attention sinks) and its last PROMPT_TAIL, so that
    # its prefill costs at most that many rows however long the prompt (docs/drafting.md).
    # Its drafts are still draws from the distributions it reports: exactness holds.
    PROMPT_SINK = 4
    PROMPT_TAIL = 256
    MATCH = 8  # tokens after a held window's cut that must match to try that cut (_fit)

    def __init__(
        self,
        backend: Backend,
        guide: PromptLookupDrafter | None = None,
        prompt_tail: int | None = PROMPT_TAIL,
    ):
        """``prompt_tail``: how many of a prompt's last tokens the draft reads (besides its
        first ``PROMPT_SINK``); None: all of it."""
        if prompt_tail is not None and prompt_tail < 1:
            raise ValueError(f"prompt_tail must be a positive count or None, not {prompt_tail}")
        self.backend = backend
        self.vocab_size = backend.vocab_size
        self.guide = guide
        self.prompt_tail = prompt_tail
        self._skip: tuple[int, list[int]] | None = None  # (cut, context[:cut]): ``_fit``

    def prepare(self, context: Sequence[int]) -> None:
        self.prepare_part(context, len(context))  # all of it: the last token left unfed

    def prepare_part(self, prompt: Sequence[int], given: int) -> None:
        """A part of ``prepare(prompt)`` (``Run.prefill_part``: longer parts in turn), as
        far as the prompt's first ``given`` tokens: that share of what the draft reads of
        the prompt, so that parts of a long prompt fill the draft's cache with its first
        tokens and tail as one ``prepare`` would. The last token read is left to the first
        ``propose``."""
        if self.guide is not None:
            self.guide.prepare(prompt[:given])  # its index of the prompt, built during prefill
        self._fit(prompt)
        seen = self._seen(prompt)
        limit = self.backend.max_length
        if limit is not None and len(seen) >= limit:
            return  # longer than the draft's window (a llama.cpp n_ctx): it will not draft
        rows = -(-(len(seen) - 1) * given // max(len(prompt), 1))  # rounded up
        sync_cache(self.backend, list(seen[:rows]))

    def _fit(self, context: Sequence[int]) -> None:
        """Choose what the draft reads of ``context`` and of every context that goes on
        from it: all of it, or the first ``PROMPT_SINK`` tokens and the tokens from a cut on
        (the tokens between them skipped from then on), whichever leaves the fewest rows to
        compute. The cuts tried: the one that reads the last ``prompt_tail``, and any
        earlier one where a cache the backend has or can copy from holds that window (a
        conversation's next turn, or a request with the same prompt before it), so that a
        window once read is read on, not read again from a later cut; a cache that
        already holds most of the text goes on reading all of it."""
        self._skip = None
        tail = self.prompt_tail
        if tail is None or len(context) <= self.PROMPT_SINK + tail:
            return
        held = shareable_prefixes(self.backend)

        def rows(cut: int | None) -> int:  # to compute, for that window (None: all)
            seen = context if cut is None else self._window(context, cut)
            return len(seen) - max(common_prefix_length(ids, seen) for ids in held)

        cuts = dict.fromkeys([len(context) - tail, *self._held_cuts(context, held)])
        cut = min(cuts, key=rows)  # the first of the fewest: the tail's cut on a tie
        if rows(cut) < rows(None):
            self._skip = (cut, list(context[:cut]))

    def _window(self, context: Sequence[int], cut: int) -> list[int]:
        return [*context[: self.PROMPT_SINK], *context[cut:]]

    def _held_cuts(self, context: Sequence[int], held: list[Sequence[int]]) -> list[int]:
        """Cuts of ``context`` whose windows begin as one of ``held`` does (its sink, then
        at least ``MATCH`` tokens from the cut on), reading at least ``prompt_tail``."""
        sink, last = self.PROMPT_SINK, len(context) - (self.prompt_tail or 0)
        afters = [
            list(ids[sink : sink + self.MATCH])
            for ids in held
            if len(ids) >= sink + self.MATCH and list(ids[:sink]) == list(context[:sink])
        ]
        # where each first token of a window stands in the context, read once (a server
        # keeps many donors: a scan of the context for each was most of this call's time)
        firsts = {after[0] for after in afters}
        starts: dict[int, list[int]] = {}
        for cut in range(sink + 1, last + 1):
            if context[cut] in firsts:
                starts.setdefault(context[cut], []).append(cut)
        return [
            cut
            for after in afters
            for cut in starts.get(after[0], ())
            if list(context[cut : cut + self.MATCH]) == after
        ]

    def _seen(self, context: Sequence[int]) -> Sequence[int]:
        """What the draft reads of ``context`` (``_fit``); a context that does not go on
        from the text it was fitted to is fitted anew."""
        if self._skip is None:
            return context
        cut, before = self._skip
        if len(context) < cut or list(context[:cut]) != before:
            self._fit(context)
            return self._seen(context)
        return [*context[: self.PROMPT_SINK], *context[cut:]]

    def drafting(
        self,
        context: Sequence[int],
        k: int,
        sampler: Sampler | None = None,
        keep_going: KeepGoing | None = None,
        branch: Branch | None = None,
    ) -> Drafting:
        """``propose``, one draft pass per step (see ``drafters.base.Drafting``). With
        ``branch``, a tree: a ``Growth``, a deep one (``_grow``) where it can grow;
        otherwise the chain, then the draft's second choice beside the chain node at each
        depth the branch's leaves pick (``second_choice``)."""
        assert len(context) > 0, "drafting needs a context"
        sampler = sampler or Sampler(_GREEDY)
        seen = self._seen(context)
        if self.backend.max_length is not None:
            k = min(k, self.backend.max_length - len(seen))
        if k <= 0:
            return Proposal([], drafter=self.name)
        # Keep at least the last context token unfed: its logits give the first draft.
        keep = min(common_prefix_length(self.backend.cached_token_ids, seen), len(seen) - 1)
        self.backend.truncate(keep)
        catch_up = list(seen[keep:])
        guesses = self._guesses(context, len(seen), [], k - 1, sampler)
        offered = guesses  # what the guide offered, kept for a tree's branch
        if guesses:
            # rows[j]: the logits after the context and the first j guesses
            rows = (yield (self.backend, catch_up + guesses, True))[len(catch_up) - 1 :]
            logits = rows[0]
        else:
            logits = (yield (self.backend, catch_up))[-1]
        if isinstance(branch, Growth):
            if self._grows_deep(sampler):
                read = rows if guesses else logits.unsqueeze(0)
                grown = self._grow(
                    context, len(seen), k, read, guesses, sampler, keep_going, branch
                )
                return (yield from grown)
            branch = branch.leaves
        copy_length = None  # every guess the draft parts from is verified
        if isinstance(branch, Siblings):
            copy_length = branch.copy
            branch = branch.leaves
        token_ids: list[int] = []
        probs: list[torch.Tensor] = []
        confidences: list[float] = []
        dists: list[torch.Tensor] = []  # each depth's distribution, for a tree's leaves
        while True:
            token_id, token_probs = sampler.pick(logits, len(context) + len(token_ids))
            token_ids.append(token_id)
            if token_probs is not None:
                probs.append(token_probs)
            if keep_going is not None or branch is not None:
                dist = _distribution(logits, token_probs)
                confidences.append(float(dist[token_id]))
                if branch is not None:
                    dists.append(dist)
            if keep_going is not None and len(token_ids) < k and not keep_going(confidences):
                break
            if len(token_ids) == k:
                break
            if guesses and guesses[0] == token_id:  # the draft read this token already
                guesses, rows = guesses[1:], rows[1:]
                logits = rows[0]
                continue
            if guesses:  # it picked otherwise: the guesses from here on are not the text
                self.backend.truncate(len(seen) + len(token_ids) - 1)
            guesses = self._guesses(context, len(seen), token_ids, k - len(token_ids) - 1, sampler)
            if guesses:  # rows[j]: the logits after this pick and the first j guesses
                rows = yield (self.backend, [token_id, *guesses], True)
                logits = rows[0]
            else:
                logits = (yield (self.backend, [token_id]))[-1]
        if branch is not None:
            tree = self._tree(context, token_ids, probs, confidences, dists, sampler, branch)
            return with_copy(
                tree, offered, token_ids, bool(probs), sampler.coupled, copy_length
            )  # fmt: skip
        return Proposal(
            token_ids,
            torch.stack(probs) if probs else None,
            self.name,
            confidences if keep_going is not None else None,
        )

    def _guesses(
        self,
        context: Sequence[int],
        length: int,
        drafted: list[int],
        most: int,
        sampler: Sampler | None = None,
    ) -> list[int]:
        """The guesses of up to ``most`` tokens after ``context`` and ``drafted`` (the last
        draft's row is read from the row after them, so a round of k drafts reads at most
        k - 1): where the request's grammar forces the tokens next (``sampler.draft_mask``),
        those, which the draft's masked rows cannot but pick; else the guide's; none without
        either, or a draft window too short for them."""
        if most < 1:
            return []
        mask = sampler.draft_mask if sampler is not None else None
        at = len(context) + len(drafted)  # the sequence position of the first guess
        guesses = mask.forced(at)[:most] if mask is not None else []
        if not guesses and self.guide is not None:
            guesses = self.guide.continuation(context, drafted, most)
        limit = self.backend.max_length
        if limit is not None:
            guesses = guesses[: max(0, limit - length - len(drafted) - 1)]
        return guesses

    def _grows_deep(self, sampler: Sampler) -> bool:
        """Whether a deep tree can grow here: the draft scores trees (specdec's int4 and
        int8 runtimes), and its verification takes whichever child is the target's own
        token (greedy, coupled); rejection sampling would need each child's own
        distribution, drawn without replacement."""
        sampled_apart = not sampler.greedy and not sampler.coupled
        return bool(getattr(self.backend, "scores_trees", False)) and not sampled_apart

    def _grow(
        self,
        context: Sequence[int],
        length: int,  # of what the draft read for ``context`` (``_seen``)
        k: int,
        rows: torch.Tensor,  # [j]: the logits after the context and guesses[:j]
        guesses: list[int],  # the guide's, cached after the context as a chain of tree rows
        sampler: Sampler,
        keep_going: KeepGoing | None,
        growth: Growth,
    ) -> Drafting:
        """A deep tree (EAGLE-2's expansion): the root's candidates, then a depth at a time
        the ``growth.beam`` likeliest open nodes scored in one tree pass of the draft (a
        node on the guide's guesses is read from the catch-up pass, free) and each given
        ``growth.width`` children: the draft's own pick (what the chain would hold), then
        its next choices (greedy: by probability; coupled: the races of the rest, as
        ``second_choice``). It stops at depth k, or when ``keep_going`` turns down the
        likeliest open node's path. The target verifies the likeliest nodes,
        ``growth.keep`` of them. Rows in the draft's cache past the guesses are dropped:
        they attend to their own paths, not to the text before them."""
        start = len(context)
        tree_parents = list(range(-1, len(guesses) - 1))  # the cached tree rows' parents
        tokens: list[int] = []
        parents: list[int] = []
        depths: list[int] = []
        confidences: list[float] = []
        values: list[float] = []
        picks: dict[int, int] = {}  # a node (-1: the root) -> its child that is the pick
        cached: dict[int, int] = {-1: -1}  # a node -> its cached tree row
        on_guesses: dict[int, int] = {-1: 0}  # a node on the guesses -> its row of ``rows``

        def spawn(logits: torch.Tensor, parent: int) -> list[int]:
            depth = depths[parent] + 1 if parent >= 0 else 0
            pick, probs = sampler.pick(logits, start + depth)
            dist = _distribution(logits, probs)
            chosen = [pick]
            rest = dist.clone()
            for _ in range(growth.width - 1):
                rest[chosen[-1]] = 0.0
                mass = float(rest.sum())
                if mass <= 0.0:
                    break
                chosen.append(sampler.race(rest / mass, start + depth) if sampler.coupled
                              else argmax_rows(rest)[0])  # fmt: skip
            born = []
            for token in chosen:
                node = len(tokens)
                confidence = float(dist[token])
                tokens.append(token)
                parents.append(parent)
                depths.append(depth)
                confidences.append(confidence)
                values.append((values[parent] if parent >= 0 else 1.0) * confidence)
                at = on_guesses.get(parent)
                if at is not None and at < len(guesses) and guesses[at] == token:
                    on_guesses[node] = at + 1
                    cached[node] = at
                born.append(node)
            picks[parent] = born[0]
            return born

        opened = spawn(rows[0], -1)
        passes = 0
        while depths[opened[0]] + 1 < k:
            best = max(opened, key=lambda n: values[n])
            if keep_going is not None and not keep_going(self._path(best, parents, confidences)):
                break
            expand = sorted(opened, key=lambda n: -values[n])[: growth.beam]
            logits_of = {n: rows[on_guesses[n]] for n in expand if n in on_guesses}
            fed = [n for n in expand if n not in on_guesses]
            if fed:
                held = len(tree_parents)
                tree_parents += [cached[parents[n]] for n in fed]
                out = yield (self.backend, [tokens[n] for n in fed], list(tree_parents))
                passes += 1
                for j, n in enumerate(fed):
                    cached[n] = held + j
                    logits_of[n] = out[j]
            opened = [child for n in expand for child in spawn(logits_of[n], n)]
        self.backend.truncate(length + len(guesses))
        order = likeliest_first(values, depths)
        count = len(order)
        if growth.keep is not None:
            count = growth.keep([self._path(n, parents, confidences) for n in order], passes)
        kept, chain_length = chain_first(order[: max(count, 1)], parents, picks, depths)
        index = {node: i for i, node in enumerate(kept)}
        return Proposal(
            [tokens[n] for n in kept],
            None,
            self.name,
            [confidences[n] for n in kept[:chain_length]],
            [index[parents[n]] if parents[n] >= 0 else -1 for n in kept],
        )

    @staticmethod
    def _path(node: int, parents: list[int], confidences: list[float]) -> list[float]:
        """The draft's confidences down to ``node``, root first."""
        path = []
        while node >= 0:
            path.append(confidences[node])
            node = parents[node]
        return path[::-1]

    def _tree(self, context, token_ids, probs, confidences, dists, sampler, branch) -> Proposal:
        """The chain and, at the depths ``branch`` picks from each depth's runner-up, the
        second choice as a leaf (drawn only there: a second choice copies its row, the
        runner-up's share only reads it)."""
        sampled = bool(probs)
        shares = [
            runner_up(dist, token_id) for dist, token_id in zip(dists, token_ids, strict=True)
        ]
        seconds = {
            depth: second_choice(
                dists[depth], sampled, token_ids[depth], sampler, len(context) + depth
            )
            for depth in branch(confidences, shares)
        }
        leaves = [depth for depth, second in seconds.items() if second[0] >= 0]
        parents = [*chain(len(token_ids)), *(d - 1 for d in leaves)]
        nodes = token_ids + [seconds[d][0] for d in leaves]
        draft_probs = None
        if probs:  # sampled: each leaf's distribution is the rest it was drawn from
            rests = [rest for d in leaves if (rest := seconds[d][1]) is not None]
            assert len(rests) == len(leaves), "a sampled leaf has the rest it was drawn from"
            draft_probs = torch.stack([*probs, *rests])
        return Proposal(nodes, draft_probs, self.name, confidences, parents)


def with_copy(
    tree: Proposal,
    offered: list[int],
    chain_ids: list[int],
    sampled: bool,
    coupled: bool,
    copy_length: CopyLength | None = None,
) -> Proposal:
    """``tree`` and, where the guide's guesses part from the chain, the rest of them as a
    branch of their own: hung beside the chain's node where the draft picked otherwise (or
    after its last node where the chain ended first), so that where the target copies and
    the draft did not, the copy is scored too. Greedy and coupled only: those verifiers take
    the child whose token is the target's own (argmax or keyed sample), whatever the child
    was drawn from; rejection sampling's tries would need each child's own distribution, so
    its trees stay as they are. A leaf with the branch's first token at that depth gives way
    to it (siblings with one token: the first would end the path). ``copy_length``: how many
    of the guesses to hang (None: all), as their measured chance pays for their rows."""
    confirmed = 0
    while (
        confirmed < min(len(offered), len(chain_ids)) and offered[confirmed] == chain_ids[confirmed]
    ):
        confirmed += 1
    copy = offered[confirmed:]
    if not copy or (sampled and not coupled):
        return tree
    assert tree.parents is not None, "a tree"
    if copy_length is not None:
        assert tree.confidences is not None, "a tree's chain carries its confidences"
        copy = copy[: copy_length(tree.confidences, len(tree.token_ids) + 1, confirmed, len(copy))]
        if not copy:
            return tree
    n_chain = len(chain_ids)
    keep = [
        i
        for i in range(n_chain, len(tree.token_ids))
        if not (tree.parents[i] == confirmed - 1 and tree.token_ids[i] == copy[0])
    ]
    nodes = list(range(n_chain)) + keep
    token_ids = [tree.token_ids[i] for i in nodes] + copy
    first = len(nodes)
    parents = (
        [tree.parents[i] for i in nodes]
        + [confirmed - 1]
        + [first + i for i in range(len(copy) - 1)]
    )
    draft_probs = None
    if tree.draft_probs is not None:  # coupled: the copy's rows are point masses
        points = torch.zeros(len(copy), tree.draft_probs.shape[1])
        points[torch.arange(len(copy)), torch.tensor(copy)] = 1.0
        draft_probs = torch.cat([tree.draft_probs[nodes], points])
    return Proposal(token_ids, draft_probs, tree.drafter, tree.confidences, parents, len(copy))


def runner_up(dist: torch.Tensor, chosen: int) -> float:
    """The likeliest token's probability in ``dist`` once ``chosen`` is ruled out and the
    rest renormalised (``second_choice``'s third value, up to rounding), from a maximum
    over the row without copying it; 0.0 where ``chosen`` holds all the mass."""
    rest = 1.0 - float(dist[chosen])
    if rest <= 0.0:
        return 0.0
    best = max(float(part.max()) for part in (dist[:chosen], dist[chosen + 1 :]) if len(part))
    return min(1.0, best / rest)


def second_choice(
    dist: torch.Tensor,  # [vocab]: the draft's distribution at this depth (``_distribution``)
    sampled: bool,  # the chain's token was drawn from ``dist`` (else greedy: its argmax)
    chosen: int,  # the chain's token
    sampler: Sampler,
    position: int,
) -> tuple[int, torch.Tensor | None, float]:
    """The draft's second choice at a depth, the distribution it came from (None: greedy,
    a point mass), and the runner-up's probability once the chain's token is ruled out (what
    decides whether the leaf is verified); -1 where there is none. Drawn as a sibling
    without replacement: greedy, the runner-up; coupled, the runner-up of the same race; else
    a sample of the distribution without the chain's token, renormalised (what
    ``verify_tree`` verifies it against).

    Exactness: whether a sampled leaf is kept may depend on the chain's tokens but not on
    the leaf's own: kept only when likely, a leaf would no longer be a draw from the
    distribution it is verified against. Hence the runner-up's probability, the same
    whichever token was drawn."""
    rest = dist.clone()
    rest[chosen] = 0.0
    mass = float(rest.sum())
    if mass <= 0.0:
        return -1, None, 0.0
    rest = rest / mass
    if not sampled:
        token = argmax_rows(rest)[0]
    elif sampler.coupled:
        token = sampler.race(rest, position)
    else:
        token = sample(rest, sampler.generator)
    return token, rest if sampled else None, float(rest.max())


def _distribution(logits: torch.Tensor, probs: torch.Tensor | None) -> torch.Tensor:
    """What the draft's confidence in its token is read from: the distribution it was
    sampled from, or the softmax of the raw logits when greedy."""
    return probs if probs is not None else torch.softmax(logits.float(), dim=-1)


def _confidence(logits: torch.Tensor, token_id: int, probs: torch.Tensor | None) -> float:
    """The draft's probability of its own token (``_distribution``)."""
    return float(_distribution(logits, probs)[token_id])
