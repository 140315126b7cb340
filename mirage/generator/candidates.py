"""Small pure generator functions that propose what the search may add next.

Nothing here checks abstract expressions or memory, or builds graphs: these functions only list
the candidates (input tuples in canonical order, input sets of graph-defined ops, block headers,
closing options), in a fixed order, so that the search is deterministic.  The explorer composes
them and applies the checks.

>>> input_tuples(3, 2)[:4]
((0, 0), (0, 1), (0, 2), (1, 0))
>>> after_order(input_tuples(3, 1), ((1,), 4), rank=2)
((2,),)
>>> ops_after(True, input_tuples(3, 2), order_key(True, (2, 0), 5), rank=4)
((1, 2), (2, 1), (2, 2))
>>> input_sets(3)
((0, 1, 2), (0, 1), (0, 2), (1, 2), (0,), (1,), (2,))
"""

from __future__ import annotations

import bisect
import functools
import itertools
from collections.abc import Callable, Iterator, Sequence

from mirage.errors import GraphError
from mirage.generator import dims
from mirage.generator.space import SearchSpace
from mirage.generator.state import BlockHeader, Order
from mirage.mugraph import build
from mirage.mugraph.graph import Dim3, TensorType


@functools.cache
def input_tuples(num_tensors: int, arity: int) -> tuple[tuple[int, ...], ...]:
    """Mirage's input candidates, sorted: unary ``(i,)``; binary all ordered pairs (``i == j`` too);
    n-ary permutations without repetition."""
    indices = range(num_tensors)
    if arity == 1:
        return tuple((i,) for i in indices)
    if arity == 2:
        return tuple(itertools.product(indices, repeat=2))
    return tuple(itertools.permutations(indices, arity))


def after_order(tuples: tuple[tuple[int, ...], ...], last: Order, rank: int) -> tuple[tuple[int, ...], ...]:
    """The input tuples ``t`` with ``(t, rank) > last`` (Mirage's order test, by bisection)."""
    last_inputs, last_rank = last
    if rank > last_rank:
        return tuples[bisect.bisect_left(tuples, last_inputs) :]
    return tuples[bisect.bisect_right(tuples, last_inputs) :]


# ---- canonical orders ---------------------------------------------------------------------------------
#
# MIRAGE: an op's key is (operand indices, rank), compared lexicographically (a prefix is smaller).
# COMPLETE: (operand indices sorted largest first, rank, operand indices).  Adding ops in increasing
# key order generates every µGraph exactly once: the ops that become available after an op is added
# read its output, the newest tensor, so their keys are larger than every key so far (Mirage's
# order lacks this: ``div(x, exp(y))`` with x before y has no increasing order).


def order_key(complete: bool, inputs: tuple[int, ...], rank: int) -> tuple:
    return key_from_head(complete, order_head(complete, inputs), inputs, rank)


def order_head(complete: bool, inputs: tuple[int, ...]) -> tuple[int, ...]:
    """The first part of an op's key, which does not depend on the op (hot loops compute it once)."""
    return tuple(sorted(inputs, reverse=True)) if complete else inputs


def key_from_head(complete: bool, head: tuple[int, ...], inputs: tuple[int, ...], rank: int) -> tuple:
    return (head, rank, inputs) if complete else (head, rank)


def first_order(complete: bool) -> tuple:
    """The key before every op (that of the input ops)."""
    return ((), -1, ()) if complete else ((), -1)


def mirage_order(complete: bool, key: tuple) -> Order:
    """A key in the ``(inputs, rank)`` form of the pruning table's ``Candidate.last_order``."""
    return (key[2], key[1]) if complete else key  # type: ignore[return-value]


def ops_after(complete: bool, tuples: tuple[tuple[int, ...], ...], last: tuple, rank: int):
    """The operand tuples whose op (of this rank) comes after ``last`` in the canonical order."""
    if not complete:
        return after_order(tuples, last, rank)  # type: ignore[arg-type]
    return tuple(t for t in tuples if order_key(True, t, rank) > last)


@functools.cache
def input_sets(num_tensors: int) -> tuple[tuple[int, ...], ...]:
    """Input sets of a graph-defined op: every non-empty set of tensors, as a sorted tuple (the
    block graph's input order is canonical), larger sets first."""
    sets = [c for k in range(num_tensors, 0, -1) for c in itertools.combinations(range(num_tensors), k)]
    return tuple(sets)


def block_headers(
    inputs: tuple[int, ...],
    types: Sequence[TensorType],
    space: SearchSpace,
    rejected: list[int],
    outputs: tuple[int, int] | None = None,
    final: bool = False,
    uneven_fits: Callable[[tuple[Dim3, ...], Dim3], bool] | None = None,
) -> Iterator[BlockHeader]:
    """Every (grid, block, input maps, for-loop dims, for-loop range) for these inputs, in Mirage's
    loop order.  Headers whose input iterators do not fit are counted in ``rejected[0]``; input maps of
    an uneven grid that ``uneven_fits(maps, spans)`` refuses (their overlapping tiles would disagree)
    in ``rejected[1]``, before any for-loop dim is tried."""
    types = tuple(types)
    for grid, spans in dims.grids(types, space):
        if grid[0] * grid[1] * grid[2] > space.max_grid_blocks:
            continue
        for block in dims.block_candidates(space):
            for imaps in dims.imap_combinations(types, grid, space, spans):
                if any(spans) and uneven_fits is not None and not uneven_fits(imaps, spans):
                    rejected[1] += 1
                    continue
                for fmaps in dims.fmap_combinations(types, space):
                    for forloop_range in dims.frange_candidates(types, imaps, fmaps, grid, space):
                        tiles = _tiles(types, imaps, fmaps, grid, forloop_range, spans)
                        if tiles is None:
                            rejected[0] += 1
                            continue
                        yield BlockHeader(
                            inputs,
                            grid,
                            block,
                            forloop_range,
                            imaps,
                            fmaps,
                            tiles,
                            outputs or (1, space.max_block_outputs),
                            final,
                            spans,
                        )


def _tiles(
    types: Sequence[TensorType], imaps: Sequence[Dim3], fmaps: Sequence[int], grid: Dim3, forloop_range: int,
    spans: Dim3 = (0, 0, 0),
) -> tuple[TensorType, ...] | None:
    tiles = []
    for t, imap, fmap in zip(types, imaps, fmaps, strict=True):
        try:
            shape = build.tile_shape(t, imap, fmap, grid, forloop_range, spans)
        except GraphError:
            return None
        tiles.append(TensorType(shape, t.dtype))
    return tuple(tiles)


def output_maps(grid: Dim3, space: SearchSpace) -> list[Dim3]:
    return dims.omap_candidates(grid, space)
