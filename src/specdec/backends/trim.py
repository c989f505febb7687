"""A draft model whose output layer scores only the most frequent tokens (FR-Spec, Zhao et
al. 2025).

Why: the 0.5B draft's output layer (151,936 x 896) is about a quarter of its weights, and
a draft step reads all of them. Restricted to the N tokens that make up most of real text,
a step reads far fewer bytes. Exactness is untouched: the draft gives probability 0 to every
other token (its logits there are -inf), so ``draft_probs`` is still exactly the
distribution its tokens were sampled from, and the target verifies over its full vocabulary.
A token outside the subset can still be emitted: by the target, after a rejection.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from specdec.backends.quant.int4 import RowInt4Linear, dequantize, unpack
from specdec.backends.quant.int8 import RowInt8Linear


class TrimmedHead(nn.Module):
    """Scores ``token_ids`` only; every other logit is -inf.  out  # [..., vocab]"""

    def __init__(self, head: nn.Module, token_ids: Sequence[int], vocab_size: int):
        super().__init__()
        ids = torch.tensor(sorted(set(int(t) for t in token_ids)), dtype=torch.long)
        if ids.numel() == 0 or ids[0] < 0 or ids[-1] >= vocab_size:
            raise ValueError(f"trimmed vocabulary ids must lie in [0, {vocab_size})")
        self.token_ids, self.vocab_size = ids, vocab_size
        self.out_features = vocab_size  # the logits' width, as a Linear would report it
        self.sub = _rows(head, ids)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.sub(x)[..., : len(self.token_ids)]  # an int4 layer pads its outputs
        out = torch.full((*scores.shape[:-1], self.vocab_size), float("-inf"))
        # scatter_ rather than indexing: the same values, in a third of the time
        index = self.token_ids.expand(*scores.shape[:-1], -1)
        return out.scatter_(-1, index, scores.float())


def _rows(head: nn.Module, ids: torch.Tensor) -> nn.Module:
    """The output layer restricted to the rows ``ids``."""
    if isinstance(head, RowInt8Linear):
        int8, scales = head.int8_state()
        bias = None if head.bias is None else head.bias[ids]
        return RowInt8Linear.from_int8(int8[ids], scales[ids], bias)
    if isinstance(head, RowInt4Linear):
        return head.rows(ids)
    if isinstance(head, nn.Linear):
        sub = nn.Linear(head.in_features, len(ids), bias=head.bias is not None)
        with torch.no_grad():
            sub.weight.copy_(head.weight[ids])
            if head.bias is not None:
                sub.bias.copy_(head.bias[ids])
        return sub.to(head.weight.dtype)
    raise ValueError(f"cannot trim an output layer of type {type(head).__name__}")


def float_rows(head: nn.Module, ids: Sequence[int]) -> torch.Tensor:
    """The output layer's weight rows ``ids`` as float32  # [len(ids), in] (dequantized
    from int8 or int4, pin columns dropped): what training differentiates through."""
    index = torch.tensor(list(ids), dtype=torch.long)
    if isinstance(head, TrimmedHead):
        raise ValueError("the output layer is already trimmed")
    if isinstance(head, RowInt8Linear):
        int8, scales = head.int8_state()
        rows = int8[index, : head.in_features].float() * scales[index, None].float()
        return rows.contiguous()
    if isinstance(head, RowInt4Linear):
        codes, scales, minimums = unpack(head.packed)
        return dequantize(codes[index], scales[index], minimums[index]).contiguous()
    if isinstance(head, nn.Linear):
        return head.weight.detach()[index].float().contiguous()
    raise ValueError(f"cannot read the rows of an output layer of type {type(head).__name__}")


def trim_output_layer(model, token_ids: Sequence[int]) -> None:
    """Replace a transformers model's output layer by a ``TrimmedHead`` (in place)."""
    head = model.get_output_embeddings()
    vocab_size = int(getattr(head, "out_features", model.config.vocab_size))
    model.set_output_embeddings(TrimmedHead(head, token_ids, vocab_size))


def trim_to_vocabulary_file(draft, path: str) -> None:
    """Restrict a transformers draft's output layer to a vocabulary file's tokens
    (``specdec vocab build``)."""
    from specdec import vocab

    if not hasattr(getattr(draft, "model", None), "get_output_embeddings"):  # not transformers'
        raise ValueError("--draft-vocab needs a transformers draft (--draft-runtime transformers)")
    trim_output_layer(draft.model, vocab.load(path, draft.vocab_size))
