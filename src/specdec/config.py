"""User-facing configuration: validated, frozen dataclasses.

Bad values raise ``ValueError`` naming the parameter and the fix, so the CLI and the
server can show the message as is.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

# Rows one batched target pass may score, split evenly among the active requests (with 4
# requests, k up to 7 each). Measured on the int8 1.5B (AMD EPYC, 2 threads): 4 sequences x 5
# rows 100 ms, 8 x 5 213 ms, against 50 ms for one 1-token step.
DEFAULT_MAX_ROWS = 32
# Prompt tokens a serving step prefills into each model for a request joining it
# (``server/scheduler.py``): a longer prompt is fed in parts between the other requests'
# steps. One pass of ``BatchedModel.PASS_ROWS``: the shortest stall of the streams measured,
# for a later first token of the long prompt (bench/results/2026-12-05-long-join-xeon-amx).
DEFAULT_PREFILL_ROWS = 64
# Requests a server lets wait beyond its active ones (a waiting request holds no KV cache):
# room for a batch of 128 prompts in one request (``server/schemas.py``'s MAX_PROMPTS).
DEFAULT_MAX_QUEUE = 128
# Memory each batched model keeps, after their requests end, for the caches that prompts to
# come may begin like (a conversation's next turn), the oldest dropped first: ~18,000
# positions of the default target's cache (56 KB each, float32).
DEFAULT_PREFIX_CACHE_MB = 1024

TREES = ("off", "auto", "full", "deep")
VERIFICATIONS = ("auto", "rejection", "coupled")
# Temperatures below float32's smallest normal number are greedy (0): logits / temperature
# cannot be computed in float32 there (the divisor rounds to a subnormal or to 0, and
# 0 / 0 is NaN), and the distribution they approach is the argmax anyway.
GREEDY_BELOW = 2.0**-126
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)  # what torch.Generator.manual_seed accepts
REPETITION_RANGE = (0.01, 100.0)  # repetition_penalty's: logits stay finite in float32
MAX_TOP_LOGPROBS = 20  # OpenAI's limit on top_logprobs (and on completions' logprobs)
CONSTRAINT_KINDS = ("json_object", "json_schema", "regex", "lark")


@dataclass(frozen=True)
class Constraint:
    """Output that must follow a grammar (structured output, ``grammar.py``). ``kind``:
    ``json_object`` (any JSON object; ``source`` unused), ``json_schema`` (``source``: the
    schema as JSON text), ``regex`` (``source``: a regular expression the whole output
    matches) or ``lark`` (``source``: a grammar in llguidance's Lark syntax)."""

    kind: str
    source: str = ""

    def __post_init__(self) -> None:
        if self.kind not in CONSTRAINT_KINDS:
            raise ValueError(
                f"constraint kind must be one of {', '.join(CONSTRAINT_KINDS)}, got {self.kind!r}"
            )
        if not isinstance(self.source, str) or (self.kind != "json_object" and not self.source):
            raise ValueError(f"a {self.kind} constraint needs its source text")


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are chosen. ``temperature == 0`` means greedy (argmax); so does any
    temperature below ``GREEDY_BELOW`` (about 1.2e-38), which is stored as 0.

    ``top_k == 0`` and ``top_p == 1.0`` disable those filters. ``stop`` strings end the
    output before the first occurrence of any of them. ``seed`` seeds the request's own
    ``torch.Generator``; ``None`` draws a fresh seed. ``logprobs``: ``None`` returns none;
    ``n`` (0 to 20) returns each emitted token's log-probability under the target model and
    the ``n`` most likely tokens at its position (``logprobs.py`` says which distribution).
    ``prompt_logprobs`` (vLLM's name; ``None`` or 0 to 20) does the same for the prompt's
    tokens, each given the ones before it (the first has none): the target's prefill then
    keeps every row's logits (``Output.prompt_logprobs``).
    ``constraint``: the output follows the target's distribution restricted to what the
    grammar allows (``grammar.py``); it ends when the grammar is complete. ``stop_token_ids``
    (vLLM's): tokens that end the output as EOS does (kept in ``token_ids``, not in the
    text); ``ignore_eos`` ignores EOS but not them. ``min_tokens`` (vLLM's): EOS and those
    tokens cannot end the output before it has that many tokens, nor a stop string that
    ends within their text (not with a ``constraint``, which may need EOS sooner).

    ``logit_bias`` (token id -> a bias in [-100, 100], added to its logit; a mapping, kept as
    sorted pairs), ``presence_penalty`` and ``frequency_penalty`` (OpenAI's, in [-2, 2]: a
    token's logit lowered by the penalty once it is in the output, or by the penalty times
    its count there) and ``repetition_penalty`` (0.01 to 100, 1 off: the logit of a token of the
    prompt or the output divided by it where positive, multiplied where not) change the
    target's distribution; the output follows the changed one (``adjustments.py``).
    """

    max_tokens: int = 64
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    constraint: Constraint | None = None
    logit_bias: Mapping[int, float] | tuple[tuple[int, float], ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not _number(self.temperature) or self.temperature < 0:  # NaN is not a number here
            raise ValueError(
                "temperature must be a finite number >= 0 (0 means greedy), "
                f"got {self.temperature!r}"
            )
        if self.temperature < GREEDY_BELOW:
            object.__setattr__(self, "temperature", 0.0)
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1 disables it), got {self.top_p}")
        if self.seed is not None and (
            isinstance(self.seed, bool)
            or not isinstance(self.seed, int)
            or not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]
        ):
            raise ValueError(
                f"seed must be an integer in [-2**63, 2**64 - 1] or None, got {self.seed!r}"
            )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, int)
                or not 0 <= value <= MAX_TOP_LOGPROBS
            ):
                raise ValueError(
                    f"{name} must be an integer in [0, {MAX_TOP_LOGPROBS}] (the most likely "
                    f"tokens to return beside each token's own) or None, got {value!r}"
                )
        if self.constraint is not None and not isinstance(self.constraint, Constraint):
            raise ValueError(f"constraint must be a Constraint or None, got {self.constraint!r}")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        if any(not isinstance(s, str) or s == "" for s in self.stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}")
        if isinstance(self.min_tokens, bool) or not isinstance(self.min_tokens, int):
            raise ValueError(f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(
                f"min_tokens must be in [0, max_tokens = {self.max_tokens}], got {self.min_tokens}"
            )
        if self.min_tokens and self.constraint is not None:
            raise ValueError(
                "min_tokens is not combined with a constraint (a grammar may end sooner)"
            )
        stop_ids = self.stop_token_ids
        if (
            isinstance(stop_ids, str | bytes)
            or not isinstance(stop_ids, Collection)
            or any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in stop_ids)
        ):
            raise ValueError(f"stop_token_ids must be token ids (integers >= 0), got {stop_ids!r}")
        object.__setattr__(self, "stop_token_ids", tuple(sorted(set(stop_ids))))
        object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _number(value) or not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be a number in [-2, 2] (0 is off), got {value!r}")
        # Bounded so that no finite logit divided or multiplied by it overflows float32 (a
        # tiny penalty sent positive logits to inf, and their softmax to NaN).
        value = self.repetition_penalty
        if not _number(value) or not REPETITION_RANGE[0] <= value <= REPETITION_RANGE[1]:
            raise ValueError(
                f"repetition_penalty must be a number in [{REPETITION_RANGE[0]:g}, "
                f"{REPETITION_RANGE[1]:g}] (1 is off), got {value!r}"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def token_bias(self) -> dict[int, float]:
        """``logit_bias`` as a mapping of token id to bias."""
        return dict(cast(tuple[tuple[int, float], ...], self.logit_bias))


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _bias_pairs(bias: object) -> tuple[tuple[int, float], ...]:
    """``logit_bias`` as (token id, bias) pairs sorted by id (hashable, one per token)."""
    pairs: Any = bias.items() if isinstance(bias, Mapping) else bias
    try:
        out = {token: value for token, value in pairs}
    except (TypeError, ValueError):
        raise ValueError(
            f"logit_bias must map token ids to biases (e.g. {{198: -100}}), got {bias!r}"
        ) from None
    for token, value in out.items():
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise ValueError(f"logit_bias keys must be token ids (integers >= 0), got {token!r}")
        if not _number(value) or not -100.0 <= value <= 100.0:
            raise ValueError(
                f"logit_bias values must be numbers in [-100, 100], got {value!r} for {token}"
            )
    return tuple(sorted((token, float(value)) for token, value in out.items()))


@dataclass(frozen=True)
class SpecConfig:
    """How speculation runs. ``k`` is the number of drafted tokens per round (the paper's
    gamma, vLLM's num_speculative_tokens); ``k == 0`` is plain autoregressive decoding.
    ``k == "auto"`` lets ``controller.AdaptiveK`` choose it each round, up to ``max_k``,
    from the acceptance and costs it measures.

    ``verification`` (sampling only; greedy has one kind): ``"rejection"`` is the paper's
    Algorithm 1, the highest acceptance; ``"coupled"`` keys every position's randomness to
    (seed, position) and accepts a draft when it equals the target's own keyed sample, so
    the output equals plain decoding with the same seed whatever k and the drafter do (the
    drafter-invariant coupling of Daliri, Musco and Suresh, 2024), at an acceptance of at
    least (1 - d) / (1 + d) against Algorithm 1's 1 - d (d: total variation distance between
    draft and target). ``"auto"``: coupled when the request has a seed, rejection otherwise.
    Both are exact: every output follows the target's distribution.

    ``forced_drafts`` (requests with a ``constraint``, k != 0): where the grammar allows one
    token only (JSON punctuation, a schema's keys), propose those tokens at no draft cost as
    a round's first drafts, the drafter's after them in the same round.

    ``tree`` (a draft model's rounds, alone or in a fallback chain, on the int4 and int8
    runtimes): ``"off"`` verifies
    the drafter's chain; ``"auto"`` adds the draft's second choice as a leaf beside a chain
    node where the measured cost of one more verify row buys more tokens than it costs
    (``tree.choose_siblings``; at a fixed k the costs are measured as k auto measures them);
    ``"full"`` adds one at every depth; ``"deep"`` grows the draft's likeliest candidates
    at every depth, a draft pass a depth over the likeliest open nodes, and verifies as many
    of the likeliest nodes as the measured cost of rows pays for (EAGLE-2's dynamic tree;
    greedy and coupled sampling, on a draft of those runtimes; otherwise as ``"auto"``).
    The target scores the tree in one pass and verification stays exact
    (``verify_tree``)."""

    k: int | str = 4
    max_k: int = 8
    verification: str = "auto"
    forced_drafts: bool = True
    tree: str = "off"

    def __post_init__(self) -> None:
        if self.k == "auto":
            pass
        elif isinstance(self.k, bool) or not isinstance(self.k, int):
            raise ValueError(f"k must be an integer >= 0 or 'auto', got {self.k!r}")
        elif self.k < 0:
            raise ValueError(f"k must be >= 0 (0 disables speculation), got {self.k}")
        if isinstance(self.max_k, bool) or not isinstance(self.max_k, int) or self.max_k < 1:
            raise ValueError(f"max_k must be an integer >= 1, got {self.max_k!r}")
        if self.tree not in TREES:
            raise ValueError(f"tree must be one of {', '.join(TREES)}, got {self.tree!r}")
        if self.verification not in VERIFICATIONS:
            raise ValueError(
                f"verification must be one of {', '.join(VERIFICATIONS)}, got {self.verification!r}"
            )

    @property
    def adaptive(self) -> bool:
        return self.k == "auto"

    def coupled(self, params: SamplingParams) -> bool:
        """Whether this request samples with position-keyed (coupled) randomness."""
        if params.greedy:
            return False
        if self.verification == "auto":
            return params.seed is not None
        return self.verification == "coupled"
