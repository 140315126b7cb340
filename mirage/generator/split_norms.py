"""Split-row µGraphs for a norm over long rows: a group norm, an instance norm, a long ``rms_norm``.

Stable Diffusion's ``GroupNorm(32, 320)`` over 64 × 64 latents normalizes 64 rows of 40,960 values
(:func:`mirage.frontend.decompositions.group_norm` writes it as a mean, the centred values'
``rms_norm`` and the channels' gain and bias).  A row is 80 KB in float16: no block's shared memory
holds it, and ``rms_norm``, one op of the reference, is no sum the search can split across blocks, so
the search finds nothing and PyTorch's group norm (one block a group: 64 of 132 SMs) takes 32 µs on an
H200.  What such rows take is the split reduction of :mod:`mirage.generator.split_rows`, written for
a row's mean and variance:

* a first graph-defined op of (rows, splits) blocks saves each slice's mean ``mᵢ`` and its variance
  about that mean ``vᵢ`` (summed in float32 and divided by the slice's length before a float16
  partial holds them);
* a second of (rows, splits) blocks combines a row's partials as Chan's parallel variance does,
  ``m = mean mᵢ`` and ``var = mean vᵢ + mean (mᵢ − m)²`` (equal slices), and writes its slice of
  ``(x − m) / √(var + eps)`` through the reference's element-wise ops after the norm (the gain, the
  bias, a SiLU).

An uncentred ``rms_norm`` saves ``mean x²`` a slice and needs no mean.  Like the split-row softmaxes,
the frontend float-checks these µGraphs against the reference (finite fields cannot take a square
root) and profile-guided selection times them beside the search's.

>>> import mirage as mi
>>> g = mi.new_kernel_graph()
>>> x = g.new_input((64, 40960), mi.float16)
>>> mean = g.mul_scalar(g.reduction(x, 1), 1 / 40960)
>>> g.mark_output(g.silu(g.rms_norm(g.sub(x, mean), eps=1e-5)))
>>> [b.grid_dim for b in candidates(g.freeze())[0].block_graphs()]
[(64, 20, 1), (64, 20, 1)]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mirage as mi
from mirage.generator.split_rows import MAX_ROWS, MIN_COLS, THREADS, apply_nodes, broadcasts, split_counts
from mirage.mugraph.graph import KernelGraph
from mirage.mugraph.ops import BINARY, UNARY, Op


@dataclass(frozen=True)
class RowNorm:
    """A reference that normalizes each row of its 2-D input ``x`` (centred first, or not) and passes
    the result through element-wise ops (``tail``) that may read other inputs."""

    rows: int
    cols: int
    dtype: object
    x: int  # x's node
    centered: bool
    eps: float
    norm: int  # the rms_norm's node
    tail: tuple[int, ...]  # the element-wise nodes after it, in order; the last is the output


def match(reference: KernelGraph) -> RowNorm | None:
    """The pattern of ``reference``, or None."""
    nodes = reference.nodes
    if len(reference.outputs) != 1:
        return None
    body = [i for i, n in enumerate(nodes) if n.op is not Op.INPUT]
    norms = [i for i in body if nodes[i].op is Op.RMS_NORM]
    if len(norms) != 1:
        return None
    norm = norms[0]
    before = [i for i in body if i < norm]
    source = nodes[norm].inputs[0].node
    centered = bool(before)
    if centered:  # reduction(x), mul_scalar(1 / cols), sub(x, mean)
        if [nodes[i].op for i in before] != [Op.REDUCTION, Op.MUL_SCALAR, Op.SUB]:
            return None
        reduction, scale, sub = before
        x = nodes[reduction].inputs[0].node
        if (source != sub or nodes[reduction].attrs.dim != 1 or nodes[scale].inputs[0].node != reduction
                or [r.node for r in nodes[sub].inputs] != [x, scale]):
            return None
    else:
        x = source
    x_type = nodes[x].outputs[0]
    if nodes[x].op is not Op.INPUT or x_type.rank != 2:
        return None
    rows, cols = x_type.shape
    if centered and not math.isclose(nodes[before[1]].attrs.value, 1 / cols, rel_tol=1e-6):
        return None
    tail = tuple(i for i in body if i > norm)
    made = {norm, *reference.input_nodes}
    for i in tail:
        node = nodes[i]
        if node.op not in UNARY | BINARY or any(r.node not in made for r in node.inputs):
            return None
        if node.outputs[0].shape != (rows, cols):
            return None
        made.add(i)
    if reference.outputs[0].node != (tail[-1] if tail else norm):
        return None
    if any(not broadcasts(nodes[i].outputs[0].shape, rows, cols) for i in reference.input_nodes):
        return None
    return RowNorm(rows, cols, x_type.dtype, x, centered, float(nodes[norm].attrs.eps), norm, tail)


def one_block_bytes(reference: KernelGraph, found: RowNorm) -> int:
    """The shared memory the search's one-block form of ``reference`` takes by its estimate (every
    tensor its own buffer): a row of each input and op that holds one."""
    return sum(found.cols * n.outputs[0].dtype.itemsize for n in reference.nodes
               if n.outputs and n.outputs[0].shape[-1] == found.cols)


def candidates(reference: KernelGraph) -> list[KernelGraph]:
    """Split-row µGraphs for ``reference`` (none where it is no long-row norm): rows of
    :data:`MIN_COLS` or more, and shorter ones whose one-block form the search cannot hold (a
    LayerNorm with its gain and bias over rows of 8,000: 112 KB against the space's 96)."""
    from mirage.generator.space import CONFIGS

    found = match(reference)
    if found is None or found.rows > MAX_ROWS:
        return []
    if found.cols < MIN_COLS and one_block_bytes(reference, found) <= CONFIGS["mlp"].shared_memory_bytes:
        return []
    return [split_graph(reference, found, s, t) for s in split_counts(found.cols, found.rows)
            for t in THREADS]


def split_graph(reference: KernelGraph, found: RowNorm, splits: int, threads: int) -> KernelGraph:
    """The two graph-defined ops of the module docstring, ``splits`` slices a row."""
    g = mi.new_kernel_graph("split_norm")
    inputs = {i: g.new_input(reference.nodes[i].outputs[0].shape, reference.nodes[i].outputs[0].dtype)
              for i in reference.input_nodes}
    x = inputs[found.x]
    n = found.cols // splits
    t1 = mi.new_threadblock_graph(grid_dim=(found.rows, splits, 1), block_dim=(threads, 1, 1),
                                  forloop_range=1)
    xt = t1.new_input(x, input_map=(0, 1, -1))
    if found.centered:
        m = t1.mul_scalar(t1.reduction(xt, 1), 1 / n)
        t1.new_output(t1.forloop_accum(m), output_map=(0, 1, -1))
        xt = t1.sub(xt, m)
    # the sums run in float32 registers and are scaled there (the reduction's epilogue) before a
    # float16 partial holds them
    t1.new_output(t1.forloop_accum(t1.mul_scalar(t1.reduction(t1.square(xt), 1), 1 / n)),
                  output_map=(0, 1, -1))
    partials = g.customized([x], t1)  # [rows, splits] each: (means,) variances
    t2 = mi.new_threadblock_graph(grid_dim=(found.rows, splits, 1), block_dim=(threads, 1, 1),
                                  forloop_range=1)
    whole = [t2.new_input(p, input_map=(0, -1, -1)) for p in partials]  # a row's partials, each block
    variance = t2.mul_scalar(t2.reduction(whole[-1], 1), 1 / splits)
    value = t2.new_input(x, input_map=(0, 1, -1))
    read, tiles = [x], {found.x: value}  # x's tile serves the tail too (a residual add)
    if found.centered:
        mean = t2.mul_scalar(t2.reduction(whole[0], 1), 1 / splits)
        spread = t2.mul_scalar(t2.reduction(t2.square(t2.sub(whole[0], mean)), 1), 1 / splits)
        variance = t2.add(variance, spread)
        value = t2.sub(value, mean)
    tiles[found.norm] = t2.div(value, t2.sqrt(t2.add_scalar(variance, found.eps)))
    apply_nodes(t2, reference, found.tail, inputs, tiles, read)  # each input of the tail read once
    last = found.tail[-1] if found.tail else found.norm
    t2.new_output(t2.forloop_accum(tiles[last]), output_map=(0, 1, -1))
    (out,) = g.customized([*partials, *read], t2)
    g.mark_output(out)
    return g.freeze()

