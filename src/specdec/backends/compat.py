"""Can two backends be a target/draft pair? Their token ids must mean the same thing."""

from __future__ import annotations

from specdec.backends.base import Backend

SAMPLE_STRIDE = 997  # a prime: the sample spreads over the whole vocabulary


def check_same_vocabulary(target: Backend, draft: Backend, samples: int = 200) -> None:
    """Raise ValueError unless vocabulary size, EOS and the text of sampled ids agree."""
    if target.vocab_size != draft.vocab_size:
        raise ValueError(
            f"the draft's vocabulary has {draft.vocab_size} ids, the target's "
            f"{target.vocab_size}: they cannot be a pair"
        )
    if not target.eos_token_ids & draft.eos_token_ids:
        raise ValueError(
            f"EOS ids differ (target {sorted(target.eos_token_ids)}, draft "
            f"{sorted(draft.eos_token_ids)}): not the same tokenizer"
        )
    if target.tokenizer is None or draft.tokenizer is None:
        return
    limit = min(
        target.vocab_size,
        len_or(target.tokenizer, target.vocab_size),
        len_or(draft.tokenizer, draft.vocab_size),
    )
    ids = sorted({(i * SAMPLE_STRIDE) % limit for i in range(samples)})
    for token_id in ids:
        left = target.tokenizer.decode([token_id])
        right = draft.tokenizer.decode([token_id])
        if left != right:
            raise ValueError(
                f"token {token_id} is {left!r} for the target but {right!r} for the "
                "draft: the tokenizers differ"
            )


def len_or(tokenizer, default: int) -> int:
    try:
        return len(tokenizer)
    except TypeError:
        return default
