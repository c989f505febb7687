from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.backends.base import common_prefix_length


def walked(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@settings(max_examples=400, deadline=None)
@given(
    shared=st.lists(st.integers(0, 9), max_size=600),
    a=st.lists(st.integers(0, 9), max_size=80),
    b=st.lists(st.integers(0, 9), max_size=80),
)
def test_common_prefix_length_is_the_walked_length(shared, a, b):
    """Compared in doubling blocks, the length is the one a token-by-token walk finds,
    wherever the texts part (inside a block, at a block's edge, never) and whichever is
    shorter; tuples and lists alike."""
    x, y = shared + a, shared + b
    assert common_prefix_length(x, y) == walked(x, y)
    assert common_prefix_length(tuple(y), x) == walked(x, y)
    assert common_prefix_length(x, x[: len(shared)]) == len(shared)


def test_a_part_at_each_block_edge():
    base = list(range(1000))
    for at in (0, 63, 64, 65, 191, 192, 193, 999):
        other = base[:at] + [-1] + base[at + 1 :]
        assert common_prefix_length(base, other) == at
