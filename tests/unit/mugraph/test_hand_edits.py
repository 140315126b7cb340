"""Graphs written or edited by hand: clear errors where the builder would refuse the same graph, and
DOT output that stays valid whatever the graph's name."""

from __future__ import annotations

import json

import pytest

import mirage as mi
from mirage.errors import AttributeValueError, SerializationError
from mirage.mugraph.serialize import loads


def _exp_graph(name: str = ""):
    g = mi.new_kernel_graph(name)
    x = g.new_input(dims=(8, 64), dtype=mi.float16)
    g.mark_output(g.exp(x))
    return g


@pytest.mark.parametrize("shape", [[-8, 64], [0, 64], [8.0, 64], [True, 64], []])
def test_a_shape_the_builder_refuses_is_refused_when_loaded(shape):
    document = json.loads(_exp_graph().to_json())
    for node in document["graph"]["nodes"]:
        node["outputs"][0]["shape"] = shape
    with pytest.raises(SerializationError, match="shape must be a list of positive integers"):
        loads(json.dumps(document))


def test_a_reference_edited_into_strings_is_a_corrupt_file():
    document = json.loads(_exp_graph().to_json())
    document["graph"]["outputs"] = [["1", "0"]]
    with pytest.raises(SerializationError, match="corrupt graph file"):
        loads(json.dumps(document))


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_scalar_operands_are_finite(value):
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(8, 64), dtype=mi.float32)
    with pytest.raises(AttributeValueError, match="scalar must be finite"):
        g.mul_scalar(x, value)
    with pytest.raises(AttributeValueError, match="scalar must be finite"):
        g.add_scalar(x, value)


def test_a_graph_file_with_an_infinite_scalar_is_refused_when_loaded():
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(8, 64), dtype=mi.float32)
    g.mark_output(g.mul_scalar(x, 2.0))
    text = g.to_json().replace("2.0", "Infinity")
    with pytest.raises(AttributeValueError, match="scalar must be finite"):
        loads(text)


def test_the_graph_name_is_escaped_in_dot(tmp_path):
    path = tmp_path / "g.dot"
    _exp_graph('my "fused"\ngraph').visualize(str(path))
    line = next(line for line in path.read_text().splitlines() if "cluster_kernel" in line)
    assert 'label="kernel graph my \\"fused\\"\\ngraph";' in line
