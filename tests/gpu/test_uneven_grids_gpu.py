"""Uneven grids on a GPU (``BlockGraph.spans``): the µGraphs of benchmarks/mugraphs/uneven.py (ViT's
197-token attention in blocks of 50 and of 16 query rows, CLIP's 77 in blocks of 16, a projection and
an RMS norm of 197 rows) match their float64 reference with every output element written (outputs
poisoned first), the overlapping rows included."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("cupy")

from benchmarks.mugraphs.uneven import GRAPHS  # noqa: E402
from mirage.codegen.gpu_check import check_on_gpu  # noqa: E402
from mirage.codegen.lower_program import generate_cuda_program  # noqa: E402
from mirage.codegen.runtime import build_many  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def built():
    graphs = {name: build() for name, build in GRAPHS.items()}
    programs = build_many([generate_cuda_program(g, None) for g in graphs.values()])
    return {name: (graphs[name], program) for name, program in zip(graphs, programs, strict=True)}


@pytest.mark.parametrize("name", list(GRAPHS))
def test_uneven_graphs_match_float64(built, name):
    graph, program = built[name]
    result = check_on_gpu(graph, program, seed=11, name=name)
    assert result.passed, result.failure()
    assert result.unwritten == 0
