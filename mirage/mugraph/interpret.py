"""One interpreter for every level, over any algebra.

The block level follows mirage-notes §1.3 exactly: every block of the grid runs the block graph;
input iterators hand each block, at each for-loop iteration r, the tile at offset
``off[d] = b_a`` (for the grid axis a mapped to d), ``off[f] = off[f]·R + r`` for the for-loop dim f
(block-major, then iteration); ops whose inputs are before the accumulators run every iteration;
accumulators carry state; ops after the accumulators run once; output savers write each block's
tile at ``off[d] = b_a · tile[d]``.

All blocks run at once: values in a block graph carry three leading grid axes (of size 1 where the
value is the same for every block along that axis), so one numpy call covers the whole grid.

>>> import numpy as np, mirage as mi
>>> g = mi.new_kernel_graph()
>>> x = g.new_input(dims=(2, 4), dtype=mi.float32)
>>> g.mark_output(g.reduction(g.exp(x), 1))
>>> out, = mi.interpret(g, [np.zeros((2, 4))])
>>> out.ravel().tolist()
[4.0, 4.0]
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from mirage.errors import InterpretError, OverlapError
from mirage.mugraph.algebra import Algebra, FloatAlgebra
from mirage.mugraph.graph import (
    Accum,
    AccumKind,
    BlockGraph,
    Dim3,
    InputIterator,
    KernelGraph,
    OutputSaver,
    ThreadGraph,
)
from mirage.mugraph.ops import REGISTRY, RUNNING_MAX_FLOOR, Op, reduce_to_dimx


def _uneven_rows(span: int, blocks: int) -> np.ndarray:
    """The entries each block of an uneven axis reads, block after block (``blocks · tile`` indices)."""
    from mirage.mugraph.build import tile_extent, tile_start

    extent = tile_extent(span, blocks, span)
    return np.concatenate([np.arange(extent) + tile_start(b, extent, span) for b in range(blocks)])


def tile_view(source: np.ndarray, iterator: InputIterator, grid: Dim3, forloop_range: int,
              spans: Dim3 = (0, 0, 0)) -> np.ndarray:
    """All tiles of ``source`` as one array ``[gx, gy, gz, R, *tile]`` (size 1 where replicated)."""
    mapped = {d: a for a, d in enumerate(iterator.input_map) if d >= 0 and grid[a] > 1}
    for d, a in mapped.items():
        if spans[a]:  # the tiles of an uneven axis, the last one overlapping, side by side
            source = np.take(source, _uneven_rows(spans[a], grid[a]), axis=d)
    shape = source.shape
    split: list[int] = []
    for d, size in enumerate(shape):
        g = grid[mapped[d]] if d in mapped else 1
        r = forloop_range if d == iterator.forloop_dim else 1
        split += [g, r, size // (g * r)]
    view = source.reshape(split)
    axis_of_grid = {a: 3 * d for d, a in mapped.items()}
    order = [axis_of_grid.get(a) for a in range(3)]
    order.append(3 * iterator.forloop_dim + 1 if iterator.forloop_dim >= 0 else None)
    order += [3 * d + 2 for d in range(len(shape))]
    used = [i for i in order if i is not None]
    unused = [i for i in range(len(split)) if i not in used]
    final = [view.shape[i] if i is not None else 1 for i in order]
    return view.transpose(used + unused).reshape(final)


def assemble(tiles: np.ndarray, saver: OutputSaver, grid: Dim3, spans: Dim3 = (0, 0, 0),
             check: bool = True) -> np.ndarray:
    """Place each block's tile ``tiles[bx, by, bz]`` in the output tensor (mirage-notes §1.3).  Along an
    uneven axis the last block's tile overlaps the one before it; both must hold the same values
    there (with ``check``, else :class:`~mirage.errors.OverlapError`), and the result keeps the last
    block's."""
    tiles = np.broadcast_to(tiles, tuple(grid) + tiles.shape[3:])
    rank = tiles.ndim - 3
    axis_of_dim = {d: a for a, d in enumerate(saver.output_map) if d >= 0}
    order: list[int] = []
    out_shape: list[int] = []
    for d in range(rank):
        size = tiles.shape[3 + d]
        if d in axis_of_dim:
            order.append(axis_of_dim[d])
            size *= grid[axis_of_dim[d]]
        order.append(3 + d)
        out_shape.append(size)
    order += [a for a in range(3) if a not in order]
    full = tiles.transpose(order).reshape(out_shape)
    for d, a in axis_of_dim.items():
        if spans[a]:
            full = _overlap(full, d, spans[a], grid[a], check)
    return full


def _overlap(full: np.ndarray, d: int, span: int, blocks: int, check: bool) -> np.ndarray:
    """``full`` (the tiles of an uneven axis side by side along dim ``d``) as the ``span`` entries they
    cover, after checking that the last two tiles agree where they overlap."""
    extent = full.shape[d] // blocks
    last = (blocks - 1) * extent  # where the last tile lies in ``full``
    start = span - extent  # and where it starts in the output
    shared = (blocks - 1) * extent - start
    before = np.take(full, np.arange(start, start + shared), axis=d)
    after = np.take(full, np.arange(last, last + shared), axis=d)
    if check and not _same(before, after):
        raise OverlapError(f"the last two blocks of an uneven axis (span {span}, {blocks} blocks) compute "
                           f"different values for the {shared} entries they share along dim {d}: the block "
                           "graph mixes entries along that dim (a reduction or a product over it)")
    keep = np.concatenate([np.arange(start), np.arange(last, last + extent)])
    return np.take(full, keep, axis=d)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype.kind != "f":
        return bool(np.array_equal(a, b))
    scale = float(np.nanmax(np.abs(a), initial=0.0)) if a.size else 0.0
    return bool(np.allclose(a, b, rtol=1e-5, atol=1e-5 * scale, equal_nan=True))


class Interpreter:
    """Runs kernel, block and thread graphs over an :class:`~mirage.mugraph.algebra.Algebra`."""

    def __init__(self, algebra: Algebra) -> None:
        self.algebra = algebra

    def run(self, graph: KernelGraph, inputs: Sequence[Any]) -> list[Any]:
        types = graph.input_types
        if len(inputs) != len(types):
            raise InterpretError(f"the graph takes {len(types)} inputs, got {len(inputs)}")
        for i, (value, t) in enumerate(zip(inputs, types, strict=True)):
            if tuple(self.algebra.shape(value)) != t.shape:
                raise InterpretError(f"input {i} has shape {list(self.algebra.shape(value))}, "
                                     f"the graph expects {list(t.shape)}")
        values: dict[tuple[int, int], Any] = {}
        feed = iter(inputs)
        for i, node in enumerate(graph.nodes):
            args = [values[(r.node, r.index)] for r in node.inputs]
            if node.op is Op.INPUT:
                outs = [next(feed)]
            elif node.op is Op.CUSTOMIZED:
                outs = self.run_block(node.attrs, args)
            else:
                outs = [self.apply(node, graph.operand_types(node), args)]
            for j, v in enumerate(outs):
                values[(i, j)] = v
        return [values[(r.node, r.index)] for r in graph.outputs]

    def apply(self, node, in_types, args):
        row = REGISTRY[node.op]
        if node.op is Op.FUSED:
            return self.run_thread(node.attrs, args)
        if node.op is Op.REDUCTION_TO_DIMX:  # its size comes from the block graph: read the output
            dim = node.attrs.dim
            return reduce_to_dimx(self.algebra, args[0], dim - in_types[0].rank, node.outputs[0].shape[dim])
        if row.formula is None:
            raise InterpretError(f"op {node.op.value} has no formula at this level")
        return row.formula(self.algebra, node.attrs, in_types, *args)

    def run_thread(self, graph: ThreadGraph, args: Sequence[Any]) -> Any:
        values: dict[tuple[int, int], Any] = {}
        for i, node in enumerate(graph.nodes):
            if node.op is Op.INPUT:
                values[(i, 0)] = args[node.attrs.index]
            else:
                ins = [values[(r.node, r.index)] for r in node.inputs]
                values[(i, 0)] = self.apply(node, graph.operand_types(node), ins)
        (out,) = graph.outputs
        return values[(out.node, out.index)]

    def run_block(self, graph: BlockGraph, args: Sequence[Any]) -> list[Any]:
        A = self.algebra
        grid, R = graph.grid_dim, graph.forloop_range
        tiles = {}
        for k, i in enumerate(graph.input_nodes):
            it = graph.nodes[i].attrs
            tiles[i] = A.structural(lambda s, it=it: tile_view(s, it, grid, R, graph.spans), args[k])
        body = [i for i, n in enumerate(graph.nodes) if n.op is not Op.OUTPUT and
                not n.outputs[0].after_accum]
        after = [i for i, n in enumerate(graph.nodes) if n.op is not Op.OUTPUT and
                 n.outputs[0].after_accum and n.op not in (Op.ACCUM, Op.ACCUM_RESCALE)]
        accums = [i for i, n in enumerate(graph.nodes) if n.op in (Op.ACCUM, Op.ACCUM_RESCALE)]
        state: dict[int, Any] = {}
        previous_max: dict[int, Any] = {}
        values: dict[tuple[int, int], Any] = {}
        for r in range(R):
            for i in body + accums:
                node = graph.nodes[i]
                ins = [values[(x.node, x.index)] for x in node.inputs]
                if node.op is Op.INPUT:
                    rr = r if A.shape(tiles[i])[3] > 1 else 0
                    values[(i, 0)] = A.structural(lambda t, rr=rr: t[:, :, :, rr], tiles[i])
                elif node.op is Op.RUNNING_MAX:
                    start = state[i] if i in state else A.const(RUNNING_MAX_FLOOR, ins[0])
                    state[i] = A.maximum(start, ins[0])
                    values[(i, 0)] = state[i]
                elif node.op is Op.ACCUM:
                    term = self._accum_term(node.attrs, ins[0], graph.reduction_dimx)
                    if i not in state:
                        state[i] = term
                    elif node.attrs.kind is AccumKind.MAX:
                        state[i] = A.maximum(state[i], term)
                    else:
                        state[i] = A.add(state[i], term)
                elif node.op is Op.ACCUM_RESCALE:
                    term = self._accum_term(node.attrs, ins[0], graph.reduction_dimx)
                    m = ins[1]
                    if i in state:
                        scale = A.exp(A.sub(previous_max[i], m))
                        state[i] = A.add(A.mul(state[i], scale), term)
                    else:
                        state[i] = term
                    previous_max[i] = m
                else:
                    values[(i, 0)] = self.apply(node, graph.operand_types(node), ins)
        for i in accums:
            node = graph.nodes[i]
            values[(i, 0)] = self._accum_final(node.attrs, state[i], graph.operand_types(node)[0], R)
        for i in after:
            node = graph.nodes[i]
            ins = [values[(x.node, x.index)] for x in node.inputs]
            values[(i, 0)] = self.apply(node, graph.operand_types(node), ins)
        outs = []
        for i in graph.output_nodes:
            node = graph.nodes[i]
            (src,) = node.inputs
            value = values[(src.node, src.index)]
            # algebras of values (not of terms or bounds) check that overlapping tiles agree
            check = getattr(A, "concrete", False)
            outs.append(A.structural(lambda t, s=node.attrs, c=check: assemble(t, s, grid, graph.spans, c),
                                     value))
        return outs

    def _accum_term(self, attrs: Accum, x, dimx: int):
        A = self.algebra
        match attrs.kind:
            case AccumKind.NONE | AccumKind.MAX:
                return x
            case AccumKind.SUM | AccumKind.MEAN:
                return A.sum(x, axis=-1)
            case AccumKind.RMS:
                return A.sum(A.mul(x, x), axis=-1)
            case AccumKind.SUM_TODIMX:
                return reduce_to_dimx(A, x, -1, dimx)
        raise InterpretError(f"unknown accumulator kind {attrs.kind}")

    def _accum_final(self, attrs: Accum, acc, in_type, forloop_range: int):
        A = self.algebra
        n = forloop_range * in_type.shape[-1]
        match attrs.kind:
            case AccumKind.MEAN:
                return A.mul(acc, A.const(Fraction(1, n), acc))
            case AccumKind.RMS:
                mean = A.mul(acc, A.const(Fraction(1, n), acc))
                if attrs.eps:
                    mean = A.add(mean, A.const(Fraction(attrs.eps), acc))
                return A.sqrt(mean)
        return acc


def interpret(graph, inputs: Sequence[Any], dtype: type = np.float64) -> list[np.ndarray]:
    """Run ``graph`` on the CPU in ``dtype`` (float32 or float64); inputs may be numpy or torch."""
    from mirage.mugraph.builder import as_graph

    graph = as_graph(graph)
    if not _float_dtype(dtype):
        raise InterpretError(f"interpret runs in a floating-point dtype (np.float64, the default, or "
                             f"np.float32), got dtype={dtype!r}")
    if isinstance(inputs, (str, bytes)) or not hasattr(inputs, "__iter__"):
        raise InterpretError(f"interpret takes a list of the graph's inputs (numpy arrays or torch tensors), "
                             f"got {type(inputs).__name__}")
    arrays = []
    for i, x in enumerate(inputs):
        if hasattr(x, "detach"):
            if x.is_complex():
                raise InterpretError(f"input {i} is a complex tensor ({x.dtype}); the graph computes on real "
                                     "numbers: pass its real part (x.real) if that is what you mean")
            x = x.detach().cpu().double().numpy()
        try:
            array = np.asarray(x)
        except (ValueError, TypeError) as error:  # a ragged nested list
            raise InterpretError(f"input {i} is not an array: {error}") from None
        if array.dtype.kind == "c":
            raise InterpretError(f"input {i} is a complex array ({array.dtype}); the graph computes on real "
                                 "numbers: pass its real part (x.real) if that is what you mean")
        if array.dtype.kind not in "biuf":
            raise InterpretError(f"input {i} holds {array.dtype} values, not numbers; pass a numpy array or "
                                 "torch tensor of floats")
        arrays.append(array.astype(dtype, copy=False))
    outs = Interpreter(FloatAlgebra(dtype)).run(graph, arrays)
    return [np.asarray(o, dtype=dtype) for o in outs]


def _float_dtype(dtype) -> bool:
    try:
        return np.dtype(dtype).kind == "f"
    except TypeError:
        return False
