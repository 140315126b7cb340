"""Fixtures of the command-line tests."""

import pytest

import mirage as mi


@pytest.fixture
def graph_file(tmp_path):
    """A small kernel graph (exp of a product) saved as JSON."""
    g = mi.new_kernel_graph("small")
    x = g.new_input(dims=(2, 8), dtype=mi.float32, name="X")
    w = g.new_input(dims=(8, 4), dtype=mi.float32, name="W")
    g.mark_output(g.exp(g.matmul(x, w)))
    path = tmp_path / "small.json"
    g.to_json(path)
    return path
