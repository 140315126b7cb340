"""Grids that do not divide a dim (``BlockGraph.spans``): tiles of ceil(span / blocks) entries, the
last one starting at span - tile. The µGraphs of benchmarks/mugraphs/uneven.py compute what PyTorch
does in float64; the verifier proves the uneven attention equivalent to its reference and rejects a
block graph that reduces over the uneven dim (its overlapping tiles disagree); the spans survive
every form a graph is saved in; bad spans get errors that say what to change."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mirage as mi
from benchmarks.mugraphs.uneven import GRAPHS
from mirage.errors import DivisibilityError, ForloopDimError, GridError, OutputMapError, OverlapError
from mirage.mugraph import patterns
from mirage.mugraph.build import tile_extent, tile_start
from mirage.mugraph.interpret import interpret
from mirage.mugraph.serialize import graph_from_dict, graph_to_dict
from mirage.mugraph.text import parse, to_text
from mirage.verifier import verify


def _reference(name: str, inputs: list[np.ndarray]) -> torch.Tensor:
    t = [torch.from_numpy(x).double() for x in inputs]
    if "causal" in name:  # the mask's values: the causal pattern's (0 on and below the diagonal, else −inf)
        q, k, v, mask = t
        causal = torch.ones(q.shape[-2], k.shape[-1], dtype=torch.bool).tril()
        return torch.softmax((q @ k / 8).masked_fill(~causal, -torch.inf), dim=-1) @ v
    if "biased" in name:
        q, k, v, bias = t
        return torch.softmax(q @ k / 8 + bias, dim=-1) @ v
    if "attention" in name:
        q, k, v = t  # (heads, tokens, dim), K stored transposed
        return torch.softmax(q @ k / 8, dim=-1) @ v
    if "projection" in name:
        return t[0] @ t[1]
    x, gain = t
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * gain


@pytest.mark.parametrize("name", list(GRAPHS))
def test_uneven_graphs_compute_the_programs_function(name):
    graph = GRAPHS[name]()
    assert any(any(n.attrs.spans) for n in graph.nodes if n.op.value == "customized")
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(t.shape) for t in graph.input_types]
    for i, node in enumerate(graph.input_nodes):  # a pattern input holds its pattern's values
        if pattern := graph.nodes[node].attrs.pattern:
            inputs[i] = patterns.values(pattern, inputs[i].shape, torch.float64).numpy()
    (got,) = interpret(graph, inputs)
    np.testing.assert_allclose(got, _reference(name, inputs).numpy(), rtol=1e-9, atol=1e-9)


def test_tiles_start_where_the_last_one_ends_at_the_dim():
    extent = tile_extent(197, 4, 197)
    assert extent == 50
    assert [tile_start(b, extent, 197) for b in range(4)] == [0, 50, 100, 147]
    assert [tile_start(b, 64, 0) for b in range(3)] == [0, 64, 128]  # an even axis: no clamp


def _attention(rows_blocks: int, span: int, queries: int = 37, keys: int = 24):
    g = mi.new_kernel_graph()
    q = g.new_input(dims=(2, queries, 8), dtype=mi.float16)
    k = g.new_input(dims=(2, 8, keys), dtype=mi.float16)
    v = g.new_input(dims=(2, keys, 8), dtype=mi.float16)
    tb = mi.new_threadblock_graph(grid_dim=(2, 1, rows_blocks), spans=(0, 0, span))
    bq = tb.new_input(q, input_map=(0, -1, 1))
    bk, bv = tb.new_input(k, input_map=(0, -1, -1)), tb.new_input(v, input_map=(0, -1, -1))
    e = tb.exp(tb.matmul(bq, bk))
    o = tb.div(tb.forloop_accum(tb.matmul(e, bv)), tb.forloop_accum(e, "sum"))
    tb.new_output(o, output_map=(0, -1, 1))
    (out,) = g.customized([q, k, v], tb)
    g.mark_output(out)
    return g.freeze()


def _attention_reference(queries: int = 37, keys: int = 24):
    g = mi.new_kernel_graph()
    q = g.new_input(dims=(2, queries, 8), dtype=mi.float16)
    k = g.new_input(dims=(2, 8, keys), dtype=mi.float16)
    v = g.new_input(dims=(2, keys, 8), dtype=mi.float16)
    e = g.exp(g.matmul(q, k))
    g.mark_output(g.div(g.matmul(e, v), g.reduction(e, 2)))
    return g.freeze()


def _sums_over_the_uneven_rows():
    """Each block adds the sum of its own rows to every row: the overlapping rows of the last two
    blocks get different sums, so no grid of blocks computes a function of each row alone."""
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(37, 8), dtype=mi.float16)
    tb = mi.new_threadblock_graph(grid_dim=(3, 1, 1), spans=(37, 0, 0))
    bx = tb.new_input(x, input_map=(0, -1, -1))
    tb.new_output(tb.forloop_accum(tb.add(bx, tb.reduction(bx, 0))), output_map=(0, -1, -1))
    (out,) = g.customized([x], tb)
    g.mark_output(out)
    return g.freeze()


def test_the_verifier_proves_an_uneven_attention_equivalent():
    result = verify(_attention_reference(), _attention(3, 37))
    assert result.equivalent, result.reason


def test_blocks_that_mix_the_uneven_dim_disagree_where_they_overlap():
    graph = _sums_over_the_uneven_rows()
    with pytest.raises(OverlapError, match="mixes entries along that dim"):
        interpret(graph, [np.random.default_rng(0).standard_normal((37, 8))])
    reference = mi.new_kernel_graph()
    x = reference.new_input(dims=(37, 8), dtype=mi.float16)
    reference.mark_output(reference.add(x, x))
    result = verify(reference.freeze(), graph)
    assert not result.equivalent and "uneven axis" in result.reason


def test_spans_survive_json_and_text():
    graph = _attention(3, 37)
    assert graph_from_dict(graph_to_dict(graph)) == graph
    assert "spans=(0,0,37)" in to_text(graph).replace(" ", "")
    assert parse(to_text(graph)) == graph
    even = _attention_reference()
    assert "spans" not in str(graph_to_dict(even))  # even graphs are saved (and hashed) as before


def test_bad_spans_say_what_to_change():
    with pytest.raises(GridError, match="at least two blocks"):
        mi.new_threadblock_graph(grid_dim=(1, 1, 1), spans=(37, 0, 0))
    with pytest.raises(GridError, match="entry of its own"):
        mi.new_threadblock_graph(grid_dim=(5, 1, 1), spans=(6, 0, 0))  # tiles of 2: 4 · 2 ≥ 6
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(36, 8), dtype=mi.float16)
    tb = mi.new_threadblock_graph(grid_dim=(3, 1, 1), spans=(37, 0, 0))
    with pytest.raises(DivisibilityError, match="spans 37 entries unevenly, but dim 0 it maps has size 36"):
        tb.new_input(x, input_map=(0, -1, -1))
    tb = mi.new_threadblock_graph(grid_dim=(5, 1, 1))
    y = g.new_input(dims=(37, 8), dtype=mi.float16)
    with pytest.raises(DivisibilityError, match="give the block graph spans with 37"):
        tb.new_input(y, input_map=(0, -1, -1))
    tb = mi.new_threadblock_graph(grid_dim=(3, 1, 1), spans=(37, 0, 0))
    with pytest.raises(ForloopDimError, match="for-loop cannot also step it"):
        tb.new_input(y, input_map=(0, -1, -1), forloop_dim=0)
    bx = tb.new_input(y, input_map=(0, -1, -1))
    with pytest.raises(OutputMapError, match="saved tile has 1 along dim 0"):
        tb.new_output(tb.forloop_accum(tb.reduction(bx, 0)), output_map=(0, -1, -1))


def test_an_unknown_mask_of_the_attention_builder_is_named():
    from benchmarks.mugraphs.attention import one_kernel

    with pytest.raises(ValueError, match="mask 'alibi'"):
        one_kernel(2, 32, 32, 64, rows=16, key_tile=32, mask="alibi")
