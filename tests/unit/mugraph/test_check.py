"""A table of bad graphs, each raising its own specific error with a helpful message."""

from __future__ import annotations

import dataclasses

import pytest

import mirage as mi
from mirage import errors
from mirage.mugraph import build
from mirage.mugraph.graph import Ref
from mirage.mugraph.ops import Op
from mirage.mugraph.serialize import loads


def kernel(*shapes, dtype=mi.float16):
    g = mi.new_kernel_graph()
    return g, [g.new_input(dims=s, dtype=dtype) for s in shapes]


def block(grid=(4, 1, 1), R=4, **kw):
    g, (x, w) = kernel((8, 64), (64, 32))
    return g, x, w, mi.new_threadblock_graph(grid_dim=grid, forloop_range=R, **kw)


def matmul_inner_dims():
    g, (a, b) = kernel((8, 64), (32, 16))
    g.matmul(a, b)


def broadcast_mismatch():
    g, (a, b) = kernel((8, 64), (8, 32))
    g.add(a, b)


def dtype_mix():
    g = mi.new_kernel_graph()
    a = g.new_input(dims=(4, 4), dtype=mi.float16)
    b = g.new_input(dims=(4, 4), dtype=mi.float32)
    g.mul(a, b)


def wrong_arity():
    g, (a,) = kernel((4, 4))
    build.append(g.graph, Op.ADD, (a.ref,))


def wrong_level():
    g, (a,) = kernel((4, 64))
    build.append(g.graph, Op.REDUCTION_TO_DIMX, (a.ref,), mi.mugraph.graph.Reduce(1))


def reduction_dim_out_of_range():
    g, (a,) = kernel((4, 4))
    g.reduction(a, 2)


def input_map_out_of_range():
    g, x, w, tb = block()
    tb.new_input(x, input_map=(2, -1, -1), forloop_dim=1)


def input_map_same_dim_twice():
    g, x, w, tb = block(grid=(2, 2, 1))
    tb.new_input(x, input_map=(0, 0, -1), forloop_dim=1)


def forloop_dim_out_of_range():
    g, x, w, tb = block()
    tb.new_input(x, input_map=(-1, -1, -1), forloop_dim=3)


def grid_does_not_divide():
    g, x, w, tb = block(grid=(3, 1, 1))
    tb.new_input(w, input_map=(1, -1, -1), forloop_dim=0)


def forloop_does_not_divide():
    g, x, w, tb = block(R=5)
    tb.new_input(x, input_map=(-1, -1, -1), forloop_dim=1)


def output_map_missing_for_grid():
    g, x, w, tb = block()
    t = tb.new_input(w, input_map=(1, -1, -1), forloop_dim=0)
    tb.new_output(tb.forloop_accum(t), output_map=(-1, -1, -1))


def output_before_accumulator():
    g, x, w, tb = block()
    t = tb.new_input(w, input_map=(1, -1, -1), forloop_dim=0)
    tb.new_output(t, output_map=(1, -1, -1))


def mixing_before_and_after_accumulators():
    g, x, w, tb = block()
    t = tb.new_input(x, input_map=(-1, -1, -1), forloop_dim=1)
    tb.add(t, tb.forloop_accum(t))


def accumulating_twice():
    g, x, w, tb = block()
    t = tb.new_input(x, input_map=(-1, -1, -1), forloop_dim=1)
    tb.forloop_accum(tb.forloop_accum(t))


def too_many_blocks():
    mi.new_threadblock_graph(grid_dim=(128, 64, 1))


def block_dim_not_warps():
    mi.new_threadblock_graph(grid_dim=(4, 1, 1), block_dim=(100, 1, 1))


def shared_memory_overflow():
    g, (x,) = kernel((1024, 1024))
    tb = mi.new_threadblock_graph(grid_dim=(1, 1, 1), forloop_range=1)
    t = tb.new_input(x)
    tb.new_output(tb.forloop_accum(tb.matmul(t, t)))
    g.customized([x], tb)


def customized_with_wrong_tensor():
    g, x, w, tb = block(grid=(1, 1, 1))
    t = tb.new_input(x, input_map=(-1, -1, -1), forloop_dim=1)
    tb.new_output(tb.forloop_accum(t, acc="sum"))
    g.customized([w], tb)


def dangling_block_tensor():
    g, x, w, tb = block(grid=(1, 1, 1))
    t = tb.new_input(x, input_map=(-1, -1, -1), forloop_dim=1)
    tb.exp(t)
    tb.new_output(tb.forloop_accum(t, acc="sum"))
    g.customized([x], tb)


def unknown_op_in_text():
    mi.parse('kernel_graph {\n%0 = input() name="" : f16[4]\n%1 = frobnicate(%0) : f16[4]\nreturn %1\n}')


def malformed_text():
    mi.parse("kernel_graph {\n%0 = input( : f16[4]\n}")


def corrupt_json():
    loads('{"format": "mirage.mugraph", "version": 1, "graph": {"level": "kernel", "nodes": [{"op": 1}]}}')


def tampered_declared_shape():
    g, (a, b) = kernel((8, 64), (64, 16))
    g.mark_output(g.matmul(a, b))
    graph = g.graph
    node = graph.nodes[2]
    bad = dataclasses.replace(node, outputs=(node.outputs[0].with_shape((8, 17)),))
    mi.check(dataclasses.replace(graph, nodes=graph.nodes[:2] + (bad,)))


def no_outputs():
    g, (a,) = kernel((4, 4))
    g.exp(a)
    g.freeze()


def customized_with_wrong_shape():
    g, x, w, tb = block(grid=(1, 1, 1))
    t = tb.new_input(x, input_map=(-1, -1, -1), forloop_dim=1)
    tb.new_output(tb.forloop_accum(t, acc="sum"))
    build.add_customized(g.graph, (w.ref,), tb.graph)


def dangling_reference():
    g, (a,) = kernel((4, 4))
    build.append(g.graph, Op.EXP, (Ref(7, 0),))


BAD = [
    (matmul_inner_dims, errors.ShapeError, "inner dims"),
    (broadcast_mismatch, errors.ShapeError, "broadcast"),
    (dtype_mix, errors.DTypeError, "dtypes"),
    (wrong_arity, errors.ArityError, "takes 2 inputs"),
    (wrong_level, errors.LevelError, "kernel level"),
    (reduction_dim_out_of_range, errors.AttributeValueError, "out of range"),
    (input_map_out_of_range, errors.InputMapError, "has 2 dims"),
    (input_map_same_dim_twice, errors.InputMapError, "same dim"),
    (forloop_dim_out_of_range, errors.ForloopDimError, "forloop_dim 3"),
    (grid_does_not_divide, errors.DivisibilityError, "not divisible by grid"),
    (forloop_does_not_divide, errors.DivisibilityError, "forloop_range=5"),
    (output_map_missing_for_grid, errors.OutputMapError, "disjoint"),
    (output_before_accumulator, errors.AfterAccumError, "accumulator"),
    (mixing_before_and_after_accumulators, errors.AfterAccumError, "mix"),
    (accumulating_twice, errors.AfterAccumError, "exactly one accumulator"),
    (too_many_blocks, errors.GridError, "8192 blocks"),
    (block_dim_not_warps, errors.GridError, "multiple of 32"),
    (shared_memory_overflow, errors.SharedMemoryError, "shared memory"),
    (customized_with_wrong_tensor, errors.BindingError, "input iterator 0"),
    (customized_with_wrong_shape, errors.BindingError, "reads f16"),
    (dangling_block_tensor, errors.DanglingTensorError, "never used"),
    (unknown_op_in_text, errors.UnknownOpError, "frobnicate"),
    (malformed_text, errors.ParseError, "cannot read"),
    (corrupt_json, errors.SerializationError, "corrupt"),
    (tampered_declared_shape, errors.ShapeError, "f16\\[8,17\\]"),
    (no_outputs, errors.GraphError, "mark_output"),
    (dangling_reference, errors.BindingError, "does not exist"),
]


@pytest.mark.parametrize("make,error,message", BAD, ids=[b[0].__name__ for b in BAD])
def test_bad_graph_raises_its_error(make, error, message):
    with pytest.raises(error, match=message) as info:
        make()
    assert type(info.value) is error  # the specific class, not only a parent
    assert isinstance(info.value, errors.MirageError)


def test_error_shows_the_surrounding_text_form():
    with pytest.raises(errors.ShapeError) as info:
        tampered_declared_shape()
    text = str(info.value)
    assert "%2" in text and "<-- here" in text and "matmul(%0, %1)" in text


def test_builder_error_shows_the_pending_op():
    with pytest.raises(errors.ShapeError) as info:
        matmul_inner_dims()
    assert "matmul(%0, %1)" in str(info.value) and "<-- this op" in str(info.value)


def test_upstream_and_downstream_walk_every_path_once():
    """``upstream(n)``: the nodes n is computed from; ``downstream(n)``: those computed from it (a
    diamond reaches its top once), neither holding n itself."""
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(4, 4), dtype=mi.float16)
    y = g.new_input(dims=(4, 4), dtype=mi.float16)
    e = g.exp(x)
    out = g.matmul(g.add(e, y), g.mul(e, e))
    g.mark_output(out)
    graph = g.freeze()
    nodes = {n.op.value: i for i, n in enumerate(graph.nodes) if n.op.value != "input"}
    inputs = set(graph.input_nodes)
    assert graph.upstream(nodes["matmul"]) == inputs | {nodes["exp"], nodes["add"], nodes["mul"]}
    assert graph.downstream(nodes["exp"]) == {nodes["add"], nodes["mul"], nodes["matmul"]}
    assert graph.upstream(min(inputs)) == set() and graph.downstream(nodes["matmul"]) == set()
