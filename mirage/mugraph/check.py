"""Structural checks of graphs (Definition 2.1 of the paper, plus map legality).

``check(graph)`` runs on every graph a user builds, loads or parses.  Each failure raises a
specific :class:`~mirage.errors.GraphError` subclass whose message names the node and shows the
neighbouring lines of the text form.
"""

from __future__ import annotations

import dataclasses
import numbers

from mirage.errors import (
    BindingError,
    DanglingTensorError,
    GraphError,
    GridError,
    LevelError,
    SharedMemoryError,
)
from mirage.mugraph import build
from mirage.mugraph.graph import BlockGraph, KernelGraph, Level, ThreadGraph
from mirage.mugraph.ops import ELEMENTWISE, UNARY, Op
from mirage.mugraph.target import DEFAULT_TARGET, Target


def check(graph, target: Target = DEFAULT_TARGET) -> None:
    """Raise a GraphError if ``graph`` is not a valid µGraph for ``target``."""
    if isinstance(graph, KernelGraph):
        _check_kernel(graph, target)
    elif isinstance(graph, BlockGraph):
        _check_block(graph, target)
    elif isinstance(graph, ThreadGraph):
        _check_thread(graph)
    else:
        raise GraphError(f"not a graph: {type(graph).__name__}")


def _check_nodes(graph, target: Target) -> None:
    for i, node in enumerate(graph.nodes):
        try:
            for r in node.inputs:
                _check_ref(r)
                if not 0 <= r.node < i:
                    raise BindingError(f"input %{r.node} is not defined before this node")
                if not 0 <= r.index < len(graph.nodes[r.node].outputs):
                    raise BindingError(f"input %{r.node}.{r.index}: node %{r.node} has "
                                       f"{len(graph.nodes[r.node].outputs)} output(s)")
            if node.op is Op.INPUT:
                _check_input(graph, node)
            elif node.op is Op.CUSTOMIZED:
                if graph.level is not Level.KERNEL:
                    raise LevelError("graph-defined ops exist only in kernel graphs")
                _check_block(node.attrs, target)
                prefix = KernelGraph(graph.nodes[:i], ())
                _, j = build.add_customized(prefix, node.inputs, node.attrs)
                _expect(node.outputs, node.attrs.result_types)
            elif node.op is Op.FUSED:
                if graph.level is not Level.BLOCK:
                    raise LevelError("thread graphs live inside block graphs")
                _check_thread(node.attrs)
            elif node.op is Op.OUTPUT:
                prefix = dataclasses.replace(graph, nodes=graph.nodes[:i])
                (src,) = node.inputs
                new, j = build.add_output_saver(prefix, src, node.attrs.output_map, node.attrs.forloop_dim)
                _expect(node.outputs, new.nodes[j].outputs)
            else:
                prefix = type(graph)(**{**_fields(graph), "nodes": graph.nodes[:i]})
                _expect(node.outputs, build.infer(prefix, node.op, node.inputs, node.attrs))
        except GraphError as error:
            build.rethrow(error, graph, i)


def _is_index(value) -> bool:
    """An integer (Python or numpy), not a bool nor a float such as 2.0 (a graph file's NaN grid)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_ref(r) -> None:
    """A TypeError (a corrupt file, for a graph read from one) unless ``r`` is a pair of ints."""
    if not (_is_index(r.node) and _is_index(r.index)):
        raise TypeError(f"tensor reference ({r.node!r}, {r.index!r}) is not a pair of ints")


def _fields(graph) -> dict:
    return {f.name: getattr(graph, f.name) for f in dataclasses.fields(graph)}


def _expect(stored, computed) -> None:
    from mirage.errors import ShapeError

    if tuple(stored) != tuple(computed):
        from mirage.mugraph.text import type_text

        raise ShapeError(f"declared output types {[type_text(t) for t in stored]} differ from the "
                         f"computed {[type_text(t) for t in computed]}")


def _check_input(graph, node) -> None:
    from mirage.mugraph.graph import InputIterator, KernelInput, ThreadInput

    expected = {Level.KERNEL: KernelInput, Level.BLOCK: InputIterator, Level.THREAD: ThreadInput}
    if not isinstance(node.attrs, expected[graph.level]):
        raise LevelError(f"an input of a {graph.level.value} graph needs {expected[graph.level].__name__}"
                         " attributes")
    if graph.level is Level.BLOCK:
        it = node.attrs
        prefix = dataclasses.replace(graph, nodes=())
        new, _ = build.add_input_iterator(prefix, it.source, it.input_map, it.forloop_dim)
        _expect(node.outputs, new.nodes[0].outputs)


def check_block_header(graph: BlockGraph, target: Target = DEFAULT_TARGET) -> None:
    for name, dims in (("grid_dim", graph.grid_dim), ("block_dim", graph.block_dim)):
        if len(dims) != 3 or not all(_is_index(d) and d >= 1 for d in dims):
            raise GridError(f"{name} must be three positive ints, got {dims}")
    for name, value in (("forloop_range", graph.forloop_range), ("reduction_dimx", graph.reduction_dimx)):
        if not _is_index(value) or value < 1:
            raise GridError(f"{name} must be a positive int, got {value!r}")
    spans = graph.spans
    if len(spans) != 3 or not all(_is_index(s) and s >= 0 for s in spans):
        raise GridError(f"spans must be three non-negative ints (0 where the grid divides its dim), "
                        f"got {spans}")
    for axis, (span, blocks) in enumerate(zip(spans, graph.grid_dim, strict=True)):
        if span and not build.starts_apart(span, blocks):
            raise GridError(f"grid axis {'xyz'[axis]} has {blocks} block(s) over a span of {span}: an uneven "
                            "axis needs at least two blocks, each starting at an entry of its own (use "
                            "fewer blocks, or span 0)")
    if graph.num_blocks > target.max_blocks_per_kernel:
        raise GridError(f"grid {graph.grid_dim} has {graph.num_blocks} blocks, more than "
                        f"{target.max_blocks_per_kernel}")
    threads = graph.block_dim[0] * graph.block_dim[1] * graph.block_dim[2]
    if threads > target.max_threads_per_block or threads % 32:
        raise GridError(f"block_dim {graph.block_dim} has {threads} threads; use a multiple of 32 up "
                        f"to {target.max_threads_per_block}")


def shared_memory_bytes(graph: BlockGraph) -> int:
    """Mirage's estimate: every op output, except in-place unary ops and plain accumulators."""
    from mirage.mugraph.graph import AccumKind

    total = 0
    for node in graph.nodes:
        if node.op in UNARY or node.op is Op.OUTPUT:
            continue
        if node.op is Op.ACCUM and node.attrs.kind is AccumKind.NONE:
            continue
        total += sum(t.nbytes for t in node.outputs)
    return total


def _check_block(graph: BlockGraph, target: Target) -> None:
    check_block_header(graph, target)
    _check_nodes(graph, target)
    uses = graph.consumers()
    for i, node in enumerate(graph.nodes):
        if node.op is Op.OUTPUT:
            continue
        for j in range(len(node.outputs)):
            if not uses.get(build.Ref(i, j)):
                try:
                    raise DanglingTensorError("this tensor is never used; save it with new_output or "
                                              "remove the op")
                except GraphError as error:
                    build.rethrow(error, graph, i)
    if not graph.output_nodes:
        raise GraphError("the block graph has no output savers (add tb.new_output)")
    need = shared_memory_bytes(graph)
    if need > target.smem_per_block:
        raise SharedMemoryError(f"the block graph needs about {need} bytes of shared memory, more than "
                                f"the {target.smem_per_block} of {target.name}; use a larger grid or "
                                "forloop_range so tiles get smaller")


def _check_thread(graph: ThreadGraph) -> None:
    for i, node in enumerate(graph.nodes):
        if node.op is not Op.INPUT and node.op not in ELEMENTWISE:
            try:
                raise LevelError(f"thread graphs hold element-wise ops only, not {node.op.value}")
            except GraphError as error:
                build.rethrow(error, graph, i)
    _check_nodes(graph, DEFAULT_TARGET)
    if len(graph.outputs) != 1:
        raise GraphError("a thread graph has exactly one output")


def _check_kernel(graph: KernelGraph, target: Target) -> None:
    _check_nodes(graph, target)
    if not graph.outputs:
        raise GraphError("the kernel graph has no outputs (call g.mark_output)")
    for r in graph.outputs:
        _check_ref(r)
        if not (0 <= r.node < len(graph.nodes) and 0 <= r.index < len(graph.nodes[r.node].outputs)):
            raise BindingError(f"output %{r.node}.{r.index} does not exist")
