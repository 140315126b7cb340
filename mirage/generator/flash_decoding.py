"""FlashDecoding headers for an attention reference of any shape: search-space overrides.

Mirage's generated grids hold no layout that splits attention's keys over blocks (its attention
demos start from saved checkpoints), so a search of the ``attention`` space from scratch verifies
nothing in minutes for an attention it has not seen. FlashDecoding's layout is known: a first
graph-defined op of ``(heads, key splits, query groups)`` blocks, each computing the exponentials of
its keys' scores, their per-row sums and their products with V, and a second of ``(heads, query
groups, 1)`` blocks that divides the summed products by the summed sums (mirage-notes §1.7). This
module derives those grids, input maps, for-loop dims and ranges from the reference's shapes, as
overrides of the space, so that the search visits only such headers and verifies the fused µGraphs
in seconds. The ops inside the blocks are still the search's to find.

>>> import mirage as mi
>>> g = mi.new_kernel_graph()
>>> q = g.new_input(dims=(8, 64, 32), dtype=mi.float16)
>>> k = g.new_input(dims=(8, 32, 64), dtype=mi.float16)
>>> v = g.new_input(dims=(8, 64, 32), dtype=mi.float16)
>>> e = g.exp(g.mul_scalar(g.matmul(q, k), 0.125))
>>> g.mark_output(g.matmul(g.div(e, g.reduction(e, 2)), v))
>>> overrides(g.freeze())["griddims"]
[(8, 4, 4), (8, 4, 1)]
"""

from __future__ import annotations

from typing import Any

from mirage.mugraph.graph import KernelGraph
from mirage.mugraph.ops import Op

ROWS_PER_GROUP = 16  # query rows a block holds (an MMA tile's rows)
KEY_SPLITS = (4, 8, 16)  # the split counts tried, each one grid of the first op
MIN_KEYS_PER_SPLIT = 16  # an MMA tile's columns
MIN_KEYS_PER_ITERATION = 64


def shape(reference: KernelGraph) -> tuple[int, int, int, int] | None:
    """``(heads, queries, head dim, keys)`` where ``reference`` is ``f(Q @ K) @ V`` on rank-3 tensors,
    Q ``(heads, queries, dim)``, K ``(heads, dim, keys)``, V ``(heads, keys, dim)`` and no other input
    (the headers map these three; a mask would have no map); else None."""
    products = [n for n in reference.nodes if n.op is Op.MATMUL]
    inputs = sum(n.op is Op.INPUT for n in reference.nodes)
    if len(products) != 2 or len(reference.outputs) != 1 or inputs != 3:
        return None
    q, k = (reference.type_of(r).shape for r in products[0].inputs)
    v = reference.type_of(products[1].inputs[1]).shape
    out = reference.type_of(reference.outputs[0]).shape
    if any(len(s) != 3 for s in (q, k, v, out)):
        return None
    heads, queries, dim = q
    keys = k[2]
    if k[:2] != (heads, dim) or v != (heads, keys, out[2]) or out[:2] != (heads, queries):
        return None
    return heads, queries, out[2], keys


def overrides(reference: KernelGraph) -> dict[str, Any] | None:
    """The FlashDecoding overrides of the search space for ``reference`` (module docstring), or None
    where it is not an attention of rank-3 tensors or its keys are too few to split."""
    found = shape(reference)
    if found is None:
        return None
    heads, queries, _, keys = found
    groups = max(1, queries // ROWS_PER_GROUP)
    while queries % groups:
        groups -= 1
    splits = [s for s in KEY_SPLITS if keys % s == 0 and keys // s >= MIN_KEYS_PER_SPLIT]
    if not splits:
        return None
    ranges = {1} | {r for s in splits for r in (2, 4, 8)
                    if (keys // s) % r == 0 and keys // s // r >= MIN_KEYS_PER_ITERATION}
    return {
        "griddims": [(heads, s, groups) for s in splits] + [(heads, groups, 1)],
        # Q: heads on x, query groups on z; K and V: heads on x, key splits on y (K's keys are its
        # dim 2, V's its dim 1), iterated by the for-loop; the combine's two inputs: heads, groups
        "imap_combos": [[(0, -1, 1), (0, 2, -1), (0, 1, -1)], [(0, 1, -1), (0, 1, -1)]],
        "fmap_combos": [[-1, 2, 1], [-1, -1]],
        "franges": sorted(ranges),
        "omaps": [(0, 2, 1), (0, 1, -1)],
    }
