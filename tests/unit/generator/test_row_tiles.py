"""2-D tiles over the rows and columns of a projection at prefill (mirage.generator.row_tiles): the
space gets them beside its own 1-D grids, and the search verifies µGraphs on them."""

from __future__ import annotations

import mirage as mi
from mirage.generator import Budget, row_tiles, search
from mirage.generator.space import SearchSpace
from mirage.verifier import verify


def _projection(rows: int, depth: int = 768, columns: int = 768) -> mi.KernelGraph:
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(rows, depth), dtype=mi.float16)
    w = g.new_input(dims=(depth, columns), dtype=mi.float16, strides=(1, depth))  # nn.Linear's weight.T
    b = g.new_input(dims=(1, columns), dtype=mi.float16)
    g.mark_output(g.add(g.matmul(x, w), b))
    return g.freeze()


def test_tiles_come_beside_the_spaces_own_grids_and_only_for_many_rows():
    space = SearchSpace.named("mlp")
    assert row_tiles.overrides(_projection(8), space) is None  # a GEMV: the 1-D grids serve
    layout = row_tiles.overrides(_projection(128), space)
    assert {(12, 4, 1), (12, 2, 1), (6, 4, 1), (6, 2, 1)} <= set(layout["griddims"])
    assert (96, 1, 1) in layout["griddims"]  # a generated 1-D grid, kept
    assert (-1, 0, -1) in layout["imaps"] and (1, 0, -1) in layout["omaps"]
    assert {24, 12, 6} <= set(layout["franges"])  # K steps of 32, 64 and 128


def test_the_search_verifies_a_product_tiled_over_rows_and_columns():
    reference = _projection(128)

    def tiled(graph):
        return any(n.op.value == "customized" and n.attrs.grid_dim[1] > 1 and
                   any(m.op.value == "matmul" for m in n.attrs.nodes) for n in graph.nodes)

    result = search(reference, "mlp", budget=Budget(time_s=120), progress=False, cache=False, workers=1,
                    stop_when=tiled, **row_tiles.overrides(reference, SearchSpace.named("mlp")))
    found = [g for g in result.graphs if tiled(g)]
    assert found, result.stats.summary()
    assert all(verify(reference, g).equivalent for g in found)
