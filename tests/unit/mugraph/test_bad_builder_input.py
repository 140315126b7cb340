"""Builder, graph-file, text-form and interpreter inputs outside the other tests: each is a named mirage
error that says what is wrong, never a bare ValueError/TypeError from deep inside, nor a crash later."""

from __future__ import annotations

import json

import numpy as np
import pytest

import mirage as mi
from mirage import errors
from mirage.mugraph.serialize import loads


def kernel(dims=(4, 8)):
    g = mi.new_kernel_graph()
    return g, g.new_input(dims, mi.float32)


def rms_block_graph(eps: float = 1e-6):
    """A graph-defined kernel with an rms accumulator (its eps stored in the block graph)."""
    g, x = kernel()
    tb = mi.new_threadblock_graph((2, 1, 1), forloop_range=2)
    bx = tb.new_input(x, (0, -1, -1), forloop_dim=1)
    tb.new_output(tb.div(tb.forloop_accum(bx), tb.forloop_accum(bx, acc="rms", eps=eps)), (0, -1, -1))
    (out,) = g.customized([x], tb)
    g.mark_output(g.clamp(out, -1.0, 1.0))
    return g.freeze()


# ---- builder arguments -----------------------------------------------------------------------------


@pytest.mark.parametrize(("call", "error", "words"), [
    (lambda g, x: g.clamp(x, "a", 1.0), errors.AttributeValueError, ["clamp's min_value must be a number"]),
    (lambda g, x: g.clamp(x, 0.0, None), errors.AttributeValueError, ["clamp's max_value must be a number"]),
    (lambda g, x: g.clamp(x, float("nan"), 1.0), errors.AttributeValueError, ["clamp's min", "nan"]),
    (lambda g, x: g.rms_norm(x, eps="1e-5"), errors.AttributeValueError, ["rms_norm's eps must be a number"]),
    (lambda g, x: g.rms_norm(x, eps=float("nan")), errors.AttributeValueError, ["eps must be a finite"]),
    (lambda g, x: g.rms_norm(x, eps=float("inf")), errors.AttributeValueError, ["eps must be a finite"]),
    (lambda g, x: g.rms_norm(x, normalized_shape=5), errors.GraphError, ["normalized_shape 5 must be 8"]),
    (lambda g, x: g.new_input((4, 128), pattern=128), errors.GraphError, ["pattern must be a str"]),
], ids=["clamp str", "clamp None", "clamp nan", "rms eps str", "rms eps nan", "rms eps inf",
        "normalized_shape wrong int", "pattern int"])
def test_bad_builder_arguments_are_named_errors(call, error, words):
    g, x = kernel()
    with pytest.raises(error) as info:
        call(g, x)
    for word in words:
        assert word in str(info.value)


def test_builder_numbers_that_stay_valid():
    g, x = kernel()
    assert g.rms_norm(x, normalized_shape=8).dims == (4, 8)  # an int, as torch.nn.RMSNorm(8) takes
    assert g.rms_norm(x, normalized_shape=(8,), eps=np.float32(1e-6)).dims == (4, 8)
    g.mark_output(g.clamp(x, -float("inf"), 6))  # an open side is ±inf
    (out,) = mi.interpret(g, [np.full((4, 8), 9.0)])
    assert np.all(out == 6.0)


@pytest.mark.parametrize("eps", [float("nan"), float("inf")])
def test_an_accumulator_eps_that_is_not_finite_is_refused(eps):
    g, x = kernel()
    tb = mi.new_threadblock_graph((2, 1, 1))
    bx = tb.new_input(x, (0, -1, -1))
    with pytest.raises(errors.AttributeValueError, match="accum's eps must be a finite number"):
        tb.forloop_accum(bx, acc="rms", eps=eps)


# ---- graph files edited by hand ----------------------------------------------------------------------


def _edited(graph, edit) -> str:
    document = json.loads(graph.to_json())
    edit(document["graph"])
    return json.dumps(document)


def _block(graph: dict) -> dict:
    return graph["nodes"][1]["attrs"]


@pytest.mark.parametrize(("edit", "error", "words"), [
    (lambda d: _block(d)["nodes"][2]["attrs"].__setitem__("eps", "Infinity"), errors.AttributeValueError,
     ["eps must be a finite number"]),
    (lambda d: d["nodes"][2]["attrs"].__setitem__("max", "rms"), errors.AttributeValueError,
     ["clamp's max must be a number"]),
    (lambda d: d["nodes"][2]["attrs"].__setitem__("min", [0, 0]), errors.AttributeValueError,
     ["clamp's min must be a number"]),
    (lambda d: d["nodes"][1]["inputs"][0].__setitem__(0, -1), errors.BindingError,
     ["input %-1 is not defined before this node"]),
    (lambda d: d["nodes"][2]["inputs"][0].__setitem__(1, 3), errors.BindingError, ["has 1 output(s)"]),
    (lambda d: d["outputs"][0].__setitem__(0, -1), errors.BindingError, ["does not exist"]),
    (lambda d: _block(d)["grid_dim"].__setitem__(1, 1.5), errors.GridError, ["grid_dim must be three"]),
    (lambda d: _block(d).__setitem__("forloop_range", 2.0), errors.GridError, ["forloop_range must be a"]),
], ids=["accum eps inf", "clamp max str", "clamp min list", "negative input ref", "ref index past outputs",
        "negative output ref", "grid dim float", "forloop_range float"])
def test_a_hand_edited_graph_file_is_refused_when_loaded(edit, error, words):
    text = _edited(rms_block_graph(), edit)
    with pytest.raises(error) as info:
        loads(text)
    for word in words:
        assert word in str(info.value)


def test_a_graph_file_that_is_a_json_list_is_named():
    with pytest.raises(errors.SerializationError, match="a JSON list, not an object"):
        loads("[1, 2]")


def test_a_text_form_line_without_its_type_is_a_parse_error():
    text = str(rms_block_graph())
    broken = text.replace(" : f32[4,4]\n  return", "\n  return")
    assert broken != text
    with pytest.raises(errors.ParseError, match="gives no output type"):
        mi.parse(broken)


# ---- the interpreter's inputs ---------------------------------------------------------------------------


def exp_graph():
    g, x = kernel()
    g.mark_output(g.exp(x))
    return g


@pytest.mark.parametrize(("inputs", "options", "words"), [
    ([np.full((4, 8), "a")], {}, ["input 0 holds <U1 values, not numbers"]),
    ([np.ones((4, 8)) * (1 + 2j)], {}, ["input 0 is a complex array"]),
    ([[[1.0, 2.0], [3.0]]], {}, ["input 0 is not an array"]),
    ([None], {}, ["input 0 holds object values"]),
    ([np.ones((4, 8))], {"dtype": np.int32}, ["floating-point dtype", "int32"]),
    ([np.ones((4, 8))], {"dtype": "not a dtype"}, ["floating-point dtype"]),
    ("abc", {}, ["a list of the graph's inputs", "str"]),
], ids=["strings", "complex", "ragged", "None", "int dtype", "no dtype", "a str"])
def test_interpreter_inputs_it_cannot_use_are_named(inputs, options, words):
    with pytest.raises(errors.InterpretError) as info:
        mi.interpret(exp_graph(), inputs, **options)
    for word in words:
        assert word in str(info.value)


def test_a_complex_torch_tensor_is_refused_not_cut_to_its_real_part():
    torch = pytest.importorskip("torch")
    with pytest.raises(errors.InterpretError, match="complex tensor"):
        mi.interpret(exp_graph(), [torch.ones(4, 8, dtype=torch.complex64)])


def test_interpreter_inputs_that_stay_valid():
    (out,) = mi.interpret(exp_graph(), [np.zeros((4, 8), dtype=np.int64)])
    assert out.dtype == np.float64 and np.all(out == 1.0)
    (out,) = mi.interpret(exp_graph(), (np.zeros((4, 8), dtype=bool),), dtype=np.float32)
    assert out.dtype == np.float32 and np.all(out == 1.0)
    (nan,) = mi.interpret(exp_graph(), [np.full((4, 8), np.nan)])
    assert np.isnan(nan).all()  # NaN inputs give NaN, as numpy and PyTorch do
