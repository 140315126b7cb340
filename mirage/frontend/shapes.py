"""How a torch tensor's shape relates to the shape of the µGraph tensor that holds it.

Inside a subprogram every torch value is held by a row-major kernel-graph tensor whose shape may
differ from the torch ("logical") shape by a free reshape: ``logical = graph.reshape(logical_shape)``.
For example a ``(batch, seq, hidden)`` activation is held as ``(batch·seq, hidden)`` so that a 2-D
weight can multiply it, and a ``(hidden,)`` weight as ``(1, hidden)`` so that it broadcasts.  These
functions answer which graph dim carries a torch dim, and which graph shape an operand needs so that
numpy-style broadcasting between equal ranks computes what torch broadcasting computes.

>>> graph_dim((6, 4), (2, 3, 4), 2)
1
>>> graph_dim((6, 4), (2, 3, 4), 0) is None
True
>>> broadcast_target((6, 4), (2, 3, 4), (1, 1, 4))
(1, 4)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Shape = tuple[int, ...]


def flat2d(shape: Sequence[int]) -> Shape:
    """The default graph shape of a torch value: leading dims merged, rank 2 (scalars: ``(1, 1)``)."""
    shape = tuple(shape)
    if len(shape) == 0:
        return (1, 1)
    if len(shape) == 1:
        return (1, shape[0])
    return (math.prod(shape[:-1]), shape[-1])


def rank3(shape: Sequence[int]) -> Shape:
    """All dims but the last two merged, for shapes of rank > 3 (``(b, h, s, d)`` as ``(b·h, s, d)``):
    the rank the search's grids map, where broadcasts over the merged dims (rotary tables of shape
    ``(1, 1, s, d)``) still hold."""
    shape = tuple(shape)
    return shape if len(shape) <= 3 else (math.prod(shape[:-2]), *shape[-2:])


def pad(shape: Sequence[int], rank: int) -> Shape:
    """Torch broadcasting aligns shapes on the right: prepend size-1 dims up to ``rank``."""
    return (1,) * (rank - len(shape)) + tuple(shape)


def groups(graph_shape: Sequence[int], logical_shape: Sequence[int]) -> list[tuple[Shape, Shape]]:
    """Minimal matching groups ``(graph dims, logical dims)`` of the non-1 dims (equal products)."""
    gs = [i for i, s in enumerate(graph_shape) if s != 1]
    ls = [j for j, s in enumerate(logical_shape) if s != 1]
    out: list[tuple[Shape, Shape]] = []
    a = b = 0
    while a < len(gs) and b < len(ls):
        g_dims, l_dims = [gs[a]], [ls[b]]
        g_size, l_size = graph_shape[gs[a]], logical_shape[ls[b]]
        a, b = a + 1, b + 1
        while g_size != l_size:
            if g_size < l_size and a < len(gs):
                g_dims.append(gs[a])
                g_size *= graph_shape[gs[a]]
                a += 1
            elif l_size < g_size and b < len(ls):
                l_dims.append(ls[b])
                l_size *= logical_shape[ls[b]]
                b += 1
            else:
                raise ValueError(f"{list(graph_shape)} is not a reshape of {list(logical_shape)}")
        out.append((tuple(g_dims), tuple(l_dims)))
    if a != len(gs) or b != len(ls):
        raise ValueError(f"{list(graph_shape)} is not a reshape of {list(logical_shape)}")
    return out


def graph_dim(graph_shape: Sequence[int], logical_shape: Sequence[int], dim: int) -> int | None:
    """The graph dim that holds logical ``dim`` and nothing else, or None (size-1 dims: None)."""
    for g_dims, l_dims in groups(graph_shape, logical_shape):
        if l_dims == (dim,) and len(g_dims) == 1:
            return g_dims[0]
    return None


def broadcast_target(frame: Sequence[int], out_logical: Sequence[int],
                     operand: Sequence[int]) -> Shape | None:
    """The graph shape for an operand of logical shape ``operand`` (already padded to the rank of
    ``out_logical``) in the graph frame ``frame`` of the result, or None when broadcasting would
    have to split a graph dim."""
    target = [1] * len(frame)
    for g_dims, l_dims in groups(frame, out_logical):
        full = [operand[d] == out_logical[d] for d in l_dims]
        if all(full):
            for g in g_dims:
                target[g] = frame[g]
        elif any(full):
            return None
    return tuple(target)


def expanded_target(frame: Sequence[int], out_logical: Sequence[int],
                    operand: Sequence[int]) -> tuple[Shape, Shape]:
    """The graph shape in ``frame`` and the logical shape to expand to, for an operand that
    :func:`broadcast_target` cannot place: the groups of logical dims that one graph dim merges and
    the operand broadcasts over in part are expanded (a key-padding mask (b, 1, 1, k) against scores
    (b, h, q, k) held as (b·h, q, k): over h), the others kept as they are, broadcast where they
    were, so that a mask of one value a key stays one row: (b·h, 1, k), expanded to (b, h, 1, k).

    >>> expanded_target((48, 256, 256), (4, 12, 256, 256), (4, 1, 1, 256))
    ((48, 1, 256), (4, 12, 1, 256))
    """
    target, expand = [1] * len(frame), list(operand)
    for g_dims, l_dims in groups(frame, out_logical):
        full = [operand[d] == out_logical[d] for d in l_dims]
        if any(full):
            for g in g_dims:
                target[g] = frame[g]
            for d in l_dims:
                expand[d] = out_logical[d]
    return tuple(target), tuple(expand)


def keeps_order(shape: Sequence[int], permutation: Sequence[int]) -> bool:
    """A permutation that keeps the order of the non-1 dims is only a reshape."""
    moved = [d for d in permutation if shape[d] != 1]
    return moved == sorted(moved)


def normalize_dims(dims, rank: int) -> tuple[int, ...]:
    if dims is None:
        return tuple(range(rank))
    if isinstance(dims, int):
        dims = (dims,)
    return tuple(sorted({d % rank if rank else 0 for d in dims}))
