"""Split-row µGraphs for ``log_softmax``, ``logsumexp`` and ``softmax`` over long rows of few rows.

A sampler's next-token step takes ``log_softmax(logits / t)`` (or ``softmax``) over a vocabulary: 8
rows of 32,000, or 4 of Llama 3's 128,256, often with a mask (min-p, top-k: 0 or −inf a token) or a
bias added to the logits first.  A µGraph of one block a row leaves all but 8 of an H100's
132 SMs idle, and the row may not fit a block's shared memory at all; the search's ``mlp`` space holds
one graph-defined op, so it finds nothing else.  What such rows take is the split reduction that
FlashDecoding gives attention's keys (:mod:`mirage.generator.flash_decoding`), written for a row:

* a first graph-defined op of (rows, splits) blocks, each saving its slice's maximum ``Mᵢ`` (no lower
  than the dtype's lowest finite value, so that a slice all −inf gives ``Pᵢ = 0``, not NaN) and
  ``Pᵢ = Σ exp(x − Mᵢ)`` over the slice;
* a second that combines a row's partials, ``g = max Mᵢ`` and ``lse = g + log Σ Pᵢ·exp(Mᵢ − g)``, and
  for log_softmax writes its slice of ``x − lse`` ((rows, splits) blocks), for softmax its slice of
  ``exp(x − lse)`` (no more than 1, whatever the logits), for logsumexp the row's ``lse`` ((rows, 1)
  blocks).

The µGraphs are written stable (the maxima explicit, as the online-softmax rewrite would make them:
docs/optimizer.md §8), so the rewrite leaves them as they are (the softmax's second exp it reports as
one it cannot rewrite: its shift is the row's logsumexp, not a maximum of its tile); the finite-field
verifier cannot
interpret a maximum, so the frontend checks them in floating point against the reference, and
profile-guided selection times them beside the search's µGraphs.  Measured on an H200
(``benchmarks/split_rows.py``): 8 × 32,000 log_softmax in 3.70 µs against PyTorch's 9.47, logsumexp
in 3.43 against 21.91.

>>> import mirage as mi
>>> g = mi.new_kernel_graph()
>>> x = g.mul_scalar(g.new_input((8, 32000), mi.float16), 1 / 0.7)
>>> g.mark_output(g.sub(x, g.log(g.reduction(g.exp(x), 1))))
>>> [b.grid_dim for b in candidates(g.freeze())[0].block_graphs()]
[(8, 16, 1), (8, 16, 1)]
>>> len(candidates(g.freeze()))
4
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mirage as mi
from mirage.mugraph.graph import KernelGraph, Node
from mirage.mugraph.ops import BINARY, UNARY, Op
from mirage.mugraph.target import DEFAULT_TARGET

MIN_COLS = 8192  # rows at least this long: shorter ones fit one block a row well
# rows no more than this: measured to pay up to 256 (256 × 32,000 log_softmax in 17.7 µs against
# PyTorch's 22.7 on an H200), where one block a row cannot hold a row between its two passes
MAX_ROWS = 256
SLICE_COLS = (2048, 4096)  # columns a block of the first op takes, about (fastest on an H200)
MAX_SPLITS = 256
# a vocabulary of no such divisor (BERT's 30,522 = 6 · 5,087) takes the one nearest 4,096 in this range
FALLBACK_SLICE_COLS = (512, 8192)
THREADS = (128, 256)  # a block's threads (2,000-column slices ran fastest at 128, 4,000 at 256)


LOGSUMEXP, LOG_SOFTMAX, SOFTMAX = "logsumexp", "log_softmax", "softmax"
# the reference's ops after f, per form (the frontend's lowerings)
FORMS = {(Op.EXP, Op.REDUCTION, Op.LOG): LOGSUMEXP, (Op.EXP, Op.REDUCTION, Op.LOG, Op.SUB): LOG_SOFTMAX,
         (Op.EXP, Op.REDUCTION, Op.DIV): SOFTMAX}


@dataclass(frozen=True)
class RowLogSumExp:
    """A reference that is ``log Σ exp(f(x))`` over the last dim of a 2-D ``x`` (``f``: a chain of
    element-wise ops, unary or with another input, a mask or a bias added to the logits), ``f(x)``
    less it (log_softmax), or ``exp(f(x)) / Σ exp(f(x))``."""

    rows: int
    cols: int
    dtype: object
    chain: tuple[Node, ...]  # f, in order: each takes the one before it (or inputs) and inputs
    form: str  # LOGSUMEXP, LOG_SOFTMAX or SOFTMAX
    x: int = 0  # the input node f starts from, where the chain is empty
    chain_nodes: tuple[int, ...] = ()  # the chain's node indices

    @property
    def log_softmax(self) -> bool:
        return self.form == LOG_SOFTMAX


def broadcasts(shape: tuple[int, ...], rows: int, cols: int) -> bool:
    """Whether a tensor of ``shape`` is (rows, cols) or broadcast from a row or a column of it."""
    return len(shape) == 2 and shape[0] in (1, rows) and shape[1] in (1, cols)


def match(reference: KernelGraph) -> RowLogSumExp | None:
    """The pattern of ``reference``, or None."""
    nodes = reference.nodes
    inputs = set(reference.input_nodes)
    if not inputs or len(reference.outputs) != 1:
        return None
    body = [i for i in range(len(nodes)) if i not in inputs]
    exp = next((i for i in body if nodes[i].op is Op.EXP), None)
    if exp is None:
        return None
    chain = [i for i in body if i < exp]
    at = nodes[exp].inputs[0].node
    for k, i in enumerate(chain):  # a path: each node takes the one before it, and inputs besides
        node = nodes[i]
        operands = [r.node for r in node.inputs]
        if node.op not in UNARY | BINARY or node.op in (Op.EXP, Op.LOG):
            return None
        before = chain[k - 1] if k else None
        if any(o != before and o not in inputs for o in operands) or (k and before not in operands):
            return None
    if chain and at != chain[-1] or not chain and at not in inputs:
        return None
    x_type = nodes[at].outputs[0]
    if x_type.rank != 2 or any(not broadcasts(nodes[i].outputs[0].shape, *x_type.shape) for i in inputs):
        return None
    rest = [i for i in body if i > at]
    form = FORMS.get(tuple(nodes[i].op for i in rest))
    if form is None:
        return None
    exp_, reduction, last = (nodes[i] for i in rest[:3])
    first = rest[0]
    chained = (first == exp and reduction.inputs[0].node == first and reduction.attrs.dim == 1
               and [r.node for r in last.inputs] == ([rest[1]] if form != SOFTMAX else [first, rest[1]]))
    if form == LOG_SOFTMAX:
        chained = chained and [r.node for r in nodes[rest[3]].inputs] == [at, rest[2]]
    if not chained or reference.outputs[0].node != rest[-1]:
        return None
    return RowLogSumExp(x_type.shape[0], x_type.shape[1], x_type.dtype, tuple(nodes[i] for i in chain), form,
                        at if not chain else nodes[chain[0]].inputs[0].node, tuple(chain))


def candidates(reference: KernelGraph) -> list[KernelGraph]:
    """Split-row µGraphs for ``reference`` (none where it is no long-row logsumexp, log_softmax or
    softmax)."""
    found = match(reference)
    if found is None or found.cols < MIN_COLS or found.rows > MAX_ROWS:
        return []
    return [split_graph(reference, found, s, t) for s in split_counts(found.cols, found.rows)
            for t in THREADS]


def split_counts(cols: int, rows: int = 1) -> list[int]:
    """How many slices a row of ``cols`` is cut into: for each size of :data:`SLICE_COLS`, the fewest
    equal slices of more than half that size and no more (a power of two or not: GPT-2's 50,257 is
    29 slices of 1,733); where neither size has one, the count whose slices come nearest 4,096 columns
    within :data:`FALLBACK_SLICE_COLS`; none where no count divides the row that way.  A grid of
    ``rows`` × count blocks stays within a kernel's blocks (the target's bound)."""
    most = min(MAX_SPLITS, DEFAULT_TARGET.max_blocks_per_kernel // rows)
    divisors = [s for s in range(2, most + 1) if cols % s == 0]
    found = [next((s for s in divisors if size // 2 < cols // s <= size), None) for size in SLICE_COLS]
    counts = [s for s in found if s is not None]
    if not counts:
        low, high = FALLBACK_SLICE_COLS
        near = sorted((abs(cols // s - SLICE_COLS[-1]), s) for s in divisors if low <= cols // s <= high)
        counts = [near[0][1]] if near else []
    return counts


def _lowest(dtype) -> float:
    """The lowest finite value of ``dtype`` that float32 (the kernels' arithmetic) holds too."""
    return -65504.0 if dtype is mi.float16 else -3.38e38


TILE_MAPS = {(True, True): (0, 1, -1), (True, False): (0, -1, -1), (False, True): (-1, 1, -1),
             (False, False): (-1, -1, -1)}  # a tile's input map by (one a row, one a column)


def broadcast_map(rows: int, cols: int) -> tuple[int, int, int]:
    """The input map of a tile of a (rows, cols) tensor on a grid of (rows, slices) blocks."""
    return TILE_MAPS[rows > 1, cols > 1]


def read_tile(tb, reference: KernelGraph, i: int, inputs: dict, tiles: dict, read: list,
              map_of=broadcast_map):
    """Node ``i``'s tile in block graph ``tb``: from ``tiles``, or, an input of ``reference``, read once
    by its input map (``map_of`` its shape) and its kernel tensor appended to ``read``, the
    graph-defined op's inputs."""
    if i not in tiles:
        tiles[i] = tb.new_input(inputs[i], input_map=map_of(*reference.nodes[i].outputs[0].shape))
        read.append(inputs[i])
    return tiles[i]


def apply_nodes(tb, reference: KernelGraph, nodes, inputs: dict, tiles: dict, read: list,
                map_of=broadcast_map):
    """``reference``'s nodes ``nodes`` copied into ``tb`` in order (an input read as :func:`read_tile`
    reads it, as are the other nodes' operands); the last one's tile."""
    made = None
    for i in nodes:
        node = reference.nodes[i]
        if node.op is Op.INPUT:
            made = read_tile(tb, reference, i, inputs, tiles, read, map_of)
            continue
        operands = [read_tile(tb, reference, r.node, inputs, tiles, read, map_of) for r in node.inputs]
        tiles[i] = made = tb.apply(node.op, operands, node.attrs)
    return made


def _chain(tb, reference: KernelGraph, found: RowLogSumExp, inputs: dict, read: list):
    """f(x) in block graph ``tb``, each input the chain takes read once as a tile of its broadcast."""
    tiles: dict = {}
    x = read_tile(tb, reference, found.x, inputs, tiles, read)
    return apply_nodes(tb, reference, found.chain_nodes, inputs, tiles, read) if found.chain_nodes else x


def split_graph(reference: KernelGraph, found: RowLogSumExp, splits: int, threads: int) -> KernelGraph:
    """The two graph-defined ops of the module docstring, ``splits`` slices a row."""
    g = mi.new_kernel_graph("split_rows")
    inputs = {i: g.new_input(reference.nodes[i].outputs[0].shape, reference.nodes[i].outputs[0].dtype)
              for i in reference.input_nodes}
    t1 = mi.new_threadblock_graph(grid_dim=(found.rows, splits, 1), block_dim=(threads, 1, 1),
                                  forloop_range=1)
    first: list = []
    x1 = _chain(t1, reference, found, inputs, first)
    # a slice all −inf (a vocabulary's masked or padded tail) keeps exp(x − m) = 0, not NaN; for a
    # logsumexp a +inf logit keeps exp(x − m) = inf, so the row's is inf as PyTorch's (its softmaxes
    # are NaN there, as x − m = NaN makes them)
    ceiling = -_lowest(found.dtype) if found.form == LOGSUMEXP else math.inf
    m = t1.clamp(t1.reduction_max(x1, 1), _lowest(found.dtype), ceiling)
    t1.new_output(t1.forloop_accum(m), output_map=(0, 1, -1))
    t1.new_output(t1.forloop_accum(t1.reduction(t1.exp(t1.sub(x1, m)), 1)), output_map=(0, 1, -1))
    maxima, partials = g.customized(first, t1)  # [rows, splits] each
    whole = found.form != LOGSUMEXP  # the second op writes every value of the row, not one a row
    grid = (found.rows, splits if whole else 1, 1)
    t2 = mi.new_threadblock_graph(grid_dim=grid, block_dim=(threads if whole else 128, 1, 1),
                                  forloop_range=1)
    bm = t2.new_input(maxima, input_map=(0, -1, -1))
    bp = t2.new_input(partials, input_map=(0, -1, -1))
    top = t2.reduction_max(bm, 1)
    lse = t2.add(t2.log(t2.reduction(t2.mul(bp, t2.exp(t2.sub(bm, top))), 1)), top)
    if whole:
        second = [maxima, partials]
        shifted = t2.sub(_chain(t2, reference, found, inputs, second), lse)
        t2.new_output(t2.forloop_accum(shifted if found.log_softmax else t2.exp(shifted)),
                      output_map=(0, 1, -1))
        (out,) = g.customized(second, t2)
    else:
        t2.new_output(t2.forloop_accum(lse), output_map=(0, -1, -1))
        (out,) = g.customized([maxima, partials], t2)
    g.mark_output(out)
    return g.freeze()
