"""One loaded int8 or int4 model, many token sequences: the new tokens of all of them in one pass.

``BatchedModel`` is the model, loaded once; ``sequence()`` gives a ``Backend`` over one
growing token sequence with its own KV cache (a ``KVBuffer`` per layer, what a request
decodes); ``forward_many`` scores the new tokens of many sequences in ONE pass of the
weights, each row against its own sequence's cache, whatever their lengths and block sizes.
On a CPU a step reads every weight once whatever the rows: the int8 1.5B scores 9 rows for
1.1-1.9x the cost of one. The decoder layers run on the kernel's layer stack
(``layer_stack.py``), specdec's one layer loop.

Exactness: on the batch-invariant int8 and int4 runtimes (``backends/quant/``) every row of a
pass is computed as it would be alone: the linear layers, norms and activation are
row-invariant, and attention runs one query row at a time over its own sequence's cache. So
a sequence gets the same logits, bit for bit, in a batch of any company as alone, and as
transformers' forward over the same model (``tests/backends/test_batched.py``,
``tests/backends/test_layer_stack.py``). ``supports(model)`` says whether the stack runs a
model's layers (int8 or int4 Llama-family layers, the kernel built). If a pass fails, every
sequence is cut back to what it held.

Shared prefixes (``ModelSequence.reuse_prefix``): a new sequence whose tokens begin like
another's (a chat template's system prompt, a shared instruction) copies that sequence's keys
and values for the common prefix instead of computing them. Since every row is computed as
it would be alone, those are the very bits its own prefill would give. The sequences alive,
and those last to end (``BatchedModel.retire``, up to ``keep_bytes``), are the donors. A
prompt's scores (``prompt_logprobs``) are shared the same way
(``ModelSequence.prefix_scores``): choices of one question scored one after another
(lm-evaluation-harness's multiple choice) compute their common context once.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from specdec.backends.base import common_prefix_length, eos_token_ids
from specdec.backends.kv_buffer import KVBuffer
from specdec.backends.layer_stack import LayerParts, LayerStack
from specdec.backends.quant.int4 import RowInt4Linear
from specdec.backends.quant.int8 import RowInt8Linear
from specdec.backends.trim import TrimmedHead
from specdec.config import DEFAULT_PREFIX_CACHE_MB
from specdec.logprobs import TokenLogprob
from specdec.tree import check, row_depths


def supports(model: Any) -> bool:
    """Whether ``model`` is a causal LM on the int8 or int4 runtime whose decoder layers the
    kernel's layer stack runs (plain Llama-family layers on the row operations)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if layers is None:
        return False
    head = model.get_output_embeddings()
    head = head.sub if isinstance(head, TrimmedHead) else head
    if not isinstance(head, RowInt8Linear | RowInt4Linear):
        return False
    if not all(hasattr(decoder, name) for name in ("embed_tokens", "rotary_emb", "norm")):
        return False
    if not all(LayerParts.fused(layer) for layer in layers):
        return False
    return LayerStack.of([LayerParts.of(layer) for layer in layers]) is not None


@dataclass(eq=False)
class Held:
    """What a sequence holds: a KV cache per decoder layer, the token ids in it, the kept
    features (heads) and its prompt's scores as they grow (``keep_scores``: top, prompt
    tokens, entries). It outlives its sequence for a while as a prefix donor
    (``BatchedModel.retire``)."""

    layers: list[KVBuffer]
    ids: list[int] = field(default_factory=list)
    hidden: torch.Tensor | None = None  # [capacity, hidden] once kept
    scores: tuple[int, list[int], list[TokenLogprob | None]] | None = None

    @property
    def nbytes(self) -> int:
        """The memory its buffers take (their capacity, not only the positions held)."""
        hidden = 0 if self.hidden is None else self.hidden.nbytes
        return hidden + sum(layer.nbytes for layer in self.layers)

    def covers(self, other: Held) -> bool:
        """Whether a sequence would copy all it could from ``other`` from this instead: its
        tokens begin with all of ``other``'s, with features where ``other`` has them, and
        ``other`` keeps no scores."""
        n = len(other.ids)
        return (
            other.scores is None
            and (other.hidden is None or self.hidden is not None)
            and common_prefix_length(self.ids, other.ids) == n
        )


class ModelSequence:
    """A ``Backend`` over one token sequence of a ``BatchedModel``: its own KV cache (and
    kept features, for heads); ``forward`` is a pass with this sequence alone."""

    scores_trees = True  # forward_tree, keep_path

    def __init__(self, model: BatchedModel):
        self.source = model  # the model this is a sequence of
        self.tokenizer = model.tokenizer
        self.vocab_size, self.eos_token_ids = model.vocab_size, model.eos_token_ids
        self.max_length = model.max_length
        self.held = Held([KVBuffer() for _ in range(model.stack.size)])
        weakref.finalize(self, model.retire, self.held)  # a donor for a while after it

    @property
    def cached_token_ids(self) -> Sequence[int]:
        return self.held.ids

    @property
    def layers(self) -> list[KVBuffer]:
        """Its KV cache, a buffer per decoder layer."""
        return self.held.layers

    @property
    def batched(self) -> BatchedModel:
        """The model whose ``forward_many`` scores this sequence in one pass with its other
        sequences (``engine.step_together`` batches the drafts of such sequences): the
        ``source``. Other backends have no ``batched``; their passes run one at a time."""
        return self.source

    @property
    def model(self) -> Any:
        """The transformers model (shared by every sequence)."""
        return self.source.model

    @property
    def hidden_size(self) -> int:
        return int(self.source.model.config.hidden_size)

    def keep_hidden_states(self) -> None:
        """Keep every cached position's final-norm output (see ``HFModel``); the cache
        restarts empty. Idempotent."""
        if self.held.hidden is None:
            self.truncate(0)
            self.held.hidden = torch.empty(0, self.hidden_size)

    def hidden_states(self, start: int = 0, end: int | None = None) -> torch.Tensor:
        if self.held.hidden is None:
            raise ValueError("hidden states are not kept: call keep_hidden_states() first")
        return self.held.hidden[: len(self.held.ids)][start:end]

    def forward(self, token_ids: Sequence[int], last_only: bool = False) -> torch.Tensor:
        return self.source.forward_many([(self, list(token_ids), last_only)])[0]

    def forward_tree(self, token_ids: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """Score a token tree in one pass: row r (``token_ids[r]``) hangs under row
        ``parents[r]`` (-1: the cached text; a parent comes first), sits at the position of
        its depth and attends to the cached text and its own path only, so its logits are
        those of that path fed as a chain, bit for bit. ->  [len(token_ids), vocab_size].
        The cache then holds every row; ``keep_path`` keeps one path.

        A tree grown over several passes (a draft's, ``drafters.model``): ``parents`` may
        first list the parents of tree rows already cached (the last ``len(parents) -
        len(token_ids)`` cached positions, scored by earlier calls), the new rows' parents
        after them, indexed over all; the cached text is then what comes before the tree."""
        check(parents)
        held_tree = len(parents) - len(token_ids)
        if not 0 <= held_tree <= len(self.held.ids):
            raise ValueError(
                f"{len(parents)} parents for {len(token_ids)} rows and {len(self.held.ids)} cached"
            )
        return self.source.forward_many([(self, list(token_ids), False)], parents)[0]

    @torch.inference_mode()  # the caches were made in it
    def keep_path(self, start: int, rows: Sequence[int]) -> None:
        """After ``forward_tree`` of rows at ``start``: hold the first ``start`` positions
        and ``rows`` (a path from the root, increasing) after them."""
        for layer in self.held.layers:
            layer.keep_path(start, rows)
        self.held.ids[start:] = [self.held.ids[start + row] for row in rows]
        if self.held.hidden is not None:
            self.held.hidden[start : start + len(rows)] = self.held.hidden[
                [start + row for row in rows]
            ]

    def truncate(self, n: int) -> None:
        assert 0 <= n <= len(self.held.ids), f"cannot keep {n} of {len(self.held.ids)}"
        for layer in self.held.layers:
            layer.crop(n)
        del self.held.ids[n:]

    def reuse_prefix(self, token_ids: Sequence[int]) -> int:
        """Make the cache hold the longest prefix of ``token_ids`` that it or another
        sequence of the same model holds, copying it from that sequence when that is longer
        than what this one holds; returns its length. Bit for bit what a prefill of those
        tokens would give (every row is computed as alone)."""
        own = best = common_prefix_length(self.held.ids, token_ids)
        donor = None
        for other in self._donors():
            length = common_prefix_length(other.ids, token_ids)
            if length > best:
                best, donor = length, other
        if donor is None:
            self.truncate(best)
            return best
        for mine, theirs in zip(self.held.layers, donor.layers, strict=True):
            mine.copy_prefix(theirs, best)
        self.held.ids[:] = donor.ids[:best]
        if self.held.hidden is not None and donor.hidden is not None:
            self.held.hidden = donor.hidden[:best].clone()
        self.source.reused_tokens += best - own  # those it did not hold already
        return best

    def keep_scores(
        self, token_ids: Sequence[int], scored: list[TokenLogprob | None], top: int
    ) -> None:
        """Offer a prompt's scores to the model's other sequences (``prefix_scores``):
        ``scored`` (``Run.prompt_logprobs``, each with ``top`` most likely tokens; entry i
        is token i's) as it grows while ``token_ids`` are scored."""
        self.held.scores = (top, list(token_ids), scored)

    def prefix_scores(self, token_ids: Sequence[int], top: int) -> list[TokenLogprob | None]:
        """The scores of the longest prefix of ``token_ids`` that this or another sequence
        of the model has scored with ``top`` most likely tokens (``keep_scores``): entry i
        token i's, ``[None]`` where none. On these runtimes the very values a prefill of
        those tokens gives (every row is computed as alone)."""
        best: list[TokenLogprob | None] = [None]
        for other in [self.held, *self._donors()]:
            if other.scores is None or other.scores[0] != top:
                continue
            _, tokens, scored = other.scores
            length = common_prefix_length(tokens[: len(scored)], token_ids)
            if length > len(best):
                best = scored[:length]
        return best

    def _donors(self) -> list[Held]:
        """What the other sequences ``reuse_prefix`` may copy from hold (a sequence that
        keeps features needs a donor that kept them too)."""
        return [
            other
            for other in self.source.donors()
            if other is not self.held
            and not (self.held.hidden is not None and other.hidden is None)
        ]

    def shareable_prefixes(self) -> list[Sequence[int]]:
        """The token ids this cache and those ``reuse_prefix`` may copy from hold: a prefix
        of any of them costs no rows to have."""
        return [self.held.ids, *(other.ids for other in self._donors())]

    def _commit(self, token_ids: list[int], features: torch.Tensor) -> None:
        start, end = len(self.held.ids), len(self.held.ids) + len(token_ids)
        if self.held.hidden is not None:
            if self.held.hidden.shape[0] < end:
                grown = torch.empty(max(end, 2 * self.held.hidden.shape[0], 256), features.shape[1])
                grown[:start] = self.held.hidden[:start]
                self.held.hidden = grown
            self.held.hidden[start:end] = features
        self.held.ids.extend(token_ids)


# A sequence, its new tokens, last_only (None inside forward_many: a part of a longer pass
# whose logits are not wanted).
Work = tuple[ModelSequence, list[int], bool | None]


class BatchedModel:
    """A causal LM on the int8 or int4 runtime (``supports``), loaded once, decoding many
    sequences.

    >>> batched = BatchedModel(model, tokenizer)  # doctest: +SKIP
    >>> a, b = batched.sequence(), batched.sequence()  # doctest: +SKIP
    >>> work = [(a, [1, 2, 3], False), (b, [4], True)]  # a sequence, new tokens, last_only
    >>> logits_a, logits_b = batched.forward_many(work)  # doctest: +SKIP
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any | None = None,
        share_prefixes: bool = True,
        keep_bytes: int = DEFAULT_PREFIX_CACHE_MB << 20,
    ):
        if not supports(model):
            raise ValueError(
                f"{type(model).__name__}: batched decoding needs the int8 or int4 runtime "
                "with its kernel built and Llama-family layers (q/k/v/o attention, SiLU-gated MLP)"
            )
        self.model, self.tokenizer = model.eval(), tokenizer
        decoder = model.get_decoder()
        self.embed_tokens = decoder.get_submodule("embed_tokens")
        self.rotary_emb = decoder.get_submodule("rotary_emb")
        self.norm = decoder.get_submodule("norm")
        stack = LayerStack.of([LayerParts.of(layer) for layer in decoder.layers])
        assert stack is not None, "supports(model) says the stack runs its layers"
        self.stack = stack
        self.vocab_size = int(model.get_output_embeddings().out_features)
        self.eos_token_ids = frozenset(eos_token_ids(model, tokenizer))
        self.max_length = getattr(model.config, "max_position_embeddings", None)
        self._alive: weakref.WeakSet[ModelSequence] = weakref.WeakSet()
        self.share_prefixes = share_prefixes
        # what sequences no longer used held, oldest first, at most ``keep_bytes`` in all
        self.keep_bytes = keep_bytes
        self._kept: list[Held] = []
        self.reused_tokens = 0  # prompt tokens copied from another sequence instead of computed

    # The most rows one pass scores; more (a long prompt's prefill) go in consecutive passes,
    # whose rows are the same bits. Chosen on the AMX Xeon (family 6 model 167, 2 threads,
    # int4): prompts of 512 / 1024 / 2048 tokens took the 1.5B 3.12 / 8.46 / 20.7 s in one
    # pass and 2.26 / 5.21 / 12.7 in passes of 64 (32 and 128 slower), the 0.5B 1.10 / 2.93
    # / 8.51 against 0.82 / 1.96 / 5.28; most likely a pass's activations (n x 8960 floats
    # in the MLP) outgrow the caches (bench/results/2026-12-05-prefill-passes-xeon-amx).
    PASS_ROWS = 64

    def sequence(self) -> ModelSequence:
        made = ModelSequence(self)
        self._alive.add(made)
        return made

    def retire(self, held: Held) -> None:
        """A sequence is no longer used (its last reference gone): what it held stays a
        prefix donor (a conversation's next turn finds the turn before it, however many
        requests began since) while the caches kept take at most ``keep_bytes``, the
        oldest dropped first; one it covers (``Held.covers``: the turn before) is dropped
        at once. One that holds nothing, or more than ``keep_bytes``, is not kept."""
        if not held.ids or not self.share_prefixes or held.nbytes > self.keep_bytes:
            return
        kept = [old for old in self._kept if not held.covers(old)] + [held]
        total = sum(old.nbytes for old in kept)
        while total > self.keep_bytes:
            total -= kept.pop(0).nbytes
        self._kept = kept  # one assignment: a reader in another thread sees old or new

    def donors(self) -> list[Held]:
        """What the sequences alive and those kept after them hold (``retire``): what a
        new one may copy a prefix from (none when prefix sharing is off)."""
        if not self.share_prefixes:
            return []
        return [seq.held for seq in list(self._alive) if seq.held.ids] + self._kept

    def forward_many(
        self, work: Sequence[Work], parents: Sequence[int] | None = None
    ) -> list[torch.Tensor]:
        """Append each sequence's tokens to its cache; each gets logits  # [len(tokens),
        vocab_size] float32 ([1, vocab_size] when its last_only). A sequence appears at
        most once. If the pass fails, every sequence holds what it held before.
        ``parents``: the rows of one sequence form a tree (``ModelSequence.forward_tree``)."""
        assert work and all(tokens for _, tokens, _ in work), "every sequence needs tokens"
        assert len({id(seq) for seq, _, _ in work}) == len(work), "a sequence appears once"
        assert parents is None or (len(work) == 1 and len(parents) >= len(work[0][1])), (
            "a tree is one sequence's rows, a parent per held tree row and per row"
        )
        held = [len(seq.cached_token_ids) for seq, _, _ in work]
        try:
            if parents is not None or sum(len(tokens) for _, tokens, _ in work) <= self.PASS_ROWS:
                return self._forward(work, parents)
            return self._forward_in_passes(work)
        except BaseException:
            for (seq, _, _), n in zip(work, held, strict=True):
                seq.truncate(n)
            raise

    def _forward_in_passes(self, work: Sequence[Work]) -> list[torch.Tensor]:
        """``forward_many`` in passes of at most ``PASS_ROWS`` rows: the sequences in order,
        a long one's tokens split over consecutive passes, each part attending to the parts
        cached before it. A row's logits and cache entries are the same bits as in one pass
        (every row is computed as alone); a part before a last_only sequence's last asks for
        no logits."""
        logits: list[list[torch.Tensor]] = [[] for _ in work]
        part: list[tuple[int, Work]] = []  # (index in work, its part) of the pass being filled
        rows = 0
        for index, (seq, tokens, last_only) in enumerate(work):
            at = 0
            while at < len(tokens):
                end = min(len(tokens), at + self.PASS_ROWS - rows)
                wanted = not last_only or end == len(tokens)
                part.append((index, (seq, tokens[at:end], last_only if wanted else None)))
                rows += end - at
                at = end
                if rows == self.PASS_ROWS:
                    self._run_part(part, logits)
                    part, rows = [], 0
        if part:
            self._run_part(part, logits)
        return [torch.cat(pieces) if len(pieces) > 1 else pieces[0] for pieces in logits]

    def _run_part(self, part: list[tuple[int, Work]], logits: list[list[torch.Tensor]]) -> None:
        for (index, (_, _, last_only)), out in zip(
            part, self._forward([work for _, work in part], None), strict=True
        ):
            if last_only is not None:
                logits[index].append(out)

    @torch.inference_mode()
    def _forward(self, work: Sequence[Work], parents: Sequence[int] | None) -> list[torch.Tensor]:
        ids = [t for _, tokens, _ in work for t in tokens]
        if parents is None:
            positions = [
                p
                for seq, tokens, _ in work
                for p in range(len(seq.cached_token_ids), len(seq.cached_token_ids) + len(tokens))
            ]
        else:  # a tree's rows sit at the positions of their depths, under the cached text
            held_tree = len(parents) - len(work[0][1])
            start = len(work[0][0].cached_token_ids) - held_tree
            positions = [start + d for d in row_depths(parents)[held_tree:]]
        starts = [0]
        for _, tokens, _ in work:
            starts.append(starts[-1] + len(tokens))
        hidden = self.embed_tokens(torch.tensor([ids], dtype=torch.long))
        rotary = self.rotary_emb(hidden, torch.tensor([positions], dtype=torch.long))
        segments = [
            (seq.held.layers, starts[i], starts[i + 1]) for i, (seq, _, _) in enumerate(work)
        ]
        hidden = self.norm(self.stack.forward(hidden[0], rotary, segments, parents).unsqueeze(0))
        rows = [
            row
            for i, (_, _, last_only) in enumerate(work)
            if last_only is not None  # a part of a longer pass whose logits are not wanted
            for row in ([starts[i + 1] - 1] if last_only else range(starts[i], starts[i + 1]))
        ]
        logits = torch.empty(0, self.vocab_size)
        if rows:  # asked every pass: a draft's output layer may be trimmed after it was wrapped
            lm_head = self.model.get_output_embeddings()
            logits = lm_head(hidden[:, rows])[0, :, : self.vocab_size].float()
        out, at = [], 0
        for i, (seq, tokens, last_only) in enumerate(work):
            count = 0 if last_only is None else 1 if last_only else len(tokens)
            out.append(logits[at : at + count])
            at += count
            seq._commit(tokens, hidden[0, starts[i] : starts[i + 1]].float())
        return out
