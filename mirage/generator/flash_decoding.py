"""FlashDecoding and FlashAttention headers for an attention reference of any shape: search-space
overrides.

Mirage's generated grids hold no layout that splits attention's keys over blocks (its attention
demos start from saved checkpoints), so a search of the ``attention`` space from scratch verifies
nothing in minutes for an attention it has not seen. Two layouts are known:

* FlashDecoding's (mirage-notes §1.7): a first graph-defined op of ``(heads, key splits, query
  groups)`` blocks, each computing the exponentials of its keys' scores, their per-row sums and
  their products with V, and a second of ``(heads, query groups, 1)`` blocks that divides the summed
  products by the summed sums. It fills the GPU when there are few queries and many keys (decoding).
* FlashAttention's: one graph-defined op of ``(heads, 1, query groups)`` blocks, each looping over
  all the keys of its head and dividing by the row sums after the loop. No partials go through
  global memory and there is one launch; it fills the GPU when heads × query groups do (many
  queries, few keys). Its block graph takes 10 ops, one over the space's default budget of 9.

This module derives those grids, input maps, for-loop dims and ranges from the reference's shapes,
as overrides of the space, so that the search visits only such headers and verifies the fused
µGraphs in seconds (the one-kernel headers first: they tile the reference as one kernel can,
:mod:`mirage.generator.tiling`). The ops inside the blocks are still the search's to find.

>>> import mirage as mi
>>> def attention(heads, queries, dim, keys):
...     g = mi.new_kernel_graph()
...     q = g.new_input(dims=(heads, queries, dim), dtype=mi.float16)
...     k = g.new_input(dims=(heads, dim, keys), dtype=mi.float16)
...     v = g.new_input(dims=(heads, keys, dim), dtype=mi.float16)
...     e = g.exp(g.mul_scalar(g.matmul(q, k), dim ** -0.5))
...     g.mark_output(g.matmul(g.div(e, g.reduction(e, 2)), v))
...     return g.freeze()
>>> overrides(attention(16, 128, 64, 128))["griddims"]  # one kernel (16 or 64 rows a block), or splits
[(16, 1, 8), (16, 1, 2), (16, 4, 8), (16, 8, 8), (16, 8, 1)]
>>> overrides(attention(2, 256, 64, 4096))["griddims"]  # decoding: 32 blocks unsplit, so splits only
[(2, 4, 16), (2, 8, 16), (2, 16, 16), (2, 16, 1)]
"""

from __future__ import annotations

from typing import Any

from mirage.mugraph.build import starts_apart
from mirage.mugraph.graph import KernelGraph
from mirage.mugraph.ops import ELEMENTWISE, Op

ROWS_PER_GROUP = 16  # query rows a block holds (an MMA tile's rows)
WHOLE_ROWS_PER_GROUP = (16, 64)  # one-kernel members: an MMA tile's rows, or a warpgroup MMA's
KEY_SPLITS = (4, 8, 16)  # the split counts tried, each one grid of the first op
MIN_KEYS_PER_SPLIT = 16  # an MMA tile's columns
MIN_KEYS_PER_ITERATION = 64
MAX_WHOLE_KEYS_PER_ITERATION = 128  # one-kernel members: a K and a V tile of 128 keys fit a stage
MIN_WHOLE_BLOCKS = 64  # one-kernel members where heads × 16-row groups give this many blocks or more
# long prompts: blocks of 128 query rows (two 16-row tiles a warp, or two 64-row tiles a warpgroup, share
# every K and V fragment loaded) first where they still give this many blocks (two of each SM of an H100)
WIDE_ROWS_PER_GROUP = 128
MIN_WIDE_BLOCKS = 256
WHOLE_BLOCK_OPS = 10  # Q, K, V; Q·K, its scale, exp, the row sums, P·V, two accumulators (or one
# and a saver), the division
MASK_BLOCK_OPS = 2  # a mask's input and its add to the scores
PLAIN_SCORE_OPS = 2  # the element-wise ops of plain attention's scores in WHOLE_BLOCK_OPS: scale, exp
# the search's estimate of a masked body's shared memory (every tensor its own buffer): the space's
# 96 KB plus a 64 × 128 tile of the mask and one of the masked scores (fp16), so that the 64-row
# member with 128 keys an iteration is in the space (the fastest form measured: docs/performance.md)
MASKED_SHARED_BYTES = 128 * 1024
SPACE_SHARED_BYTES = 96 * 1024  # the space's default (SearchSpace.shared_memory_bytes)
MAX_SHARED_BYTES = 227 * 1024  # a block's shared memory on an H100 or H200


def _roles(reference: KernelGraph, q, k, v) -> tuple[str, ...] | None:
    """What each input of ``reference`` is, in input order: ``q``, ``k``, ``v`` or ``mask`` (an
    additive mask of the scores, ``(heads or 1, queries or 1, keys)``, read by an add); None if another
    input is there."""
    roles = []
    for index, node in enumerate(reference.nodes):
        if node.op is not Op.INPUT:
            continue
        role = {q: "q", k: "k", v: "v"}.get(index)
        if role is None:
            readers = [n.op for n in reference.nodes if any(r.node == index for r in n.inputs)]
            role = "mask" if readers == [Op.ADD] else None
        if role is None:
            return None
        roles.append(role)
    return tuple(roles) if sorted(roles) in (["k", "q", "v"], ["k", "mask", "q", "v"]) else None


def _source(reference: KernelGraph, node: int) -> int | None:
    """The one input that ``node`` is computed from (Q may be scaled or normalized before its
    product), or None."""
    found = {i for i in reference.upstream(node) | {node} if reference.nodes[i].op is Op.INPUT}
    return found.pop() if len(found) == 1 else None


def shape(reference: KernelGraph) -> tuple[int, int, int, int] | None:
    """``(heads, queries, head dim, keys)`` where ``reference`` is ``f(Q @ K [+ M]) @ V`` on rank-3
    tensors, Q ``(heads, queries, dim)``, K ``(heads, dim, keys)``, V ``(heads, keys, dim)`` and at
    most one more input, an additive mask M ``(heads or 1, queries or 1, keys)``: one of every query's
    keys, or one a key (a key-padding mask: BERT's, shared by the queries); else None."""
    found = _layout(reference)
    return None if found is None else found[0]


def _layout(reference: KernelGraph):
    """:func:`shape`, the inputs' roles (:func:`_roles`), and whether the mask is shared by the heads
    and by the queries; or None."""
    products = [n for n in reference.nodes if n.op is Op.MATMUL]
    if len(products) != 2 or len(reference.outputs) != 1:
        return None
    (q_ref, k_ref), v_ref = products[0].inputs, products[1].inputs[1]
    sources = [_source(reference, r.node) for r in (q_ref, k_ref, v_ref)]
    roles = None if None in sources or len(set(sources)) < 3 else _roles(reference, *sources)
    q, k = (reference.type_of(r).shape for r in (q_ref, k_ref))
    v = reference.type_of(v_ref).shape
    out = reference.type_of(reference.outputs[0]).shape
    if roles is None or any(len(s) != 3 for s in (q, k, v, out)):
        return None
    heads, queries, dim = q
    keys = k[2]
    if k[:2] != (heads, dim) or v != (heads, keys, out[2]) or out[:2] != (heads, queries):
        return None
    masks = [reference.nodes[i].outputs[0].shape for i in reference.input_nodes
             if roles[reference.input_nodes.index(i)] == "mask"]
    if any(m[2] != keys or m[1] not in (1, queries) or m[0] not in (1, heads) for m in masks):
        return None
    shared_mask = any(m[0] == 1 < heads for m in masks)
    per_key = any(m[1] == 1 < queries for m in masks)
    return (heads, queries, out[2], keys), roles, (shared_mask, per_key)


def _extra_score_ops(reference: KernelGraph) -> int:
    """The element-wise ops of ``reference``'s scores beyond plain attention's scale and exp (a mask's
    add counted apart): Gemma 2's soft cap ``cap · tanh(s / cap)`` adds a tanh and a product by a
    number, which the one-kernel form computes in its block graph too."""
    score_ops = sum(1 for n in reference.nodes if n.op in ELEMENTWISE and n.op not in (Op.ADD, Op.DIV))
    return max(0, score_ops - PLAIN_SCORE_OPS)


def _on(grid: tuple[int, int, int], imap: tuple[int, int, int]) -> tuple[int, int, int]:
    """``imap`` for ``grid``: the dims it puts on grid axes of one block left unmapped."""
    return tuple(d if size > 1 else -1 for size, d in zip(grid, imap, strict=True))  # type: ignore[return-value]


def _groups(queries: int, rows: int) -> int:
    """Query groups of about ``rows`` rows that divide ``queries`` (at least one)."""
    groups = max(1, queries // rows)
    while queries % groups:
        groups -= 1
    return groups


def overrides(reference: KernelGraph) -> dict[str, Any] | None:
    """The FlashAttention and FlashDecoding overrides of the search space for ``reference`` (module
    docstring), or None where it is not an attention of rank-3 tensors."""
    found = _layout(reference)
    if found is None:
        return None
    (heads, queries, _, keys), roles, (shared_mask, per_key) = found
    groups = _groups(queries, ROWS_PER_GROUP)
    splits = [s for s in KEY_SPLITS if keys % s == 0 and keys // s >= MIN_KEYS_PER_SPLIT]
    whole = list(dict.fromkeys(_groups(queries, rows) for rows in WHOLE_ROWS_PER_GROUP))
    # the warpgroup's 64-row blocks first where they still give MIN_WHOLE_BLOCKS blocks: on an H200 that
    # member ran (1, 12, 512, 64) attention in 7.2 µs against 14.9 for 16-row blocks, masked 10.7 against
    # 15.9 (docs/performance.md §2); with few cores its units now come before the 16-row ones
    widest = min(whole)  # the fewest query groups: the most rows a block
    if heads * widest >= MIN_WHOLE_BLOCKS:
        whole = [widest] + [g for g in whole if g != widest]
    # Stable Diffusion 1.5's 4,096-token self-attention (16 heads): 128-row blocks 289 → 233 µs on an
    # H200 against 64-row ones (benchmarks/narrow_heads.py, docs/performance.md §2)
    wide = _groups(queries, WIDE_ROWS_PER_GROUP)
    if queries % WIDE_ROWS_PER_GROUP == 0 and heads * wide >= MIN_WIDE_BLOCKS and wide not in whole:
        whole = [wide] + whole
    # where no group of about those rows divides the queries (ViT's 197), also blocks of those rows
    # with the last one overlapping (spans: BlockGraph.spans); the queries index the output, unreduced.
    # The online-softmax chain pads a block's rows to whole 16-row tiles (100 queries: 7 blocks of 15
    # rows run 16 each, 2 of 50 run 64), so every such grid has a fused member
    uneven = [-(-queries // rows) for rows in WHOLE_ROWS_PER_GROUP if queries % rows and queries > rows]
    uneven = [g for g in dict.fromkeys(uneven) if g not in whole and starts_apart(queries, g)]
    if splits and heads * groups < MIN_WHOLE_BLOCKS:
        # decoding: too few blocks without a split of the keys; the search's time goes to splits, and to
        # uneven grids of enough blocks (100 queries: 7 blocks of 15 rows a head, not 5 of 20)
        whole = []
        uneven = [g for g in uneven if heads * g >= MIN_WHOLE_BLOCKS]
    ranges = {1} | {r for s in splits for r in (2, 4, 8)
                    if (keys // s) % r == 0 and keys // s // r >= MIN_KEYS_PER_ITERATION}
    ranges |= {r for r in range(2, keys // MIN_KEYS_PER_ITERATION + 1) if whole + uneven and keys % r == 0
               and MIN_KEYS_PER_ITERATION <= keys // r <= MAX_WHOLE_KEYS_PER_ITERATION}
    # Q: heads on x, query groups on z; K and V: heads on x, key splits on y (K's keys are its dim 2,
    # V's its dim 1), iterated by the for-loop; the combine's two inputs: heads, groups. A mask is
    # tiled as the scores are: heads on x (none for a mask shared by all heads), query groups on z
    # (none for a key-padding mask, one row that every query group reads), keys split on y and
    # iterated. A one-kernel member (y = 1) maps nothing on y and writes whole rows of the output.
    # A grid axis of one block maps no dim (the search's canonical form, ``dims._imap_fits``): with one
    # head (a batch of one, one head), one query group (decoding: one query, or up to 16) or one split,
    # that axis's dims stay whole, and each grid gets the maps of its own axes.
    head, row = -1 if shared_mask else 0, -1 if per_key else 1
    whole_maps = {"q": (0, -1, 1), "k": (0, -1, -1), "v": (0, -1, -1), "mask": (head, -1, row)}
    split_maps = {"q": (0, -1, 1), "k": (0, 2, -1), "v": (0, 1, -1), "mask": (head, 2, row)}
    loop_dims = [{"q": -1, "k": 2, "v": 1, "mask": 2}[role] for role in roles]
    whole_grids = [(heads, 1, g) for g in whole] + [(heads, 1, g) for g in uneven]
    whole_spans = [(0, 0, 0)] * len(whole) + [(0, 0, queries)] * (len(whole_grids) - len(whole))
    split_grids = [(heads, s, groups) for s in splits]
    combine_grid = [(heads, groups, 1)] if splits else []
    imaps = [[_on(grid, whole_maps[role]) for role in roles] for grid in whole_grids]
    imaps += [[_on(grid, split_maps[role]) for role in roles] for grid in split_grids]
    imaps += [[_on(grid, (0, 1, -1))] * 2 for grid in combine_grid]
    omaps = ([_on(grid, (0, -1, 1)) for grid in whole_grids] + [_on(grid, (0, 2, 1)) for grid in split_grids]
             + [_on(grid, (0, 1, -1)) for grid in combine_grid])
    block_ops = WHOLE_BLOCK_OPS + MASK_BLOCK_OPS * ("mask" in roles) + _extra_score_ops(reference)
    shared = MASKED_SHARED_BYTES if "mask" in roles else 0
    if whole_grids:  # wide heads: the first one-kernel grid's body within the search's estimate
        shared = max(shared, _one_kernel_bytes(reference, -(-queries // whole_grids[0][2]), ranges, keys))
    return {
        "griddims": whole_grids + split_grids + combine_grid,
        **({"grid_spans": whole_spans + [(0, 0, 0)] * (len(split_grids) + len(combine_grid))}
           if any(map(any, whole_spans)) else {}),
        "imap_combos": list(map(list, dict.fromkeys(map(tuple, imaps)))),
        "fmap_combos": [loop_dims, [-1, -1]] if splits else [loop_dims],
        "franges": sorted(ranges),
        "omaps": list(dict.fromkeys(omaps)),
        **({"max_block_ops": block_ops} if whole_grids or "mask" in roles else {}),
        # FlashDecoding's two graph-defined ops on every input (the space's default of 5 counts three)
        **({"max_kernel_ops": len(roles) + 2} if splits and len(roles) > 3 else {}),
        **({"shared_memory_bytes": min(shared, MAX_SHARED_BYTES)} if shared > SPACE_SHARED_BYTES else {}),
    }


def _one_kernel_bytes(reference: KernelGraph, rows: int, ranges: set[int], keys: int) -> int:
    """The search's estimate (every tensor its own buffer) of a one-kernel body of ``rows`` query rows
    at its fewest keys an iteration: Q, K and V tiles, the scores three times (the product, its scale,
    exp), P·V, its accumulator and the division, and the row sums. Heads of 160 (Stable Diffusion 1.5's
    third level) in 64-row blocks need 144 KB of it, over the space's 96 KB: their one-kernel members
    were never built, and only forms that divide in a second kernel were found."""
    qk, pv = (n for n in reference.nodes if n.op is Op.MATMUL)
    q = reference.type_of(qk.inputs[0])
    dim, width = q.shape[-1], reference.type_of(pv.inputs[1]).shape[-1]
    step = min((keys // r for r in ranges if keys % r == 0 and keys // r >= MIN_KEYS_PER_ITERATION),
               default=keys)
    elements = rows * dim + dim * step + step * width + 3 * rows * step + 3 * rows * width + 2 * rows
    return elements * q.dtype.itemsize
