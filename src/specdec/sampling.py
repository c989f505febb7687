"""Pure functions from logits to probabilities, and sampling with an explicit generator.

The same ``logits_to_probs`` is applied to the draft and the target logits: exactness
needs ``draft_probs`` to be exactly the distribution the draft token was sampled from,
and ``target_probs`` to be the distribution plain decoding would sample from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from specdec.config import SamplingParams


def argmax_rows(logits: torch.Tensor) -> list[int]:
    """Each row's argmax  # [vocab] or [n, vocab] -> n ints: the first of equal maxima, a NaN
    counted the largest, as ``torch.argmax``. numpy's on CPU float rows: on the family 26
    EPYC torch took 79 us for one row of the 151,936-token vocabulary and numpy 7 (9 rows:
    394 and 54), a draft token's or a verify pass's worth of time each round."""
    rows = logits.reshape(-1, logits.shape[-1])
    if rows.device.type == "cpu" and rows.dtype in (torch.float32, torch.float64):
        return np.argmax(rows.detach().numpy(), axis=-1).tolist()
    return rows.argmax(dim=-1).tolist()


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p (the order transformers uses).

    logits  # [n, vocab] -> probs [n, vocab] float32, rows sum to 1.
    Greedy parameters give one-hot rows on the argmax.
    """
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).float()
    # Shift so the largest logit is 0 before dividing: a tiny temperature then sends the
    # others to -inf (softmax gives the argmax, ties shared) instead of overflowing to NaN.
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / params.temperature
    if 0 < params.top_k < logits.shape[-1]:
        kth_largest = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        probs = _top_p_filter(probs, params.top_p)
    return probs


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches ``top_p``."""
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    # A token stays while the mass before it is still short of top_p; the first always stays.
    keep_sorted = mass_before < top_p
    keep_sorted[..., 0] = True
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    probs = probs * keep
    return probs / probs.sum(dim=-1, keepdim=True)


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token id from a single distribution  # [vocab], by its inverse distribution
    function: one float64 uniform against the cumulative sums in float64. Each token's
    chance is its probability to within half a unit in the last place of its cumulative sum
    (about 1e-16), as fine as the uniform itself.

    Not ``torch.multinomial``: for one sample it runs the exponential race over the whole
    row, a float32 exponential drawn for every token, over a third of a draft step's time
    at Qwen's 151,936 tokens; this costs a fraction of that
    (bench/results/2026-12-04-sampling-cost-epyc-avx512)."""
    cumulative = probs.double().cumsum(0)
    total = cumulative[-1]
    point = torch.rand(1, dtype=torch.float64, generator=generator) * total
    index = int(torch.searchsorted(cumulative, point, right=True))
    if index >= probs.shape[0]:  # u * total rounded up to the total: the last token with mass
        index = int(torch.nonzero(probs > 0)[-1])
    return index


def make_generator(seed: int | None) -> torch.Generator:
    """The request's own random stream; library code never touches the global RNG.

    Every bit of a 64-bit seed counts: torch's ``manual_seed`` keeps only the low 32 bits of
    the Mersenne Twister's seed (``s`` and ``s + 2**32`` would give one stream), so the
    generator's 624-word state is filled from numpy's ``MT19937`` seeded with the whole
    seed (its SeedSequence hashes every bit). ``initial_seed()`` still reports the seed.
    """
    generator = torch.Generator()
    if seed is None:
        generator.seed()
    else:
        _seed_all_bits(generator, seed & _MASK64)
    return generator


_MASK64 = (1 << 64) - 1
# torch 2.13's CPU generator state (CPUGeneratorImplState): a uint64 initial seed, int
# left, int seeded, uint64 next, 624 uint64 words of the twister's state, then the cached
# normal samples. The layout is checked against a state torch wrote itself.
_STATE_BYTES = 5056
_WORDS_AT = 24
_TWISTER_WORDS = 624


def _seed_all_bits(generator: torch.Generator, seed: int) -> None:
    generator.manual_seed(seed)  # left = 1: the first draw twists the state set below
    state = generator.get_state().numpy().copy()
    assert state.size == _STATE_BYTES, "torch's CPU generator state changed its layout"
    assert int(state[:8].view(np.uint64)[0]) == seed, "torch's generator state changed"
    words = np.random.MT19937(seed).state["state"]["key"].astype(np.uint64)
    end = _WORDS_AT + 8 * _TWISTER_WORDS
    state[_WORDS_AT:end] = words.view(np.uint8)
    generator.set_state(torch.from_numpy(state))


# Uniforms in (0, 1), never 0 or 1: 52 random bits plus a half, times 2**-52, is exact in
# float64 and lies in [2**-53, 1 - 2**-53], so the race's noise -log1p(-u) is positive and
# finite (a zero noise would let a zero-probability token win: 0 / 0).
_HALF_ULP = 0.5
_UNIFORM_SCALE = 2.0**-52


class PositionNoise:
    """Exponential(1) noise for one sequence position, a function of (seed, position) only.

    ``argmax(probs / noise)`` is a sample from ``probs`` (the exponential race, i.e. the
    Gumbel-max trick): with the noise fixed per position, the token at a position depends on
    nothing but that position's distribution, so drafting decisions cannot change it.

    Counter-based (Philox4x64-10, Salmon et al. 2011, as numpy implements it): the key is the
    whole 64-bit seed and the counter's second word the position, so distinct (seed,
    position) pairs draw from disjoint counters and no two positions can share noise.

    The row's uniforms are drawn whole (they are cheap); a token's noise, ``-log1p(-u)``,
    only where a race needs it (``race_winner``): the logarithm of every one of 151,936
    uniforms cost more than a draft step's sampling should.
    """

    def __init__(self, seed: int, position: int, vocab: int):
        assert position >= 0, "positions count from 0"
        key = np.random.Philox(key=seed & _MASK64, counter=[0, position, 0, 0])
        bits = key.random_raw(vocab)
        self.uniform = ((bits >> np.uint64(12)).astype(np.float64) + _HALF_ULP) * _UNIFORM_SCALE

    @property
    def vocab(self) -> int:
        return int(self.uniform.shape[0])

    def at(self, index: np.ndarray) -> np.ndarray:
        """The noise of tokens ``index``: the same numbers as the whole row's there."""
        return -np.log1p(-self.uniform[index])

    def row(self) -> torch.Tensor:
        """The whole row  # [vocab] float64, every entry in (0, 37)."""
        return torch.from_numpy(self.at(np.arange(self.vocab)))


def position_noise(seed: int, position: int, vocab: int) -> torch.Tensor:
    """``PositionNoise``'s whole row  # [vocab] float64."""
    return PositionNoise(seed, position, vocab).row()


def race(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """The exponential race's winners.  probs  # [..., vocab], noise  # [..., vocab] -> [...]"""
    return race_scores(probs, noise).argmax(dim=-1)


def race_scores(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """``probs / noise``, the race's scores; their argmax is a sample from ``probs``.

    A token with zero probability never wins, whatever the noise: its score is -inf (a
    positive probability over positive, finite noise scores above 0). [..., vocab] float64
    """
    scores = probs.double() / noise
    return scores.masked_fill(probs <= 0, float("-inf"))


# Slack on the winner's bound, far above the rounding of the products compared (a few 1e-16).
_BOUND_SLACK = 1.0 - 1e-9


def race_winner(probs: torch.Tensor, noise: PositionNoise) -> int:
    """``race(probs, noise.row())``, the same token, with the noise of a few tokens only.

    A token's score is p / E with E = -log1p(-u) >= u, so at most p / u. The likeliest
    token's score s is a bound the winner reaches; a token can reach s only if p >= s * u (a
    multiply and a compare over the row, no logarithm). Among those candidates, in token
    order, the scores are computed exactly as ``race_scores`` does, and their first maximum
    is the whole row's: every other token scores below s. probs  # [vocab]"""
    p = probs.double().numpy()
    leader = int(np.argmax(p))
    if not p[leader] > 0:  # no positive probability (NaNs): as the whole row's race does
        return int(race(probs, noise.row()))
    bound = float(p[leader] / noise.at(np.array([leader]))[0])
    candidates = np.flatnonzero(p >= (bound * _BOUND_SLACK) * noise.uniform)
    scores = p[candidates] / noise.at(candidates)
    return int(candidates[int(np.argmax(scores))])


class Sampler:
    """Sampling parameters bound to one request's randomness, handed to drafters.

    Two kinds of randomness. ``coupled=False``: one generator whose draws follow one another
    (Algorithm 1's uniforms and samples). ``coupled=True``: the token at sequence position p
    is the exponential race of its distribution against ``position_noise(seed, p)``, for the
    drafter and the target alike; verification accepts a draft when it equals the target's
    own race winner (``verify.verify_coupled``). The output is then exactly what plain
    decoding with the same seed gives, whatever k and the drafter do.
    """

    def __init__(
        self,
        params: SamplingParams,
        generator: torch.Generator | None = None,
        coupled: bool = False,
    ):
        self.params = params
        # A request's grammar while its drafter drafts (``grammar.DraftMask``): the rows
        # ``pick`` draws drafts from are masked by it.
        self.draft_mask: DraftMask | None = None
        # A request's logit bias and penalties while its drafter drafts
        # (``adjustments.DraftRows``): the rows ``pick`` draws drafts from are changed alike.
        self.draft_rows: DraftRows | None = None
        self.generator = generator if generator is not None else make_generator(params.seed)
        self.coupled = coupled and not params.greedy
        # A coupled request without a seed still needs one key for all its positions.
        self.seed = params.seed if params.seed is not None else self.generator.initial_seed()
        # Noise by position: the drafter races at a position and the verifier right after;
        # it is a pure function of (seed, position).
        self._noise: dict[int, PositionNoise] = {}

    @property
    def greedy(self) -> bool:
        return self.params.greedy

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return logits_to_probs(logits, self.params)

    def race(self, probs: torch.Tensor, position: int) -> int:
        """The keyed sample of ``probs``  # [vocab] at sequence ``position``: the
        exponential race against that position's noise (``race_winner``)."""
        return race_winner(probs, self.noise_at(position, probs.shape[-1]))

    def keyed_samples(self, logits: torch.Tensor, positions: Sequence[int]) -> KeyedSamples:
        """The keyed sample of each row of ``logits``  # [rows, vocab] at its position,
        each drawn when first read (``KeyedSamples``)."""
        return KeyedSamples(self, logits, positions)

    def settle(self, position: int) -> None:
        """Positions before ``position`` are settled: their noise is dropped."""
        for settled in [p for p in self._noise if p < position]:
            del self._noise[settled]

    def noise_at(self, position: int, vocab: int) -> PositionNoise:
        """The noise of one sequence position (kept for the verifier)."""
        noise = self._noise.get(position)
        if noise is None or noise.vocab != vocab:
            noise = self._noise[position] = PositionNoise(self.seed, position, vocab)
        return noise

    def pick(
        self, logits: torch.Tensor, position: int | None = None
    ) -> tuple[int, torch.Tensor | None]:
        """A token for sequence ``position`` from one row of logits, and the distribution it
        came from (None when greedy, where the choice is a point mass on the argmax).
        logits  # [vocab]. Coupled sampling needs the position. With a ``draft_mask``, the
        row is restricted to what it allows there (unless that leaves no finite logit), and
        the distribution returned is the restricted one the token was drawn from; with
        ``draft_rows``, the row is first changed by the request's bias and penalties."""
        mask = None
        if self.draft_rows is not None and position is not None:
            logits = self.draft_rows.row(position, logits)
        if self.draft_mask is not None and position is not None:
            mask = self.draft_mask.allowed(position)
        if mask is not None:
            masked = logits.float().masked_fill(~mask, float("-inf"))
            logits = masked if bool(torch.isfinite(masked).any()) else logits
        token_id, probs = self._pick(logits, position)
        if self.draft_mask is not None and position is not None:
            self.draft_mask.picked(position, token_id)
        if self.draft_rows is not None and position is not None:
            self.draft_rows.picked(position, token_id)
        return token_id, probs

    def _pick(self, logits: torch.Tensor, position: int | None) -> tuple[int, torch.Tensor | None]:
        if self.greedy:
            return argmax_rows(logits)[0], None
        probs = self.probs(logits.unsqueeze(0))[0]
        if self.coupled:
            assert position is not None, "coupled sampling is keyed by the sequence position"
            return self.race(probs, position), probs
        return sample(probs, self.generator), probs


class DraftMask(Protocol):
    """What a grammar allows a draft at each sequence position (``grammar.Grammar.drafts``)."""

    def allowed(self, position: int) -> torch.Tensor | None:
        """[vocab] bool, or None where it cannot say (the drafts before it not followed)."""
        ...

    def picked(self, position: int, token_id: int) -> None:
        """The draft drawn at ``position``: followed, so that the next one is masked."""
        ...

    def forced(self, position: int) -> list[int]:
        """The tokens it allows alone from ``position`` on (a drafter's free guesses)."""
        ...


class DraftRows(Protocol):
    """A request's changes to its logits (bias, penalties) on the rows its drafter draws
    from (``adjustments.DraftRows``)."""

    def row(self, position: int, logits: torch.Tensor) -> torch.Tensor:
        """The row  # [vocab] at sequence ``position``, changed."""
        ...

    def picked(self, position: int, token_id: int) -> None:
        """The draft drawn at ``position``: the next rows follow it."""
        ...


class KeyedSamples(Sequence[int]):
    """The target's keyed samples of a verify pass, one per scored row, each row's
    distribution formed and raced only when the verifier first reads it: it reads rows down
    the accepted path and stops at the first draft that differs, so a round rejected early
    costs the rows up to it, not all of them. Row i's sample is ``sampler.race`` of
    ``logits_to_probs`` of row i alone, at ``positions[i]``: the distribution plain decoding
    forms of one row, the same race."""

    def __init__(self, sampler: Sampler, logits: torch.Tensor, positions: Sequence[int]):
        assert logits.shape[0] == len(positions), "one position per row"
        self._sampler = sampler
        self._logits = logits
        self._positions = list(positions)
        self._drawn: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._positions)

    def __getitem__(self, row):
        if isinstance(row, slice):
            return [self[i] for i in range(*row.indices(len(self)))]
        if not -len(self) <= row < len(self):
            raise IndexError(row)
        row %= len(self)
        if row not in self._drawn:
            probs = self._sampler.probs(self._logits[row : row + 1])[0]
            self._drawn[row] = self._sampler.race(probs, self._positions[row])
        return self._drawn[row]

    @property
    def drawn(self) -> int:
        """How many rows have been raced so far."""
        return len(self._drawn)
