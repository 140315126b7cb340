"""Candidate grid dims, block dims, input/output maps, for-loop dims and ranges (pure functions).

These follow Mirage's ``DimStrategy`` (mirage-notes §4.2).  Each function takes the types of the
graph-defined op's inputs and the :class:`~mirage.generator.space.SearchSpace` and returns the
candidates in a fixed order, so the search is deterministic.

>>> from mirage.mugraph import TensorType, float16
>>> from mirage.generator.space import SearchSpace
>>> x, w = TensorType((2, 4096), float16), TensorType((4096, 6144), float16)
>>> space = SearchSpace()
>>> grid_candidates((x, w), space)[:4]
[(512, 1, 1), (768, 1, 1), (256, 1, 1), (384, 1, 1)]
>>> imap_combinations((x, w), (64, 1, 1), space)[:2]
[((-1, -1, -1), (1, -1, -1)), ((-1, -1, -1), (0, -1, -1))]
>>> omap_candidates((64, 1, 1), space)
[(0, -1, -1), (1, -1, -1)]
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from mirage.generator.space import SearchSpace
from mirage.mugraph.build import starts_apart
from mirage.mugraph.graph import Dim3, TensorType

ONE_D_SPLITS = (8, 16, 32, 64, 128, 256)  # {dim/x, 1, 1}
TWO_D_SPLITS = (8, 64, 128, 256)  # attention: {batch, dim/y, 1}


def _dedupe(values):
    return list(dict.fromkeys(values))


def grid_candidates(inputs: Sequence[TensorType], space: SearchSpace) -> list[Dim3]:
    """The grids to try for a graph-defined op with these inputs (user ``grid_dims`` replace them)."""
    if space.grid_dims is not None:
        return [g for g in space.grid_dims if g[0] * g[1] * g[2] <= space.max_grid_blocks]
    dims = [d for t in inputs for d in t.shape]
    batch = inputs[0].shape[0]
    found: list[Dim3] = [(d // x, 1, 1) for x in ONE_D_SPLITS for d in dims if d % x == 0]
    if space.attention_grids:
        found += [(batch, d // y, 1) for y in TWO_D_SPLITS for d in dims if d % y == 0]
        if len(inputs) > 2:
            found.append((batch, 16, 4))
    found = [g for g in found if space.min_grid_blocks <= g[0] * g[1] * g[2] <= space.max_grid_blocks]
    if all(t.rank in (2, 3) for t in inputs):
        found.append((batch, 1, 1))
    return _dedupe(found)


def grids(inputs: Sequence[TensorType], space: SearchSpace) -> list[tuple[Dim3, Dim3]]:
    """Every grid to try with its spans (``(0, 0, 0)`` where it divides its dims): the user's
    ``grid_dims`` (with ``grid_spans``), or Mirage's generated grids and then the uneven ones."""
    if space.grid_dims is not None:
        spans = space.grid_spans or ((0, 0, 0),) * len(space.grid_dims)
        if len(spans) != len(space.grid_dims):
            from mirage.generator.space import SearchSpaceError

            raise SearchSpaceError(f"grid_spans has {len(spans)} entries for {len(space.grid_dims)} "
                                   "grid_dims: give one per grid, (0, 0, 0) for a grid that divides its dims")
        return [(g, s) for g, s in zip(space.grid_dims, spans, strict=True)
                if g[0] * g[1] * g[2] <= space.max_grid_blocks]
    return [(g, (0, 0, 0)) for g in grid_candidates(inputs, space)] + uneven_grid_candidates(inputs, space)


def uneven_grid_candidates(inputs: Sequence[TensorType], space: SearchSpace) -> list[tuple[Dim3, Dim3]]:
    """Grids whose blocks split a dim that no split of Mirage's lists divides (a size that is no
    multiple of 8, ViT's 197 tokens), with their spans: ``ceil(d / x)`` blocks of the same splits, the
    last tile overlapping the one before it (``BlockGraph.spans``).  Empty under user ``grid_dims``
    or ``uneven_grids=False``."""
    if space.grid_dims is not None or not space.uneven_grids:
        return []
    odd = [d for d in dict.fromkeys(d for t in inputs for d in t.shape) if d % 8 and d > 8]
    batch = inputs[0].shape[0]
    found: list[tuple[Dim3, Dim3]] = [((-(-d // x), 1, 1), (d, 0, 0))
                                      for x in ONE_D_SPLITS for d in odd if d > x]
    if space.attention_grids:
        found += [((batch, -(-d // y), 1), (0, d, 0)) for y in TWO_D_SPLITS for d in odd if d > y]
    return list(dict.fromkeys(
        (g, s) for g, s in found if all(not n or starts_apart(n, b) for b, n in zip(g, s, strict=True))
        and space.min_grid_blocks <= g[0] * g[1] * g[2] <= space.max_grid_blocks))


def block_candidates(space: SearchSpace) -> list[Dim3]:
    return list(space.block_dims)


def _imap_fits(t: TensorType, imap: Dim3, grid: Dim3, spans: Dim3 = (0, 0, 0)) -> bool:
    mapped = [d for d in imap if d != -1]
    if len(mapped) != len(set(mapped)):
        return False
    for axis, d in enumerate(imap):
        if d >= t.rank or d < -1:
            return False
        if grid[axis] == 1 and d != -1:
            return False
        if d != -1 and (t.shape[d] != spans[axis] if spans[axis] else t.shape[d] % grid[axis]):
            return False
    return True


def imap_combinations(inputs: Sequence[TensorType], grid: Dim3, space: SearchSpace,
                      spans: Dim3 = (0, 0, 0)) -> list[tuple[Dim3, ...]]:
    """One input map per input; combinations where every input replicates along a split grid axis
    are dropped (those blocks would all compute the same thing)."""
    if space.imap_combos is not None:
        candidates = [c for c in space.imap_combos if len(c) == len(inputs)]
        chosen = [
            c for c in candidates
            if all(_imap_fits(t, m, grid, spans) for t, m in zip(inputs, c, strict=True))
        ]
    else:
        chosen = list(
            itertools.product(*[[m for m in space.imaps if _imap_fits(t, m, grid, spans)] for t in inputs])
        )
    combos = []
    for combo in chosen:
        if any(grid[a] > 1 and all(m[a] == -1 for m in combo) for a in range(3)):
            continue
        combos.append(tuple(combo))
    return combos


def fmap_combinations(inputs: Sequence[TensorType], space: SearchSpace) -> list[tuple[int, ...]]:
    """One for-loop dim per input: -1, or a dim of size > 1."""

    def fits(t: TensorType, d: int) -> bool:
        return d == -1 or (0 <= d < t.rank and t.shape[d] > 1)

    if space.fmap_combos is not None:
        return [
            tuple(c)
            for c in space.fmap_combos
            if len(c) == len(inputs) and all(fits(t, d) for t, d in zip(inputs, c, strict=True))
        ]
    return [tuple(c) for c in itertools.product(*[[d for d in space.fmaps if fits(t, d)] for t in inputs])]


def _after_grid(t: TensorType, imap: Dim3, grid: Dim3, dim: int) -> int:
    size = t.shape[dim]
    for axis, d in enumerate(imap):
        if d == dim:
            size //= grid[axis]
    return size


def frange_candidates(
    inputs: Sequence[TensorType], imaps: Sequence[Dim3], fmaps: Sequence[int], grid: Dim3, space: SearchSpace
) -> list[int]:
    """``[1]`` when no input iterates; else the ranges that divide every iterated (tile) dim."""
    if all(f == -1 for f in fmaps):
        return [1]
    sizes = [_after_grid(t, m, grid, f) for t, m, f in zip(inputs, imaps, fmaps, strict=True) if f != -1]
    return [x for x in space.franges if all(size % x == 0 for size in sizes)]


def omap_candidates(grid: Dim3, space: SearchSpace) -> list[Dim3]:
    """Output maps with a data dim exactly on the split grid axes (blocks write disjoint tiles)."""
    return [
        m
        for m in space.omaps
        if all((grid[a] > 1) == (m[a] != -1) for a in range(3))
        and len({d for d in m if d != -1}) == sum(d != -1 for d in m)
    ]
