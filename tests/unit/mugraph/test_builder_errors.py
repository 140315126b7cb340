"""Misuse of the builder API raises mirage errors (never bare TypeError/ValueError/AttributeError)
whose text names the problem and what to write instead."""

from __future__ import annotations

import numpy as np
import pytest

import mirage as mi
from mirage import errors


def kernel():
    g = mi.new_kernel_graph()
    return g, g.new_input((4, 8), mi.float32)


def block_input():
    g, x = kernel()
    tb = mi.new_threadblock_graph((2, 1, 1), forloop_range=2)
    return tb, tb.new_input(x, (0, -1, -1), forloop_dim=1)


CASES = [
    ("dims an int", lambda: kernel()[0].new_input(8, mi.float32), errors.ShapeError,
     ["tuple of positive ints", "(8,)"]),
    ("dims a float", lambda: kernel()[0].new_input((2.5, 8), mi.float32), errors.ShapeError,
     ["tuple of positive ints", "2.5"]),
    ("dims None", lambda: kernel()[0].new_input(None), errors.ShapeError, ["tuple of positive ints"]),
    ("dims a str", lambda: kernel()[0].new_input("48"), errors.ShapeError, ["tuple of positive ints"]),
    ("dims zero", lambda: kernel()[0].new_input((0, 8)), errors.ShapeError, ["positive"]),
    ("dims empty", lambda: kernel()[0].new_input(()), errors.ShapeError, ["positive"]),
    ("dtype int32", lambda: kernel()[0].new_input((4, 8), "int32"), errors.DTypeError,
     ["unsupported dtype 'int32'", "float16"]),
    ("customized with a str", lambda: _customized_str(), errors.GraphError,
     ["new_threadblock_graph", "'tb'"]),
    ("customized with one tensor", lambda: _customized_one_tensor(), errors.GraphError,
     ["list of the kernel graph's tensors", "customized([X, W], tb)"]),
    ("accumulator bogus", lambda: _accum(acc="bogus"), errors.AttributeValueError,
     ["unknown accumulator 'bogus'", "'sum'"]),
    ("accumulator eps a str", lambda: _accum(acc="rms", eps="1e-5"), errors.AttributeValueError,
     ["eps must be a number"]),
    ("grid None", lambda: mi.new_threadblock_graph(None), errors.GridError,
     ["grid_dim must be", "(64, 1, 1)", "None"]),
    ("grid a float", lambda: mi.new_threadblock_graph((2.5, 1, 1)), errors.GridError, ["grid_dim"]),
    ("grid four dims", lambda: mi.new_threadblock_graph((1, 1, 1, 1)), errors.GridError, ["up to 3"]),
    ("block_dim a str", lambda: mi.new_threadblock_graph(2, block_dim="128"), errors.GridError,
     ["block_dim"]),
    ("forloop_range a float", lambda: mi.new_threadblock_graph(2, forloop_range=2.5), errors.GridError,
     ["forloop_range must be a positive int", "2.5"]),
    ("input_map None", lambda: _tb_new_input(input_map=None), errors.InputMapError, ["input_map"]),
    ("forloop_dim a float", lambda: _tb_new_input(forloop_dim=1.0), errors.ForloopDimError,
     ["forloop_dim must be an int"]),
    ("reduction dim -5", lambda: _reduce(-5), errors.AttributeValueError, ["dim -5 is out of range"]),
    ("reduction dim 2", lambda: _reduce(2), errors.AttributeValueError, ["dim 2 is out of range"]),
    ("reduction dim 1.0", lambda: _reduce(1.0), errors.AttributeValueError, ["dim 1.0 is out of range"]),
    ("parse(None)", lambda: mi.parse(None), errors.ParseError, ["a str", "NoneType"]),
    ("parse(bytes)", lambda: mi.parse(b"kernel_graph {"), errors.ParseError, ["a str", "bytes"]),
]


def _customized_str():
    g, x = kernel()
    return g.customized([x], "tb")


def _customized_one_tensor():
    g, x = kernel()
    tb = mi.new_threadblock_graph((2, 1, 1))
    return g.customized(x, tb)


def _accum(**kw):
    tb, bx = block_input()
    return tb.forloop_accum(bx, **kw)


def _tb_new_input(**kw):
    g, x = kernel()
    return mi.new_threadblock_graph((2, 1, 1)).new_input(x, **kw)


def _reduce(dim):
    g, x = kernel()
    return g.reduction(x, dim)


@pytest.mark.parametrize(("label", "call", "error", "words"), CASES, ids=[c[0] for c in CASES])
def test_misuse_raises_a_mirage_error(label, call, error, words):
    with pytest.raises(error) as info:
        call()
    assert isinstance(info.value, errors.MirageError)
    for word in words:
        assert word in str(info.value)


def test_a_reduction_error_names_the_dim_as_passed():
    g, x = kernel()
    with pytest.raises(errors.AttributeValueError) as info:
        g.reduction(x, -5)
    first = str(info.value).splitlines()[0]
    assert "dim -5 is out of range for shape [4, 8]" in first
    assert "-3" not in first
    with pytest.raises(errors.AttributeValueError, match="dim -3 is out of range"):
        g.reduction_max(x, -3)


def test_valid_arguments_still_build():
    g = mi.new_kernel_graph()
    x = g.new_input([4, np.int64(8)], "f32")
    assert x.dims == (4, 8) and isinstance(x.dims[1], int)
    assert g.reduction(x, -1).dims == (4, 1)
    assert g.reduction(x, np.int64(0)).dims == (1, 8)
    tb = mi.new_threadblock_graph(2, block_dim=[128], forloop_range=np.int64(2))
    assert tb.graph.grid_dim == (2, 1, 1) and tb.graph.block_dim == (128, 1, 1)
    bx = tb.new_input(x, input_map=(0, -1, -1), forloop_dim=np.int64(1))
    tb.new_output(tb.forloop_accum(bx, acc="sum", eps=0), output_map=[0, -1, -1])
    (out,) = g.customized((x,), tb)
    g.mark_output(out)
    assert g.freeze().outputs


def test_short_maps_leave_the_missing_grid_axes_unmapped():
    """``input_map=(0,)`` means grid x splits dim 0 and grid y and z split nothing: the missing axes
    are -1, not 1 (which would silently split X's rows across grid y and sum only a third of each)."""
    g = mi.new_kernel_graph()
    x, y = g.new_input((4, 6), mi.float32), g.new_input((4, 3), mi.float32)
    tb = mi.new_threadblock_graph((2, 3, 1))
    bx = tb.new_input(x, input_map=(0,))
    by = tb.new_input(y, input_map=(0, 1))
    assert bx.dims == (2, 6) and by.dims == (2, 1)  # X's rows stay whole in every block
    out_tile = tb.add(tb.reduction(bx, 1), by)
    tb.new_output(tb.forloop_accum(out_tile), output_map=(0, 1))
    (out,) = g.customized([x, y], tb)
    g.mark_output(out)
    rng = np.random.default_rng(0)
    xs, ys = rng.standard_normal((4, 6)), rng.standard_normal((4, 3))
    (result,) = mi.interpret(g, [xs, ys])
    np.testing.assert_allclose(result, xs.sum(1, keepdims=True) + ys)
