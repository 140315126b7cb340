import pytest

from mirage.frontend import shapes

GROUPS = [
    # graph shape, logical shape, expected groups
    ((6, 4), (2, 3, 4), [((0,), (0, 1)), ((1,), (2,))]),
    ((2, 3, 4), (2, 3, 4), [((0,), (0,)), ((1,), (1,)), ((2,), (2,))]),
    ((1, 64), (64,), [((1,), (0,))]),
    ((2, 1), (2,), [((0,), (0,))]),
    ((4, 6), (2, 12), [((0, 1), (0, 1))]),
    ((8, 5), (2, 2, 2, 5), [((0,), (0, 1, 2)), ((1,), (3,))]),
]


@pytest.mark.parametrize(("graph", "logical", "expected"), GROUPS)
def test_groups(graph, logical, expected):
    assert shapes.groups(graph, logical) == expected


def test_groups_rejects_a_non_reshape():
    with pytest.raises(ValueError, match="not a reshape"):
        shapes.groups((6, 4), (4, 6, 1, 2))


GRAPH_DIM = [
    ((6, 4), (2, 3, 4), 2, 1),
    ((6, 4), (2, 3, 4), 0, None),  # merged into graph dim 0 with dim 1
    ((2, 3, 4), (2, 3, 4), 1, 1),
    ((1, 64), (64,), 0, 1),
    ((3, 1), (3, 1), 1, None),  # size-1 dims are held by no graph dim
]


@pytest.mark.parametrize(("graph", "logical", "dim", "expected"), GRAPH_DIM)
def test_graph_dim(graph, logical, dim, expected):
    assert shapes.graph_dim(graph, logical, dim) == expected


BROADCAST = [
    # frame, result logical, operand (padded), target graph shape
    ((6, 4), (2, 3, 4), (1, 1, 4), (1, 4)),  # a weight row
    ((6, 4), (2, 3, 4), (2, 3, 1), (6, 1)),  # a per-row statistic
    ((6, 4), (2, 3, 4), (2, 3, 4), (6, 4)),
    ((6, 4), (2, 3, 4), (1, 3, 4), None),  # broadcasting over dim 0 would split graph dim 0
    ((2, 3, 4), (2, 3, 4), (1, 3, 1), (1, 3, 1)),
]


@pytest.mark.parametrize(("frame", "out", "operand", "expected"), BROADCAST)
def test_broadcast_target(frame, out, operand, expected):
    assert shapes.broadcast_target(frame, out, operand) == expected


@pytest.mark.parametrize(("shape", "permutation", "expected"), [
    ((2, 1, 4), (1, 0, 2), True),
    ((2, 3), (1, 0), False),
    ((1, 5), (1, 0), True),
    ((2, 1, 1, 3), (0, 2, 1, 3), True),
])
def test_keeps_order(shape, permutation, expected):
    assert shapes.keeps_order(shape, permutation) is expected


@pytest.mark.parametrize(("shape", "expected"), [((), (1, 1)), ((5,), (1, 5)), ((2, 3), (2, 3)),
                                                 ((2, 3, 4), (6, 4))])
def test_flat2d(shape, expected):
    assert shapes.flat2d(shape) == expected
