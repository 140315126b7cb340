"""Pure graph construction: compute a new node's output types and append it.

These functions are what the builder API and the search use to grow graphs.  Each returns a new
graph (graphs are immutable) and raises a specific :class:`~mirage.errors.GraphError` when the op
does not fit its operands.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

from mirage.errors import (
    ArityError,
    DivisibilityError,
    ForloopDimError,
    GraphError,
    InputMapError,
    LevelError,
    OutputMapError,
)
from mirage.mugraph.graph import (
    Accum,
    BlockGraph,
    Clamp,
    Dim3,
    InputIterator,
    Level,
    Node,
    OutputSaver,
    Ref,
    RmsNorm,
    Scalar,
    TensorType,
)
from mirage.mugraph.ops import REGISTRY, Op, ShapeContext


def shape_context(graph) -> ShapeContext:
    if isinstance(graph, BlockGraph):
        return ShapeContext(Level.BLOCK, graph.forloop_range, graph.reduction_dimx)
    return ShapeContext(graph.level)


def infer(graph, op: Op, inputs: tuple[Ref, ...], attrs: Any) -> tuple[TensorType, ...]:
    """Output types of ``op`` applied to ``inputs`` of ``graph`` (raises GraphError if invalid)."""
    row = REGISTRY[op]
    if graph.level not in row.levels:
        levels = ", ".join(sorted(level.value for level in row.levels))
        raise LevelError(f"op {op.value} does not exist at the {graph.level.value} level "
                         f"(it exists at: {levels})")
    if row.arity is not None and len(inputs) != row.arity:
        raise ArityError(f"op {op.value} takes {row.arity} inputs, got {len(inputs)}")
    if row.attrs_type is not None and not isinstance(attrs, row.attrs_type):
        from mirage.errors import AttributeValueError

        raise AttributeValueError(f"op {op.value} needs attributes of type {row.attrs_type.__name__}, "
                                  f"got {type(attrs).__name__}")
    if isinstance(attrs, Scalar) and not math.isfinite(attrs.value):
        # inf · 0 and inf − inf have no value in the verifier's exact arithmetic, and a NaN scalar
        # equals nothing, not even its own graph read back (builder and graph files alike)
        from mirage.errors import AttributeValueError

        raise AttributeValueError(f"{op.value}'s scalar must be finite, got {attrs.value!r}: keep such a "
                                  "constant in PyTorch, or use clamp for a bound")
    _check_numbers(op, attrs)
    for r in inputs:
        if not (0 <= r.node < len(graph.nodes) and 0 <= r.index < len(graph.nodes[r.node].outputs)):
            from mirage.errors import BindingError

            raise BindingError(f"op {op.value} refers to a tensor %{r.node}.{r.index} that does not exist")
    types = tuple(graph.type_of(r) for r in inputs)
    return row.shape(shape_context(graph), types, attrs)


def _real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_numbers(op: Op, attrs: Any) -> None:
    """The numbers of an op's attributes, wherever the graph comes from (builder, text, JSON): an
    epsilon is a finite number (its exact value enters the verifier's arithmetic, which has no inf or
    NaN), a clamp bound a number that is not NaN (±inf leaves that side open)."""
    from mirage.errors import AttributeValueError

    if isinstance(attrs, (RmsNorm, Accum)) and not (_real(attrs.eps) and math.isfinite(attrs.eps)):
        raise AttributeValueError(f"{op.value}'s eps must be a finite number, got {attrs.eps!r}; use a small "
                                  "positive value such as 1e-6, or 0.0 for none")
    if isinstance(attrs, Clamp):
        for side in ("min", "max"):
            value = getattr(attrs, side)
            if not _real(value) or math.isnan(value):
                raise AttributeValueError(f"clamp's {side} must be a number (±inf for no bound on that "
                                          f"side), got {value!r}")


def append(graph, op: Op, inputs: tuple[Ref, ...] = (), attrs: Any = None,
           outputs: tuple[TensorType, ...] | None = None):
    """A copy of ``graph`` with one more node; returns ``(graph, node_index)``."""
    if outputs is None:
        outputs = infer(graph, op, tuple(inputs), attrs)
    node = Node(op, tuple(inputs), attrs, tuple(outputs))
    return dataclasses.replace(graph, nodes=graph.nodes + (node,)), len(graph.nodes)


def tile_extent(size: int, blocks: int, span: int = 0) -> int:
    """A tile's extent along a dim of ``size`` that ``blocks`` blocks partition: ``size / blocks``, or
    ``ceil(span / blocks)`` on an uneven axis (``span``: the dim's size where the blocks do not divide it)."""
    return -(-span // blocks) if span else size // blocks


def starts_apart(span: int, blocks: int) -> bool:
    """Whether ``blocks`` blocks over an uneven span of ``span`` entries (two at least) each start at an
    entry of its own: ``ceil(span / blocks) · (blocks − 1) < span`` (else two would compute one tile)."""
    return blocks > 1 and -(-span // blocks) * (blocks - 1) < span


def tile_start(block: int, extent: int, span: int = 0) -> int:
    """Where block ``block``'s tile starts along a partitioned dim: ``block · extent``, and on an uneven
    axis at most ``span - extent``, so that the last tile ends at the dim's end and overlaps the one
    before it (those blocks compute the overlapping entries twice, with the same values: the dim is
    never reduced inside the block)."""
    start = block * extent
    return min(start, span - extent) if span else start


def tile_shape(source: TensorType, input_map: Dim3, forloop_dim: int, grid: Dim3,
               forloop_range: int, spans: Dim3 = (0, 0, 0)) -> tuple[int, ...]:
    """The shape each block sees of ``source`` in one iteration (mirage-notes §1.3); ``spans`` as in
    :class:`~mirage.mugraph.graph.BlockGraph`."""
    shape = list(source.shape)
    seen: dict[int, int] = {}
    for axis, d in enumerate(input_map):
        if d < -1 or d >= len(shape):
            raise InputMapError(f"input_map {tuple(input_map)}: axis {'xyz'[axis]} maps to dim {d}, "
                                f"but the tensor has {len(shape)} dims (use -1 to replicate)")
        if d >= 0 and grid[axis] > 1:
            if d in seen:
                raise InputMapError(f"input_map {tuple(input_map)} maps grid axes "
                                    f"{'xyz'[seen[d]]} and {'xyz'[axis]} to the same dim {d}")
            seen[d] = axis
            span = spans[axis]
            if span and shape[d] != span:
                raise DivisibilityError(f"grid axis {'xyz'[axis]} spans {span} entries unevenly, but dim {d} "
                                        f"it maps has size {shape[d]} (every tensor split along an uneven "
                                        "axis has the span's size there)")
            if not span and shape[d] % grid[axis]:
                raise DivisibilityError(f"dim {d} of size {shape[d]} is not divisible by grid "
                                        f"axis {'xyz'[axis]} = {grid[axis]} (give the block graph spans "
                                        f"with {shape[d]} on that axis for tiles that overlap at the end)")
            if d == forloop_dim and span:
                raise ForloopDimError(f"dim {d} is split unevenly by grid axis {'xyz'[axis]}; the for-loop "
                                      "cannot also step it")
            shape[d] = tile_extent(shape[d], grid[axis], span)
    if forloop_dim != -1:
        if not 0 <= forloop_dim < len(shape):
            raise ForloopDimError(f"forloop_dim {forloop_dim} is out of range for a "
                                  f"{len(shape)}-dim tensor (use -1 for no split)")
        if shape[forloop_dim] % forloop_range:
            raise DivisibilityError(f"dim {forloop_dim} of the tile has size {shape[forloop_dim]}, not "
                                    f"divisible by forloop_range={forloop_range}")
        shape[forloop_dim] //= forloop_range
    return tuple(shape)


def output_shape(tile: TensorType, output_map: Dim3, grid: Dim3,
                 spans: Dim3 = (0, 0, 0)) -> tuple[int, ...]:
    shape = list(tile.shape)
    used: set[int] = set()
    for axis, d in enumerate(output_map):
        if (grid[axis] > 1) != (d >= 0):
            what = "needs an output_map dim" if grid[axis] > 1 else "must have output_map -1"
            raise OutputMapError(f"output_map {tuple(output_map)}: grid axis {'xyz'[axis]} = "
                                 f"{grid[axis]} {what} (blocks must write disjoint regions)")
        if d >= 0:
            if d >= len(shape) or d in used:
                raise OutputMapError(f"output_map {tuple(output_map)}: dim {d} is out of range or "
                                     "used twice")
            used.add(d)
            span = spans[axis]
            if span and shape[d] != tile_extent(span, grid[axis], span):
                raise OutputMapError(f"output_map {tuple(output_map)}: grid axis {'xyz'[axis]} spans {span} "
                                     f"entries unevenly in tiles of {tile_extent(span, grid[axis], span)}, "
                                     f"but the saved tile has {shape[d]} along dim {d}")
            shape[d] = span if span else shape[d] * grid[axis]
    return tuple(shape)


def add_input_iterator(graph: BlockGraph, source: TensorType, input_map: Dim3 = (-1, -1, -1),
                       forloop_dim: int = -1):
    tile = tile_shape(source, tuple(input_map), forloop_dim, graph.grid_dim, graph.forloop_range, graph.spans)
    attrs = InputIterator(dataclasses.replace(source, after_accum=False), tuple(input_map), forloop_dim)
    return append(graph, Op.INPUT, (), attrs, (TensorType(tile, source.dtype),))


def add_output_saver(graph: BlockGraph, tensor: Ref, output_map: Dim3 = (-1, -1, -1),
                     forloop_dim: int = -1):
    from mirage.errors import AfterAccumError

    tile = graph.type_of(tensor)
    if not tile.after_accum:
        raise AfterAccumError("an output saver's input must come after a for-loop accumulator "
                              "(wrap it in forloop_accum)")
    if forloop_dim != -1:
        raise ForloopDimError("output savers take forloop_dim=-1 (outputs are written once, after the "
                              "loop)")
    shape = output_shape(tile, tuple(output_map), graph.grid_dim, graph.spans)
    saver = OutputSaver(tuple(output_map), forloop_dim)
    return append(graph, Op.OUTPUT, (tensor,), saver, (TensorType(shape, tile.dtype),))


def add_customized(graph, inputs: tuple[Ref, ...], block: BlockGraph):
    from mirage.errors import BindingError

    sources = block.source_types
    if len(sources) != len(inputs):
        raise BindingError(f"the block graph has {len(sources)} input iterators but the graph-defined "
                           f"op got {len(inputs)} inputs")
    for k, (r, src) in enumerate(zip(inputs, sources, strict=True)):
        t = graph.type_of(r)
        if (t.shape, t.dtype) != (src.shape, src.dtype):
            raise BindingError(f"input {k}: the tensor is {t.dtype.short}{list(t.shape)} but the block "
                               f"graph's input iterator {k} reads {src.dtype.short}{list(src.shape)}")
    if not block.output_nodes:
        raise BindingError("the block graph has no output savers")
    return append(graph, Op.CUSTOMIZED, tuple(inputs), block, block.result_types)


def rethrow(error: GraphError, graph, node_index: int | None, extra_line: str | None = None):
    """Re-raise ``error`` with the node's name and the surrounding text-form lines."""
    from mirage.mugraph.text import context_lines

    context = context_lines(graph, node_index, extra_line)
    node = f"%{node_index}" if node_index is not None else None
    raise type(error)(error.args[0].split("\n")[0] if error.node is None else str(error),
                      node=node, context=context) from None
