"""Exactness of tree verification: hand-built trees, and every emitted position counted
against the target with stated power, the field's tree bugs injected as mutants.

The statistical tree: the root has three children drawn without replacement from the
draft's first distribution (a chain node c1 and two siblings); c1 has two children drawn
without replacement from the draft's second (c2 and a sibling). Per-depth distributions are
fixed tables (context-free), as in ``test_verify_statistical``: the target's P0, P1, P2 and
the draft's Q0, Q1. The tokens emitted at positions 0, 1, 2 must follow P0, P1, P2.

``tree_emitted`` is the closed form of what a verifier emits (every ordered draw of the
siblings enumerated, the recursive rejection worked out per draw), written apart from the
code; ``test_the_closed_form_is_the_theorem`` checks it gives the target for the correct
scheme. MUTANTS, each run through the real ``verify_tree_stochastic``:

- ``siblings drawn with replacement, verified as without``: each sibling drawn from the
  parent's whole Q, its row handed over as Q without the earlier siblings, renormalised;
- ``top-k drafts verified as sampled``: the draft's top-3 / top-2 tokens (deterministic),
  verified with Q's rows as if drawn from them;
- ``residual not renormalised``: after a rejected sibling the next is tried against
  max(0, p - q) without renormalising (injected into the verifier's ``_residual``);
- ``top-k drafts as q = 1, not renormalised``: deterministic drafts verified as point masses,
  each sibling accepted with the target's p(x) left after the rejected ones were zeroed but
  not renormalised (injected into ``_without``);
- ``a sampled leaf kept only when its own token is likely``: which siblings are verified
  decided by their own drawn tokens (the model drafter decides from the runner-up's
  probability instead, ``drafters.model.runner_up``: the same whichever token is drawn).

Not a mutant: sampled drafts verified as point masses (accept x with p(x), else drop x and
renormalise) are exact whatever chose them, as the top-k drafts are (the walk is then a
sample of p matched against the children); only their acceptance is lower.

Power: with DRAWS rounds, position i reached n_i = DRAWS x P(reach i) times, a noncentral
chi-square (``test_verify_statistical.rejection_power``) gives each mutant's probability of
being caught at its best position; ``test_the_sample_size_has_the_stated_power`` requires
>= 0.99, ``test_each_mutant_is_caught`` requires the check to fail.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from helpers import assert_same_distribution
from specdec import verify_tree
from specdec.config import SamplingParams
from specdec.sampling import logits_to_probs, position_noise, race
from specdec.verify_tree import verify_tree_coupled, verify_tree_greedy, verify_tree_stochastic
from test_verify_statistical import rejection_power

VOCAB, DRAWS, POWER = 6, 12_000, 0.99
PARENTS = [-1, -1, -1, 0, 0]  # c1, s1, s2 under the root; c2, s3 under c1
ROOT_CHILDREN, C1_CHILDREN = 3, 2
ROW_DEPTH = [0, 1, 1, 1, 2, 2]  # rows: root, c1, s1, s2, c2, s3

SETTINGS = {
    "temperature 1": SamplingParams(temperature=1.0),
    "temperature 0.8, top-k 4": SamplingParams(temperature=0.8, top_k=4),
    "top-p 0.8": SamplingParams(temperature=1.0, top_p=0.8),
}


def tables(params: SamplingParams, seed: int = 5):
    generator = torch.Generator().manual_seed(seed)
    target_logits = torch.randn(3, VOCAB, generator=generator) * 1.2
    draft_logits = target_logits[:2] + 0.6 * torch.randn(2, VOCAB, generator=generator)
    return logits_to_probs(target_logits, params).double(), logits_to_probs(
        draft_logits, params
    ).double()


def without(q: torch.Tensor, tokens) -> torch.Tensor:
    """q with ``tokens`` removed, renormalised (zeros if nothing is left)."""
    rest = q.clone()
    rest[list(tokens)] = 0.0
    mass = float(rest.sum())
    return rest / mass if mass > 0 else rest


# ---- drawing trees: the correct scheme and the mutants' ---------------------------------


def draw_children(q, count, generator, replacement=False):
    """``count`` tokens from q, each without the earlier ones (or from q itself), and the
    rows a correct verifier is handed: q without the earlier tokens, renormalised."""
    tokens, rows = [], []
    for _ in range(count):
        row = without(q, tokens)
        source = q if replacement else row
        if float(source.sum()) <= 0:
            break
        tokens.append(int(torch.multinomial(source.float(), 1, generator=generator)))
        rows.append(row)
    return tokens, rows


def top_children(q, count):
    order = torch.argsort(q, descending=True).tolist()
    tokens = [t for t in order[:count] if q[t] > 0]
    return tokens, [without(q, tokens[:i]) for i in range(len(tokens))]


def draw_tree(scheme, P, Q, generator):
    """token_ids, parents, draft_probs (or None) of one drawn tree."""
    replacement = scheme == "siblings drawn with replacement, verified as without"
    if scheme in ("top-k point masses", "top-k drafts verified as sampled"):
        root, root_rows = top_children(Q[0], ROOT_CHILDREN)
        under, under_rows = top_children(Q[1], C1_CHILDREN)
    else:
        root, root_rows = draw_children(Q[0], ROOT_CHILDREN, generator, replacement)
        under, under_rows = draw_children(Q[1], C1_CHILDREN, generator, replacement)
    if scheme == LIKELY_ONLY:
        root, root_rows = likely_only(root, root_rows)
        under, under_rows = likely_only(under, under_rows)
    tokens = root + under
    parents = [-1] * len(root) + [0] * len(under)
    probs = torch.stack(root_rows + under_rows)
    if scheme in ("top-k drafts verified as sampled", "top-k point masses"):
        probs = Q[0].expand(len(root), -1).tolist() + Q[1].expand(len(under), -1).tolist()
        probs = None if scheme == "top-k point masses" else torch.tensor(probs).double()
    if scheme == "sampled, as point masses":
        probs = None
    return tokens, parents, probs


LIKELY_ONLY = "a sampled leaf kept only when its own token is likely"
LIKELY = 0.3


def likely_only(tokens, rows):
    """The mutant's choice of leaves: the first child always, a sibling only when its own
    token had probability >= LIKELY (so a kept sibling is no draw from its row)."""
    kept = [i for i in range(len(tokens)) if i == 0 or float(rows[i][tokens[i]]) >= LIKELY]
    return [tokens[i] for i in kept], [rows[i] for i in kept]


def target_rows(P, parents):
    depth = [0] + [1 if parent < 0 else 2 for parent in parents]
    return torch.stack([P[d] for d in depth])


def emitted_counts(scheme, P, Q, seed):
    generator = torch.Generator().manual_seed(seed)
    counts = np.zeros((3, VOCAB))
    for _ in range(DRAWS):
        tokens, parents, probs = draw_tree(scheme, P, Q, generator)
        result = verify_tree_stochastic(tokens, parents, probs, target_rows(P, parents), generator)
        for position, token_id in enumerate(result.token_ids):
            counts[position, token_id] += 1
    return counts


def assert_every_position_follows(counts, P):
    for position in range(3):
        assert counts[position].sum() > 100, f"position {position} is seldom reached"
        assert_same_distribution(counts[position], P[position].numpy())


# ---- the closed form, apart from the code ------------------------------------------------


def stage_outcomes(p, tokens, rows, renormalise=True):
    """P(child i accepted) for each child and the distribution of the token sampled when none
    is: recursive rejection, each child against its row (a point mass where rows is None)."""
    p = p / p.sum()
    accepted, left = [], 1.0
    for i, x in enumerate(tokens):
        q = None if rows is None else rows[i]
        if q is None:
            a = min(1.0, float(p[x]))
            rest = p.clone()
            rest[x] = 0.0
            nxt = rest / rest.sum() if renormalise and rest.sum() > 0 else rest
        else:
            a = min(1.0, float(p[x] / q[x])) if q[x] > 0 else float(p[x] > 0)
            rest = torch.clamp(p - q, min=0.0)
            nxt = rest / rest.sum() if renormalise and rest.sum() > 1e-6 else rest
            if rest.sum() <= 1e-6:
                nxt = p
        accepted.append(left * a)
        left *= 1.0 - a
        p = nxt
    final = p / p.sum() if p.sum() > 0 else p
    return accepted, left * final


def enumerate_children(scheme, q, count):
    """(probability, tokens, rows handed to the verifier) of every draw of ``count`` children."""
    if scheme in ("top-k point masses", "top-k drafts verified as sampled"):
        tokens, rows = top_children(q, count)
        handed = None if scheme == "top-k point masses" else [q] * len(tokens)
        return [(1.0, tokens, handed)]
    out = []
    count = min(count, int((q > 0).sum()))
    replacement = scheme == "siblings drawn with replacement, verified as without"
    for tokens in itertools.product(range(VOCAB), repeat=count):
        probability, rows = 1.0, []
        for i, x in enumerate(tokens):
            row = without(q, tokens[:i])
            probability *= float((q if replacement else row)[x])
            rows.append(row)
        if probability > 0:
            handed = None if scheme == "sampled, as point masses" else rows
            kept = list(tokens)
            if scheme == LIKELY_ONLY:
                kept, handed = likely_only(kept, rows)
            out.append((probability, kept, handed))
    return out


def tree_emitted(scheme, P, Q):
    """Closed form: the distribution emitted at positions 0, 1, 2 and P(reach) of each."""
    renormalise = scheme not in INJECTED
    scheme = INJECTED[scheme][2] if scheme in INJECTED else scheme
    pos = [np.zeros(VOCAB) for _ in range(3)]
    reach = [1.0, 0.0, 0.0]
    # c1's row: the token emitted there and P(a child of c1 accepted)
    under_emitted, under_accepted = np.zeros(VOCAB), 0.0
    for probability, tokens, rows in enumerate_children(scheme, Q[1], C1_CHILDREN):
        accepted, rest = stage_outcomes(P[1], tokens, rows, renormalise)
        for a, x in zip(accepted, tokens, strict=True):
            under_emitted[x] += probability * a
        under_emitted += probability * rest.numpy()
        under_accepted += probability * sum(accepted)
    for probability, tokens, rows in enumerate_children(scheme, Q[0], ROOT_CHILDREN):
        accepted, rest = stage_outcomes(P[0], tokens, rows, renormalise)
        pos[0] += probability * rest.numpy()
        for i, (a, x) in enumerate(zip(accepted, tokens, strict=True)):
            pos[0][x] += probability * a
            reach[1] += probability * a
            if i == 0:  # c1: its own children are tried next
                pos[1] += probability * a * under_emitted
                reach[2] += probability * a * under_accepted
            else:  # a sibling is a leaf: the bonus from its row
                pos[1] += probability * a * P[1].numpy()
    pos[1] /= reach[1]
    pos[2] = P[2].numpy()
    return pos, reach


MUTANTS = {
    "siblings drawn with replacement, verified as without": "temperature 1",
    "top-k drafts verified as sampled": "temperature 1",
    "residual not renormalised": "temperature 1",
    "top-k drafts as q = 1, not renormalised": "temperature 1",
    LIKELY_ONLY: "temperature 1",
}


def unnormalised_residual(p, q):
    residual = torch.clamp(p - q, min=0.0)
    return residual if float(residual.sum()) > 1e-6 else None


INJECTED = {  # the verifier's helper each mutant replaces, and the scheme it draws with
    "residual not renormalised": ("_residual", unnormalised_residual, "correct"),
    "top-k drafts as q = 1, not renormalised": (
        "_without",
        lambda p, x: p.index_fill(0, torch.tensor([x]), 0.0),
        "top-k point masses",
    ),
}


@pytest.mark.parametrize("scheme", ["correct", "top-k point masses", "sampled, as point masses"])
@pytest.mark.parametrize("name", list(SETTINGS))
def test_the_closed_form_is_the_theorem(name, scheme):
    P, Q = tables(SETTINGS[name])
    pos, reach = tree_emitted(scheme, P, Q)
    for position in range(3):
        np.testing.assert_allclose(pos[position], P[position].numpy(), atol=1e-9)
    assert reach[2] > 0.1, "the deepest position must be reached often"


@pytest.mark.parametrize("scheme", ["correct", "top-k point masses", "sampled, as point masses"])
@pytest.mark.parametrize("name", list(SETTINGS))
def test_every_emitted_position_follows_the_target(name, scheme):
    P, Q = tables(SETTINGS[name])
    assert_every_position_follows(emitted_counts(scheme, P, Q, seed=11), P)


@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_the_sample_size_has_the_stated_power(mutant):
    P, Q = tables(SETTINGS[MUTANTS[mutant]])
    pos, reach = tree_emitted(mutant, P, Q)
    target = P.numpy()
    power = max(rejection_power(target[i], pos[i], DRAWS * reach[i]) for i in range(3))
    assert power >= POWER, f"{mutant}: power {power:.3f} < {POWER} with {DRAWS} draws"


@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_each_mutant_is_caught(mutant, monkeypatch):
    """The bug runs through the real verifier; the same check must fail."""
    P, Q = tables(SETTINGS[MUTANTS[mutant]])
    scheme = mutant
    if mutant in INJECTED:
        helper, buggy, scheme = INJECTED[mutant]
        monkeypatch.setattr(verify_tree, helper, buggy)
    counts = emitted_counts(scheme, P, Q, seed=13)
    with pytest.raises(AssertionError, match="differs|impossible"):
        assert_every_position_follows(counts, P)


# ---- coupled: the target's keyed sample picks the child ------------------------------------


def test_coupled_tree_verification_emits_the_targets_own_keyed_samples():
    """Whatever the tree, each emitted token is the target's race winner at its position,
    as plain decoding with the same seed would give; and the counts follow the target."""
    P, Q = tables(SETTINGS["temperature 1"])
    counts = np.zeros((3, VOCAB))
    for seed in range(3_000):
        noise = torch.stack([position_noise(seed, i, VOCAB) for i in range(3)])
        plain = race(P, noise).tolist()
        generator = torch.Generator().manual_seed(seed)
        tokens, parents, _ = draw_tree("correct", P, Q, generator)
        rows = target_rows(P, parents)
        row_noise = noise[[0] + [1 if parent < 0 else 2 for parent in parents]]
        result = verify_tree_coupled(tokens, parents, race(rows, row_noise).tolist())
        assert result.token_ids == plain[: len(result.token_ids)]
        for position, token_id in enumerate(result.token_ids):
            counts[position, token_id] += 1
    for position in range(2):
        assert_same_distribution(counts[position], P[position].numpy())


# ---- hand-built trees --------------------------------------------------------------------


def one_hot_logits(winners):
    logits = torch.zeros(len(winners), VOCAB)
    for row, token in enumerate(winners):
        logits[row, token] = 5.0
    return logits


def test_greedy_descends_into_the_sibling_the_target_picks():
    # root's children: nodes 0 (token 1), 1 (token 2); node 0 has child 2 (token 3); node 1
    # has child 3 (token 4), which has child 4 (token 5)
    tokens, parents = [1, 2, 3, 4, 5], [-1, -1, 0, 1, 3]
    # the target picks 2 at the root, 4 after it, then 0 (not node 4's token 5)
    result = verify_tree_greedy(tokens, parents, one_hot_logits([2, 0, 4, 0, 0, 0]))
    assert (result.token_ids, result.num_accepted, result.bonus, result.path) == (
        [2, 4, 0],
        2,
        False,
        (1, 3),
    )


def test_greedy_takes_the_bonus_at_an_accepted_leaf():
    tokens, parents = [1, 2, 3], [-1, -1, 0]
    result = verify_tree_greedy(tokens, parents, one_hot_logits([2, 0, 5, 0]))
    assert (result.token_ids, result.bonus, result.path) == ([2, 5], True, (1,))


def test_greedy_rejects_every_child():
    result = verify_tree_greedy([1, 2], [-1, -1], one_hot_logits([3, 0, 0]))
    assert (result.token_ids, result.num_accepted, result.bonus, result.path) == ([3], 0, False, ())


def test_a_chain_tree_verifies_as_the_chain():
    from specdec.verify import verify_greedy

    logits = torch.randn(5, VOCAB, generator=torch.Generator().manual_seed(0))
    drafts = logits.argmax(-1)[:4].tolist()
    drafts[2] = (drafts[2] + 1) % VOCAB
    chain = verify_greedy(torch.tensor(drafts), logits)
    tree = verify_tree_greedy(drafts, [-1, 0, 1, 2], logits)
    assert (tree.token_ids, tree.num_accepted, tree.bonus) == (
        chain.token_ids,
        chain.num_accepted,
        chain.bonus,
    )


def test_a_forbidden_first_child_hands_the_round_to_its_sibling():
    """Point masses: the target gives the first child 0, all of its mass to the second: the
    first is always rejected, the second always accepted, then the bonus from its row."""
    target = torch.tensor(
        [[0.0, 0.0, 1.0, 0, 0, 0], [1.0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 1.0, 0]]
    ).double()
    for seed in range(20):
        result = verify_tree_stochastic(
            [1, 2], [-1, -1], None, target, torch.Generator().manual_seed(seed)
        )
        assert (result.token_ids, result.path, result.bonus) == ([2, 4], (1,), True)


def test_a_rejected_sampled_child_leaves_the_renormalised_residual():
    """p = (0.5, 0.3, 0.2), the first child a from q = (0.8, 0.1, 0.1): accepted 5/8 of the
    time; rejected, the residual (0, 0.2, 0.1) / 0.3 is what the second child, b drawn from q
    without a = (0, 0.5, 0.5), is tried against: accepted with min(1, (2/3) / 0.5) = 1. So
    the round emits a 62.5% and b 37.5% of the time, never c."""
    p = torch.tensor([[0.5, 0.3, 0.2, 0, 0, 0]] + [[1 / 6] * 6] * 2).double()
    q = torch.tensor([[0.8, 0.1, 0.1, 0, 0, 0], [0.0, 0.5, 0.5, 0, 0, 0]]).double()
    generator = torch.Generator().manual_seed(3)
    firsts = [
        verify_tree_stochastic([0, 1], [-1, -1], q, p, generator).token_ids[0] for _ in range(4_000)
    ]
    counts = np.bincount(firsts, minlength=VOCAB)
    assert counts[2:].sum() == 0
    assert_same_distribution(counts[:2], np.array([0.625, 0.375]))
