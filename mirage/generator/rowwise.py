"""One-kernel µGraphs for row-wise programs of any length: element-wise chains and their row reductions.

An optimizer step written out, AdamW's sixteen torch ops with three outputs (the parameter and both
moments), is element-wise from end to end; a distillation loss's two tempered ``log_softmax``es and
their difference are eleven graph ops whose reductions all run along rows. The one-kernel form of
either reads each input once and writes each output once. The search cannot reach it: its spaces hold
a graph-defined op of at most 13 block ops and 2 outputs, and their states grow with every op, so the
frontend splits such programs by size into parts of a kernel each
(:func:`mirage.frontend.partition.size_segments`): five kernels where torch.compile makes one. The
form needs no search. Each block takes whole rows (or, where no op reduces a row, a slice of columns)
of every input, or of the row or column an input broadcasts, applies the reference's ops in the
reference's order, and writes its tile of every output:

* one graph-defined op over a grid of ``rows / r`` (× ``splits``) blocks, ``r`` rows a block;
* every input mapped by its own broadcast: a full input over both grid dims, a row of gains
  (``(1, cols)``) only over the columns, a column of factors (``(rows, 1)``) only over the rows;
* the reference's ops copied node by node, a row's sum, maximum or ``rms_norm`` over the block's
  whole row; each output saved by the element-wise accumulator of a one-step loop.

An exp the reference sums along a row is stabilised by the online-softmax rewrite as the search's
µGraphs are (docs/optimizer.md §8); a candidate it would leave unstable where the reference is not is
dropped. The candidates go where the split-row µGraphs go (:func:`mirage.frontend.optimize.choose`):
verified against the reference, then timed by profile-guided selection beside the search's µGraphs,
which keeps the fastest.

>>> import mirage as mi
>>> g = mi.new_kernel_graph()
>>> p, m = g.new_input((256, 1024), mi.float16), g.new_input((256, 1024), mi.float16)
>>> g.mark_output(g.sub(p, g.mul_scalar(g.div(m, g.add_scalar(g.sqrt(g.square(m)), 1e-8)), 1e-3)))
>>> g.mark_output(g.mul_scalar(m, 0.9))
>>> [b.grid_dim for c in candidates(g.freeze()) for b in c.block_graphs()]
[(256, 1, 1), (128, 1, 1)]
"""

from __future__ import annotations

from dataclasses import dataclass

import mirage as mi
from mirage.generator.split_rows import apply_nodes, broadcast_map
from mirage.mugraph.graph import KernelGraph
from mirage.mugraph.ops import ELEMENTWISE, Op
from mirage.mugraph.target import DEFAULT_TARGET

MIN_OPS = 2  # a lone op is what the search enumerates in full
ROW_OPS = frozenset({Op.REDUCTION, Op.REDUCTION_MAX, Op.RMS_NORM})  # along the last dim only
ROWS_PER_BLOCK = (1, 2, 4)  # a block's rows: the search's picks for AdamW's parts took 1 and 2
MAX_SLICE_COLS = 4096  # columns a block takes at most where no op reduces a row
MIN_SLICE_COLS = 256  # and at least, where rows are cut
MAX_ROW_COLS = 8192  # a row a block holds whole (longer ones: mirage.generator.split_rows, split_norms)
FEW_BLOCKS = 132  # a grid of fewer blocks leaves SMs of an H100 or H200 idle: columns split further
THREADS = 128
MAX_THREADS = 512  # whole rows: a thread's share of a row no more than 8 values where this allows


@dataclass(frozen=True)
class RowWise:
    """A reference that :func:`match` takes: its (rows, cols), and whether its blocks must hold whole
    rows (an op reduces a row, or an output holds one value a row)."""

    rows: int
    cols: int
    whole_rows: bool


def match(reference: KernelGraph) -> RowWise | None:
    """What ``reference`` is, where it is row-wise: 2-D, at least :data:`MIN_OPS` ops, every op
    element-wise or a row's sum, maximum or ``rms_norm`` (over the last dim), every tensor of (rows,
    cols) or broadcast from a row or a column of it, every output a computed (rows, cols) or (rows, 1)
    (no input given back as it is, none twice); else None."""
    nodes = reference.nodes
    body = [n for n in nodes if n.op is not Op.INPUT]
    if len(body) < MIN_OPS or any(n.op not in ELEMENTWISE | ROW_OPS for n in body):
        return None
    if any(n.op in (Op.REDUCTION, Op.REDUCTION_MAX) and n.attrs.dim != 1 for n in body):
        return None
    outputs = [nodes[r.node] for r in reference.outputs]
    if any(n.op is Op.INPUT for n in outputs) or len(set(reference.outputs)) != len(reference.outputs):
        return None
    if any(len(n.outputs[0].shape) != 2 for n in nodes):
        return None
    shapes = [n.outputs[0].shape for n in nodes]
    rows, cols = max(t[0] for t in shapes), max(t[1] for t in shapes)
    if any(n.outputs[0].shape not in ((rows, cols), (rows, 1)) for n in outputs):
        return None
    if any(t[0] not in (1, rows) or t[1] not in (1, cols) for t in shapes):
        return None
    # a row's op over more than one column, or an output of one value a row: no block may cut a row
    whole = any(n.op in ROW_OPS and nodes[n.inputs[0].node].outputs[0].shape[1] > 1 for n in body) or any(
        n.outputs[0].shape[1] == 1 for n in outputs)
    if whole and cols > MAX_ROW_COLS:
        return None
    return RowWise(rows, cols, whole)


def column_splits(rows: int, cols: int) -> int:
    """Slices a row is cut into: the fewest equal ones of no more than :data:`MAX_SLICE_COLS` columns,
    doubled while the grid of one row a block stays under :data:`FEW_BLOCKS` and slices keep
    :data:`MIN_SLICE_COLS`."""
    splits = next((s for s in range(1, cols + 1) if cols % s == 0 and cols // s <= MAX_SLICE_COLS), 1)
    while rows * splits < FEW_BLOCKS and cols % (2 * splits) == 0 and cols // (2 * splits) >= MIN_SLICE_COLS:
        splits *= 2
    return splits


def candidates(reference: KernelGraph) -> list[KernelGraph]:
    """One-kernel µGraphs for ``reference`` (none where it is not row-wise, :func:`match`), one for
    each count of rows a block in :data:`ROWS_PER_BLOCK` that divides the rows and keeps the grid at
    half of :data:`FEW_BLOCKS` or more (a block a row always) and within the target's blocks a kernel
    (4,096, the search's bound: more rows are left to the search, whose µGraphs loop over them)."""
    found = match(reference)
    if found is None:
        return []
    splits = 1 if found.whole_rows else column_splits(found.rows, found.cols)
    if splits > 1 and found.cols // splits < MIN_SLICE_COLS:  # a length of no fitting divisor (a prime)
        return []
    threads = THREADS
    if found.whole_rows:  # about 8 values of a row a thread, in warps
        threads = min(MAX_THREADS, max(THREADS, -(-found.cols // 8 // 32) * 32))
    graphs = [one_kernel(reference, found.rows // r, splits, threads) for r in ROWS_PER_BLOCK
              if found.rows % r == 0 and (r == 1 or found.rows // r * splits >= FEW_BLOCKS // 2)
              and found.rows // r * splits <= DEFAULT_TARGET.max_blocks_per_kernel]
    if any(n.op is Op.EXP for n in reference.nodes):  # stable where the reference is
        from mirage.optimizer.softmax import unstable_exps

        allowed = unstable_exps(reference)
        graphs = [g for g in graphs if unstable_exps(g) <= allowed]
    return graphs


def one_kernel(reference: KernelGraph, row_blocks: int, splits: int, threads: int = THREADS) -> KernelGraph:
    """The graph-defined op of the module docstring on a grid of ``row_blocks`` × ``splits``."""
    g = mi.new_kernel_graph("rowwise")
    inputs = {i: g.new_input(reference.nodes[i].outputs[0].shape, reference.nodes[i].outputs[0].dtype)
              for i in reference.input_nodes}
    tb = mi.new_threadblock_graph(grid_dim=(row_blocks, splits, 1), block_dim=(threads, 1, 1),
                                  forloop_range=1)

    def grid_map(r: int, c: int) -> tuple[int, int, int]:  # a grid axis of one block maps nothing
        return broadcast_map(r if row_blocks > 1 else 1, c if splits > 1 else 1)

    tiles: dict = {}
    read: list = []  # the inputs, in the reference's order
    apply_nodes(tb, reference, range(len(reference.nodes)), inputs, tiles, read, grid_map)
    for ref in reference.outputs:
        tb.new_output(tb.forloop_accum(tiles[ref.node]),
                      output_map=grid_map(*reference.nodes[ref.node].outputs[0].shape))
    made = g.customized(read, tb)
    for t in made if isinstance(made, list) else [made]:
        g.mark_output(t)
    return g.freeze()
