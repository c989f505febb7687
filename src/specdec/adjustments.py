"""What a request changes in the target's logits before sampling: ``logit_bias`` and the
repetition, frequency and presence penalties (``SamplingParams``). Pure functions.

In vLLM's order (its sampler: logit bias, then repetition, frequency, presence), on the
raw logits, before temperature, top-k and top-p:

- ``logit_bias``: ``bias[t]`` added to token t's logit (OpenAI: -100 bans, 100 forces);
- ``repetition_penalty`` r (an extension, vLLM's and transformers' name): the logit of a
  token seen in the prompt or the output so far divided by r where positive, multiplied by r
  where not;
- ``frequency_penalty`` f and ``presence_penalty`` p (OpenAI's): ``f * count[t] + p *
  (count[t] > 0)`` subtracted, ``count[t]`` being how often the output so far holds t.

Exactness: the output follows the target's distribution after these changes, the one plain
decoding samples from with them. Row i of a verify pass scores the token after the context
and the drafts on its path (``row_paths``), so its counts include those drafts, as plain
decoding's would once they are emitted. Each element is changed on its own, in float32, from
its raw logit, its count, whether it was seen and its bias alone, so on the batch-invariant
runtimes a row's adjusted logits are the same bits in a verify pass as in a plain step.
Logprobs stay the raw model's (``logprobs.py``, vLLM's default).

The drafter's rows are changed alike (``DraftRows``), so that it proposes what the changed
target would: a penalised token is seldom drafted only to be rejected. That is for speed
alone; exactness needs only that each draft's distribution is the one it was drawn from.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from specdec.config import SamplingParams
from specdec.tree import row_parents


def adjusts(params: SamplingParams) -> bool:
    """Whether ``params`` change the target's logits at all."""
    return bool(
        params.logit_bias
        or params.presence_penalty
        or params.frequency_penalty
        or params.repetition_penalty != 1.0
    )


def check_token_ids(params: SamplingParams, vocab_size: int) -> None:
    """ValueError naming the ``logit_bias`` keys (or ``stop_token_ids``) outside a
    vocabulary of ``vocab_size``."""
    for name, ids in (("logit_bias", params.token_bias), ("stop_token_ids", params.stop_token_ids)):
        outside = [token for token in ids if token >= vocab_size]
        if outside:
            raise ValueError(
                f"{name} names ids outside the vocabulary [0, {vocab_size}): {outside[:5]}"
            )


def row_paths(token_ids: Sequence[int], parents: Sequence[int] | None) -> list[list[int]]:
    """The drafts each scored row of a round follows, after the context: ``[last context
    token] + drafts`` scored as a chain (``parents`` None), row i follows ``token_ids[:i]``;
    as a tree, row r (node r - 1) follows its ancestors' tokens and its own."""
    if parents is None:
        return [list(token_ids[:i]) for i in range(len(token_ids) + 1)]
    paths: list[list[int]] = []
    for row, parent in enumerate(row_parents(parents)):
        paths.append([] if parent < 0 else [*paths[parent], token_ids[row - 1]])
    return paths


@dataclass(frozen=True)
class Columns:
    """The tokens a request's changes touch before this round's drafts, sorted, with their
    count in the output, whether they were seen (prompt or output; under a repetition
    penalty) and their bias (``columns``). Built once a round; each row adds its drafts."""

    ids: np.ndarray  # int64, sorted
    count: np.ndarray  # float32
    seen: np.ndarray  # bool
    bias: np.ndarray  # float32


def columns(
    params: SamplingParams,
    counts: Mapping[int, int],  # how often the output so far holds each token
    seen: Collection[int],  # the tokens of the prompt and of the output so far
) -> Columns:
    bias = params.token_bias
    touched = set(bias)
    if _counted(params):
        touched.update(counts)
    if _repetition(params):
        touched.update(seen)
    ids = np.array(sorted(touched), dtype=np.int64)
    count = np.zeros(len(ids), dtype=np.float32)
    if counts and _counted(params):
        count[np.searchsorted(ids, np.fromiter(counts, np.int64, len(counts)))] = list(
            counts.values()
        )
    was_seen = np.zeros(len(ids), dtype=bool)
    if _repetition(params):
        was_seen[np.searchsorted(ids, np.fromiter(seen, np.int64, len(seen)))] = True
    given = np.zeros(len(ids), dtype=np.float32)
    if bias:
        given[np.searchsorted(ids, np.fromiter(bias, np.int64, len(bias)))] = list(bias.values())
    return Columns(ids, count, was_seen, given)


def adjusted(
    logits: torch.Tensor,  # [rows, vocab]
    params: SamplingParams,
    base: Columns,  # ``columns`` of the output so far
    paths: Sequence[Sequence[int]],  # row i follows paths[i] after it (``row_paths``)
) -> torch.Tensor:
    """The rows of ``logits`` as ``params`` change them (float32; the input is not changed).
    Only the columns of tokens that are biased, counted, seen (under a repetition penalty)
    or drafted are touched."""
    rows = logits.shape[0]
    ids, count, was_seen, bias = base.ids, base.count, base.seen, base.bias
    drafted = _counted(params) or _repetition(params)
    column_of: dict[int, int] = {}  # each drafted token's column
    if drafted:
        tokens = sorted({t for path in paths[:rows] for t in path})
        at = np.searchsorted(ids, np.array(tokens, dtype=np.int64)).tolist()
        new: list[int] = []  # the drafts' tokens not among the base's: columns of their own
        for token, column in zip(tokens, at, strict=True):
            if column < len(ids) and ids[column] == token:
                column_of[token] = column
            else:
                column_of[token] = len(ids) + len(new)
                new.append(token)
        if new:
            ids = np.concatenate([ids, np.array(new, dtype=np.int64)])
            count = np.concatenate([count, np.zeros(len(new), dtype=np.float32)])
            was_seen = np.concatenate([was_seen, np.zeros(len(new), dtype=bool)])
            bias = np.concatenate([bias, np.zeros(len(new), dtype=np.float32)])
    if len(ids) == 0:
        return logits.float()
    count = np.tile(count, (rows, 1))
    was_seen = np.tile(was_seen, (rows, 1))
    for row, path in enumerate(paths[:rows] if drafted else ()):
        for token in path:
            count[row, column_of[token]] += 1
            was_seen[row, column_of[token]] = True

    out = logits.detach().float().clone()
    view = out.numpy()
    values = view[:, ids]
    values += bias
    if _repetition(params):
        r = np.float32(params.repetition_penalty)
        values = np.where(was_seen, np.where(values > 0, values / r, values * r), values)
    if params.frequency_penalty:
        values -= np.float32(params.frequency_penalty) * count
    if params.presence_penalty:
        values -= np.float32(params.presence_penalty) * (count > 0).astype(np.float32)
    view[:, ids] = values
    return out


def held_back(
    logits: torch.Tensor,  # [rows, vocab]
    end_ids: Sequence[int],
    written: Sequence[int],  # the output's length before each row's token
    min_tokens: int,
) -> torch.Tensor:
    """``min_tokens`` (vLLM's): the rows whose token would come before the output has
    ``min_tokens`` tokens get -inf at the tokens that would end it (``end_ids``: EOS and
    the stop tokens; a copy, float32). Each element on its own: a row's values are the same
    bits in a verify pass as in a plain step."""
    short = [row for row, length in enumerate(written[: logits.shape[0]]) if length < min_tokens]
    if not short or not end_ids:
        return logits
    out = logits.detach().float().clone()
    out[torch.tensor(short)[:, None], torch.tensor(list(end_ids))[None, :]] = -torch.inf
    return out


def _counted(params: SamplingParams) -> bool:
    return params.presence_penalty != 0 or params.frequency_penalty != 0


def _repetition(params: SamplingParams) -> bool:
    return params.repetition_penalty != 1.0


class DraftRows:
    """A round's adjustments on the rows the drafter draws from (``sampling.Sampler.
    draft_rows``), from sequence position ``start`` (the context's length) on, after the
    ``given`` drafts (the grammar's forced ones). Row at position p follows the drafts picked
    at the positions before it; a row of another length than the target's vocabulary, or
    whose path was not drawn through ``Sampler.pick``, is left as the drafter gave it."""

    def __init__(
        self,
        params: SamplingParams,
        base: Columns,
        start: int,
        vocab: int,
        given: Sequence[int] = (),
    ):
        self.params, self.base = params, base
        self.start, self.vocab = start, vocab
        self.picks = {start + i: token for i, token in enumerate(given)}

    def row(self, position: int, logits: torch.Tensor) -> torch.Tensor:
        """``logits``  # [vocab] at ``position``, changed as the target's row there would be."""
        path = [self.picks.get(p) for p in range(self.start, position)]
        if logits.shape[-1] != self.vocab or None in path:
            return logits
        return adjusted(logits.unsqueeze(0), self.params, self.base, [path])[0]  # type: ignore[list-item]

    def picked(self, position: int, token_id: int) -> None:
        """The draft drawn at ``position``: the rows after it follow it (a chain member that
        drafts again from an earlier position replaces what was picked from there on)."""
        for later in [p for p in self.picks if p >= position]:
            del self.picks[later]
        self.picks[position] = token_id
