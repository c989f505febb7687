"""Draft trees: their shape, as pure functions over parent lists.

A tree proposal (``drafters.base.Proposal.parents``) holds n draft nodes: node i is
``token_ids[i]`` hung under node ``parents[i]`` (-1: the root, the last context token), a
parent always before its children. Siblings are tried in node order. The target scores n + 1
rows in one pass (``ModelSequence.forward_tree``): row 0 is the root, row i + 1 node i, each
at the position of its depth and attending to its own path only. A chain is the tree
``[-1, 0, 1, ..., k - 2]``.

The trees the model drafter grows (``drafters.model``) are either deep (``SpecConfig.tree =
"deep"``: EAGLE-2's expansion, a draft pass a depth over the likeliest open nodes, then the
likeliest nodes overall verified, as many as the measured cost of rows pays for:
``likeliest_first``, ``chain_first``) or its chain with the draft's second choice as a leaf
beside some chain nodes: where the chain's token is rejected and the target
picks that second choice, the round gains one token (the leaf and the target's token after
it) for one more verify row. ``choose_siblings`` decides where, from the draft's confidences
and the measured cost of a pass of each size: a leaf is added while the expected token rate
of the round rises (EAGLE-2's confidence-shaped expansion, with Sequoia's measured cost of
rows instead of a fixed budget).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import accumulate


def chain(k: int) -> list[int]:
    """The parents of a chain of k drafts."""
    return list(range(-1, k - 1))


def check(parents: Sequence[int]) -> None:
    """A tree's parents: each -1 or an earlier node."""
    for i, parent in enumerate(parents):
        if not -1 <= parent < i:
            raise ValueError(f"node {i}: parent {parent} is not -1 or an earlier node")


def row_parents(parents: Sequence[int]) -> list[int]:
    """The parent row of each scored row: the root (row 0) hangs under the cached text (-1),
    node i (row i + 1) under row parents[i] + 1."""
    return [-1] + [parent + 1 for parent in parents]


def row_depths(row_parents_: Sequence[int]) -> list[int]:
    """Each row's depth below the first row's position (a root row is 0)."""
    depths: list[int] = []
    for parent in row_parents_:
        depths.append(0 if parent < 0 else depths[parent] + 1)
    return depths


def children(parents: Sequence[int]) -> list[list[int]]:
    """The nodes under each row, in node order: [0] is the root's, [i + 1] node i's."""
    out: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for node, parent in enumerate(parents):
        out[parent + 1].append(node)
    return out


def chain_length(parents: Sequence[int] | None, n: int) -> int:
    """How many leading nodes form one chain from the root (all n for a chain, None)."""
    if parents is None:
        return n
    length = 0
    while length < len(parents) and parents[length] == length - 1:
        length += 1
    return length


def path_rows(path: Sequence[int]) -> list[int]:
    """The scored rows of an accepted path of nodes: the root's, then each node's."""
    return [0] + [node + 1 for node in path]


def choose_siblings(
    acceptance: Sequence[float],  # the chain's: P(its node at each depth is accepted)
    sibling_acceptance: Sequence[float],  # P(the target picks the leaf) at each depth
    draft_seconds: float,  # the round's drafting so far
    pass_seconds: Callable[[int], float],  # a target pass of n rows
) -> list[int]:
    """The depths (0-based) at which a second-choice leaf pays: added best first while the
    round's expected tokens per second rise. A leaf at depth i is reached when the chain's
    first i nodes are accepted and pays one token when the chain's node there is rejected
    and the target picks the leaf.

    >>> flat = lambda n: 1.0  # rows cost nothing: every leaf with a chance pays
    >>> choose_siblings([0.5, 0.5], [0.3, 0.0], 0.0, flat)
    [0]
    >>> dear = lambda n: float(n)  # each row costs a pass: none does
    >>> choose_siblings([0.5, 0.5], [0.3, 0.3], 0.0, dear)
    []
    """
    k = len(acceptance)
    reach, gains, expected = 1.0, [], 1.0
    for depth in range(k):
        gains.append(reach * sibling_acceptance[depth])
        reach *= acceptance[depth]
        expected += reach
    rows = k + 1
    chosen: list[int] = []
    rate = expected / (draft_seconds + pass_seconds(rows))
    for depth in sorted(range(k), key=lambda d: -gains[d]):
        if gains[depth] <= 0:
            break
        longer = (expected + gains[depth]) / (draft_seconds + pass_seconds(rows + 1))
        if longer <= rate:
            break
        chosen.append(depth)
        expected, rows, rate = expected + gains[depth], rows + 1, longer
    return sorted(chosen)


def choose_copy(
    acceptance: Sequence[float],  # the chain's: P(its node at each depth is accepted)
    at: int,  # the depth where the guide's guesses part from the chain
    copy_acceptance: Sequence[float],  # P(guess i accepted | depth ``at`` reached, i - 1 were)
    rows: int,  # the tree's rows without the guesses
    draft_seconds: float,  # the round's drafting
    pass_seconds: Callable[[int], float],  # a target pass of n rows
) -> int:
    """How many of the guide's guesses to verify as a branch at depth ``at`` (0: none): the
    count whose round has the highest expected tokens per second, the fewest among equals.
    Guess i pays a token when the chain's first ``at`` nodes and the guesses before it are
    accepted; the chain's own tokens from depth ``at`` on and the branch exclude each other,
    so their expectations add.

    >>> flat = lambda n: 1.0  # rows cost nothing: every guess with a chance pays
    >>> choose_copy([0.5, 0.5], 1, [0.3, 0.9, 0.9], 3, 0.0, flat)
    3
    >>> dear = lambda n: float(n)  # each row costs a pass: none does
    >>> choose_copy([0.5, 0.5], 1, [0.3, 0.9], 3, 0.0, dear)
    0
    """
    reaches = [1.0, *accumulate(acceptance, lambda reach, a: reach * a)]  # [d]: depth d reached
    expected, branch = sum(reaches), reaches[min(at, len(acceptance))]
    best, best_rate = 0, expected / (draft_seconds + pass_seconds(rows))
    for count, a in enumerate(copy_acceptance, start=1):
        branch *= a
        expected += branch
        rate = expected / (draft_seconds + pass_seconds(rows + count))
        if rate > best_rate:
            best, best_rate = count, rate
    return best


def likeliest_first(values: Sequence[float], depths: Sequence[int], first: int = 0) -> list[int]:
    """Nodes by value (the product of the draft's confidences down their paths), likeliest
    first, the shallower first among equals, node ``first`` (the draft's own first pick)
    before all: every prefix of the order holds each of its nodes' ancestors, as a node's
    value is at most its parent's.

    >>> likeliest_first([0.9, 0.05, 0.5, 0.5], [0, 0, 1, 2])
    [0, 2, 3, 1]
    """
    others = (i for i in range(len(values)) if i != first)
    rest = sorted(others, key=lambda i: (-values[i], depths[i], i))
    return [first, *rest] if values else []


def chain_first(
    kept: Sequence[int],  # grown nodes verified, ancestors before descendants
    parents: Sequence[int],  # each grown node's parent (-1: the root)
    picks: dict[int, int],  # a grown node (-1: the root) -> its child that is the draft's pick
    depths: Sequence[int],
) -> tuple[list[int], int]:
    """The kept nodes in a proposal's node order: the chain of the draft's picks from the
    root first (what k policies learn from), then the others by depth. -> (order, the
    chain's length).

    >>> chain_first([0, 1, 2, 3], [-1, -1, 0, 0], {-1: 0, 0: 2}, [0, 0, 1, 1])
    ([0, 2, 1, 3], 2)
    """
    kept_set = set(kept)
    chain: list[int] = []
    node = picks.get(-1)
    while node is not None and node in kept_set:
        chain.append(node)
        node = picks.get(node)
    in_chain = set(chain)
    rest = sorted((i for i in kept if i not in in_chain), key=lambda i: depths[i])
    return chain + rest, len(chain)
