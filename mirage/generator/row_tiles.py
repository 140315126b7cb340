"""2-D tiles of a matrix product with many rows: search-space overrides for a projection at prefill.

The ``mlp`` space's grids are Mirage's generated 1-D grids, which split one dim of one input: for
``x @ W`` with ``x`` of 128 rows and ``W`` of 768 columns, 48 to 768 blocks that each compute all 128
rows of 8 or 16 columns and read the whole of ``x`` for them, and no input map puts a row dim on a
grid axis.  For a subprogram whose one matrix product takes a rank-2 ``[M, K]`` operand with
``M >= MIN_ROWS``, this module adds grids of ``(N / columns, M / rows, 1)`` tiles and the maps that
put the rows on grid y (``(-1, 0, -1)`` for an ``[M, ·]`` input, ``(1, 0, -1)`` for an ``[M, N]`` one
and the output), beside the space's own grids and maps.  The ops inside the blocks stay the search's
to find.

>>> import mirage as mi
>>> g = mi.new_kernel_graph()
>>> x = g.new_input(dims=(128, 768), dtype=mi.float16)
>>> w = g.new_input(dims=(768, 768), dtype=mi.float16)
>>> g.mark_output(g.matmul(x, w))
>>> from mirage.generator.space import SearchSpace
>>> layout = overrides(g.freeze(), SearchSpace.named("mlp"))
>>> [grid for grid in layout["griddims"] if grid[1] > 1]
[(12, 4, 1), (12, 2, 1), (6, 4, 1), (6, 2, 1)]
"""

from __future__ import annotations

from typing import Any

from mirage.generator import dims
from mirage.generator.space import SearchSpace
from mirage.mugraph.graph import KernelGraph
from mirage.mugraph.ops import Op

MIN_ROWS = 64  # fewer rows are a GEMV's: the 1-D grids over the columns serve those
ROW_TILES = (32, 64)  # rows a block computes
COLUMN_TILES = (64, 128)  # columns a block computes
ROW_MAPS = ((-1, 0, -1), (1, 0, -1))  # an [M, ·] input's rows on y; an [M, N] tensor's columns on x too
DEPTH_TILES = (32, 64, 128)  # K a loop step takes (whole k16 steps of the tensor cores)


def overrides(reference: KernelGraph, space: SearchSpace) -> dict[str, Any] | None:
    """The grids and maps of :mod:`this module <mirage.generator.row_tiles>` for ``reference`` in
    ``space``, or None where its one matrix product has no rank-2 operand of ``MIN_ROWS`` rows."""
    products = [n for n in reference.nodes if n.op is Op.MATMUL]
    if len(products) != 1:
        return None
    a, b = (reference.type_of(r).shape for r in products[0].inputs)
    if len(a) != 2 or len(b) != 2 or a[0] < MIN_ROWS:
        return None
    rows, columns = a[0], b[1]
    tiles = [(columns // c, rows // r, 1) for c in COLUMN_TILES for r in ROW_TILES
             if columns % c == 0 and rows % r == 0]
    if not tiles:
        return None
    generated = dims.grid_candidates(reference.input_types, space)
    depth = a[1]
    return {
        "griddims": list(dict.fromkeys([*generated, *tiles])),
        "imaps": list(dict.fromkeys([*space.imaps, *ROW_MAPS])),
        "omaps": list(dict.fromkeys([*space.omaps, ROW_MAPS[1]])),
        "franges": sorted({*space.franges, *(depth // t for t in DEPTH_TILES if depth % t == 0)}),
    }
