"""One-kernel µGraphs for element-wise programs of any length.

An optimizer step written out, AdamW's sixteen torch ops with three outputs (the parameter and both
moments), is element-wise from end to end: its one-kernel form reads each input once and writes each
output once. The search cannot reach it: its spaces hold a graph-defined op of at most 13 block ops
and 2 outputs, and their states grow with every op, so the frontend splits such a chain by size into
parts of a kernel each (:func:`mirage.frontend.partition.size_segments`): five kernels where
torch.compile makes one. The form needs no search. Each block takes a tile of rows (and, for long
rows, a slice of columns) of every input, or of the row or column an input broadcasts, applies the
reference's ops in the reference's order, and writes its tile of every output:

* one graph-defined op over a grid of ``rows / r`` (× ``splits``) blocks, ``r`` rows a block;
* every input mapped by its own broadcast: a full input over both grid dims, a row of gains
  (``(1, cols)``) only over the columns, a column of factors (``(rows, 1)``) only over the rows;
* the reference's element-wise ops copied node by node, each output saved by the element-wise
  accumulator of a one-step loop.

The candidates go where the split-row µGraphs go (:func:`mirage.frontend.optimize.choose`): verified
against the reference, then timed by profile-guided selection beside the search's µGraphs, which
keeps the fastest.

>>> import mirage as mi
>>> g = mi.new_kernel_graph()
>>> p, m = g.new_input((256, 1024), mi.float16), g.new_input((256, 1024), mi.float16)
>>> g.mark_output(g.sub(p, g.mul_scalar(g.div(m, g.add_scalar(g.sqrt(g.square(m)), 1e-8)), 1e-3)))
>>> g.mark_output(g.mul_scalar(m, 0.9))
>>> [b.grid_dim for c in candidates(g.freeze()) for b in c.block_graphs()]
[(256, 1, 1), (128, 1, 1), (64, 1, 1)]
"""

from __future__ import annotations

import mirage as mi
from mirage.mugraph.graph import KernelGraph
from mirage.mugraph.ops import ELEMENTWISE, Op

MIN_OPS = 2  # a lone op is what the search enumerates in full
ROWS_PER_BLOCK = (1, 2, 4)  # a block's rows: the search's picks for AdamW's parts took 1 and 2
MAX_SLICE_COLS = 4096  # columns a block takes at most (the split-row µGraphs' slice)
FEW_BLOCKS = 132  # a grid of fewer blocks leaves SMs of an H100 or H200 idle: columns split further
THREADS = 128


def matches(reference: KernelGraph) -> tuple[int, int] | None:
    """(rows, cols) where ``reference`` is element-wise: 2-D, at least :data:`MIN_OPS` ops, every op
    element-wise, every tensor of (rows, cols) or broadcast from a row or a column of it, every output
    of (rows, cols) and computed (no input given back as it is); else None."""
    nodes = reference.nodes
    body = [n for n in nodes if n.op is not Op.INPUT]
    if len(body) < MIN_OPS or any(n.op not in ELEMENTWISE for n in body):
        return None
    outputs = [reference.nodes[r.node] for r in reference.outputs]
    if any(n.op is Op.INPUT for n in outputs) or len(set(reference.outputs)) != len(reference.outputs):
        return None
    shape = outputs[0].outputs[0].shape
    if len(shape) != 2 or any(n.outputs[0].shape != shape for n in outputs):
        return None
    rows, cols = shape
    for n in nodes:
        t = n.outputs[0].shape
        if len(t) != 2 or t[0] not in (1, rows) or t[1] not in (1, cols):
            return None
    return rows, cols


def column_splits(rows: int, cols: int) -> int:
    """Slices a row is cut into: the fewest equal ones of no more than :data:`MAX_SLICE_COLS` columns,
    doubled while the grid of one row a block stays under :data:`FEW_BLOCKS` and slices keep 256."""
    splits = next((s for s in range(1, cols + 1) if cols % s == 0 and cols // s <= MAX_SLICE_COLS), 1)
    while rows * splits < FEW_BLOCKS and cols % (2 * splits) == 0 and cols // (2 * splits) >= 256:
        splits *= 2
    return splits


def candidates(reference: KernelGraph) -> list[KernelGraph]:
    """One-kernel µGraphs for ``reference`` (none where it is not element-wise, :func:`matches`), one
    for each count of rows a block in :data:`ROWS_PER_BLOCK` that divides the rows."""
    found = matches(reference)
    if found is None:
        return []
    rows, cols = found
    splits = column_splits(rows, cols)
    return [one_kernel(reference, rows // r, splits) for r in ROWS_PER_BLOCK
            if rows % r == 0 and (r == 1 or rows // r * splits >= FEW_BLOCKS // 2)]


def one_kernel(reference: KernelGraph, row_blocks: int, splits: int) -> KernelGraph:
    """The graph-defined op of the module docstring on a grid of ``row_blocks`` × ``splits``."""
    g = mi.new_kernel_graph("elementwise")
    inputs = {i: g.new_input(reference.nodes[i].outputs[0].shape, reference.nodes[i].outputs[0].dtype)
              for i in reference.input_nodes}
    tb = mi.new_threadblock_graph(grid_dim=(row_blocks, splits, 1), block_dim=(THREADS, 1, 1),
                                  forloop_range=1)
    def grid_map(r: int, c: int) -> tuple[int, int, int]:  # a grid axis of one block maps nothing
        return 0 if r > 1 and row_blocks > 1 else -1, 1 if c > 1 and splits > 1 else -1, -1

    tiles = {}
    for i, node in enumerate(reference.nodes):
        if node.op is Op.INPUT:
            tiles[i] = tb.new_input(inputs[i], input_map=grid_map(*node.outputs[0].shape))
        else:
            tiles[i] = tb.apply(node.op, [tiles[ref.node] for ref in node.inputs], node.attrs)
    out_map = grid_map(*reference.nodes[reference.outputs[0].node].outputs[0].shape)
    for ref in reference.outputs:
        tb.new_output(tb.forloop_accum(tiles[ref.node]), output_map=out_map)
    made = g.customized(list(inputs.values()), tb)
    for t in made if isinstance(made, list) else [made]:
        g.mark_output(t)
    return g.freeze()
