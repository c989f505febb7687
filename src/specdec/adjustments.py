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


def adjusted(
    logits: torch.Tensor,  # [rows, vocab]
    params: SamplingParams,
    counts: Mapping[int, int],  # how often the output so far holds each token
    seen: Collection[int],  # the tokens of the prompt and of the output so far
    paths: Sequence[Sequence[int]],  # row i follows paths[i] after them (``row_paths``)
) -> torch.Tensor:
    """The rows of ``logits`` as ``params`` change them (float32; the input is not changed).
    Only the columns of tokens that are biased, counted, seen (under a repetition penalty)
    or drafted are touched."""
    bias = params.token_bias
    repetition = params.repetition_penalty != 1.0
    counted = params.presence_penalty != 0 or params.frequency_penalty != 0
    columns: set[int] = set(bias)
    if counted:
        columns.update(counts)
    if repetition:
        columns.update(seen)
    if counted or repetition:
        for path in paths:
            columns.update(path)
    if not columns:
        return logits.float()
    ids = sorted(columns)
    column_of = {token: column for column, token in enumerate(ids)}
    rows = logits.shape[0]
    count = np.zeros((rows, len(ids)), dtype=np.float32)
    count[:] = [counts.get(token, 0) for token in ids]
    was_seen = np.zeros((rows, len(ids)), dtype=bool)
    if repetition:
        was_seen[:] = [token in seen for token in ids]
    for row, path in enumerate(paths[:rows]):
        for token in path:
            count[row, column_of[token]] += 1
            was_seen[row, column_of[token]] = True

    out = logits.detach().float().clone()
    view = out.numpy()
    values = view[:, ids]
    values += np.array([bias.get(token, 0.0) for token in ids], dtype=np.float32)
    if repetition:
        r = np.float32(params.repetition_penalty)
        values = np.where(was_seen, np.where(values > 0, values / r, values * r), values)
    if params.frequency_penalty:
        values -= np.float32(params.frequency_penalty) * count
    if params.presence_penalty:
        values -= np.float32(params.presence_penalty) * (count > 0).astype(np.float32)
    view[:, ids] = values
    return out


class DraftRows:
    """A round's adjustments on the rows the drafter draws from (``sampling.Sampler.
    draft_rows``), from sequence position ``start`` (the context's length) on, after the
    ``given`` drafts (the grammar's forced ones). Row at position p follows the drafts picked
    at the positions before it; a row of another length than the target's vocabulary, or
    whose path was not drawn through ``Sampler.pick``, is left as the drafter gave it."""

    def __init__(
        self,
        params: SamplingParams,
        counts: Mapping[int, int],
        seen: Collection[int],
        start: int,
        vocab: int,
        given: Sequence[int] = (),
    ):
        self.params, self.counts, self.seen = params, counts, seen
        self.start, self.vocab = start, vocab
        self.picks = {start + i: token for i, token in enumerate(given)}

    def row(self, position: int, logits: torch.Tensor) -> torch.Tensor:
        """``logits``  # [vocab] at ``position``, changed as the target's row there would be."""
        path = [self.picks.get(p) for p in range(self.start, position)]
        if logits.shape[-1] != self.vocab or None in path:
            return logits
        return adjusted(logits.unsqueeze(0), self.params, self.counts, self.seen, [path])[0]  # type: ignore[list-item]

    def picked(self, position: int, token_id: int) -> None:
        """The draft drawn at ``position``: the rows after it follow it (a chain member that
        drafts again from an earlier position replaces what was picked from there on)."""
        for later in [p for p in self.picks if p >= position]:
            del self.picks[later]
        self.picks[position] = token_id
