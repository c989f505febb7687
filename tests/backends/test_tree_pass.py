"""A draft tree scored in one pass: each row equals its path fed as a chain, bit for bit, and
keeping the accepted path leaves the cache a fresh pass would."""

import pytest
import torch

from helpers import tiny_llama
from specdec.backends.batched import BatchedModel
from specdec.backends.quant.convert import make_int4_batch_invariant, make_int8_batch_invariant
from specdec.backends.quant.kernels import kernel
from specdec.doctor import real_size_int8_model, real_size_model
from specdec.tree import children, path_rows, row_depths, row_parents

PREFIX = [5, 9, 2, 7, 7, 1, 30, 12, 20, 3, 8, 8, 19, 27, 4, 11, 6, 23, 21, 2]
# The root's three children (the first with a chain of 3 under it, the second with two
# children of its own), node order as the drafters make them: parents before children.
TOKENS = [14, 25, 22, 31, 9, 17, 3, 24, 28]
PARENTS = [-1, 0, 1, -1, 3, 3, 2, -1, 5]


def paths(parents):
    """Every node's path from the root, as node indices."""
    out = []
    for node, parent in enumerate(parents):
        out.append(([] if parent < 0 else out[parent]) + [node])
    return out


def assert_each_row_is_its_chain(batched, scored, root):
    """``scored[0]`` (the root's row) and ``scored[node + 1]`` (each node's) equal the rows of
    their paths fed as chains, bit for bit."""
    chain = batched.sequence()
    chain.forward(PREFIX)
    for node, path in enumerate(paths(PARENTS)):
        chain.truncate(len(PREFIX))
        rows = chain.forward([root] + [TOKENS[n] for n in path])
        assert torch.equal(scored[0], rows[0]), "the root's row"
        assert torch.equal(scored[node + 1], rows[-1]), f"node {node}'s row differs from its chain"


def assert_rows_are_their_chains(model, root=13):
    batched = BatchedModel(model)
    tree = batched.sequence()
    tree.forward(PREFIX)
    logits = tree.forward_tree([root] + TOKENS, row_parents(PARENTS))
    assert_each_row_is_its_chain(batched, logits, root)


def assert_grown_rows_are_their_chains(model, root=13):
    """The same tree grown a depth a pass, as a draft grows one (``drafters.model``): each
    pass scores the nodes of one depth under tree rows cached by the passes before it (the
    root's row and the first depth in the first pass)."""
    batched = BatchedModel(model)
    tree = batched.sequence()
    tree.forward(PREFIX)
    tree_parents = row_parents(PARENTS)
    depths = row_depths(tree_parents)
    order = sorted(range(len(tree_parents)), key=lambda r: depths[r])  # rows by depth
    at = {row: i for i, row in enumerate(order)}  # a row's place in the cache
    passes = [[r for r in order if depths[r] <= 1]]
    passes += [[r for r in order if depths[r] == d] for d in range(2, max(depths) + 1)]
    tokens = [root] + TOKENS
    scored: dict[int, torch.Tensor] = {}
    for rows in passes:
        cached = order[: len(scored) + len(rows)]  # the rows held, then this pass's
        parents = [-1 if tree_parents[r] < 0 else at[tree_parents[r]] for r in cached]
        logits = tree.forward_tree([tokens[r] for r in rows], parents)
        scored.update(zip(rows, logits, strict=True))
    assert_each_row_is_its_chain(batched, scored, root)


@pytest.mark.parametrize("count", [1, 2, 3, 4, 8])
def test_tree_rows_are_their_paths_as_chains_at_real_layer_sizes(count, threads):
    """The 1.5B's layer sizes (hidden 1536, 12 heads over 2 kv heads), int4 and int8, at
    1, 2, 3, 4 and 8 threads; scored in one pass and grown a depth a pass."""
    torch.set_num_threads(count)
    for model in (make_int4_batch_invariant(real_size_model()), real_size_int8_model()):
        assert_rows_are_their_chains(model)
        assert_grown_rows_are_their_chains(model)


@pytest.fixture(scope="module", params=["int8", "int4"])
def tiny(request):
    convert = make_int8_batch_invariant if request.param == "int8" else make_int4_batch_invariant
    return convert(tiny_llama(seed=0))


def test_a_tree_row_sees_only_its_path(tiny):
    """The same check on the tiny model; and a sibling's token changes no other branch."""
    assert_rows_are_their_chains(tiny)
    assert_grown_rows_are_their_chains(tiny)
    batched = BatchedModel(tiny)
    seq = batched.sequence()
    seq.forward(PREFIX)
    first = seq.forward_tree([13] + TOKENS, row_parents(PARENTS))
    seq.truncate(len(PREFIX))
    changed = list(TOKENS)
    changed[3] = 10  # node 3 heads the second branch: nodes 4, 5, 8 hang under it
    second = seq.forward_tree([13] + changed, row_parents(PARENTS))
    under_three = {3, 4, 5, 8}
    for node in range(len(TOKENS)):
        same = torch.equal(first[node + 1], second[node + 1])
        assert same == (node not in under_three), f"node {node}"


@pytest.mark.parametrize("accepted", [[], [0], [0, 1, 2], [3, 5, 8], [7]])
def test_keeping_a_path_leaves_the_cache_of_a_fresh_pass(tiny, accepted):
    batched = BatchedModel(tiny)
    seq = batched.sequence()
    seq.keep_hidden_states()
    seq.forward(PREFIX)
    seq.forward_tree([13] + TOKENS, row_parents(PARENTS))
    seq.keep_path(len(PREFIX), path_rows(accepted))
    kept = [13] + [TOKENS[n] for n in accepted]
    assert list(seq.cached_token_ids) == PREFIX + kept
    after = seq.forward([29, 30, 31])
    fresh = batched.sequence()
    fresh.keep_hidden_states()
    expected = fresh.forward(PREFIX + kept + [29, 30, 31])[-3:]
    assert torch.equal(after, expected)
    assert torch.equal(seq.hidden_states(), fresh.hidden_states())
    for mine, theirs in zip(seq.layers, fresh.layers, strict=True):
        assert torch.equal(mine.keys, theirs.keys) and torch.equal(mine.values, theirs.values)


def test_a_parent_after_its_child_is_refused(tiny):
    seq = BatchedModel(tiny).sequence()
    seq.forward(PREFIX)
    with pytest.raises(ValueError, match="parent 2 is not"):
        seq.forward_tree([13, 14, 15], [-1, 2, 0])
    assert list(seq.cached_token_ids) == PREFIX
    query, keys = torch.zeros(3, 2, 8), torch.zeros(1, 5, 8)  # the kernel checks as well
    with pytest.raises(RuntimeError, match="parents"):
        kernel().causal_attention(query, keys, keys, 1.0, [-1, 2, 0])
    with pytest.raises(RuntimeError, match="parents"):  # more held tree rows than positions
        kernel().causal_attention(query, keys, keys, 1.0, [-1] * 6)
    assert list(seq.cached_token_ids) == PREFIX, "a failed pass leaves the cache as it was"
    with pytest.raises(ValueError, match="parents for"):  # held tree rows past the cache
        seq.forward_tree([13], [-1] * (len(PREFIX) + 2))
    assert list(seq.cached_token_ids) == PREFIX


def test_children_follow_node_order():
    assert children(PARENTS) == [[0, 3, 7], [1], [2], [6], [4, 5], [], [8], [], [], []]
