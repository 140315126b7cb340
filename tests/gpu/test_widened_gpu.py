"""Kernels of few blocks built with 256, 512 and 1024 threads a block (selection's widened builds:
:func:`mirage.codegen.select.widened`) match float64 on the GPU: a log_softmax over long rows, a row
softmax, and a product with its epilogue."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

import mirage as mi  # noqa: E402
from mirage.codegen.gpu_check import check_on_gpu  # noqa: E402
from mirage.codegen.lower_program import generate_cuda_program  # noqa: E402
from mirage.codegen.runtime import build_many  # noqa: E402
from mirage.codegen.select import WIDE_THREADS, block_dims, widened  # noqa: E402
from tests.unit.optimizer.optimizer_graphs import logsumexp_block, matmul_epilogue, row_softmax  # noqa: E402

pytestmark = pytest.mark.gpu

GRAPHS = {
    "log_softmax": lambda: logsumexp_block(1, True, rows=32, cols=4096, dtype=mi.float16),
    "row_softmax": lambda: row_softmax(rows=16, cols=4096, blocks=8, threads=128, dtype=mi.float16),
    "relu_product": lambda: matmul_epilogue("relu", m=64, k=512, n=512),
}


@pytest.fixture(scope="module")
def built() -> dict:
    graphs = {(name, t): copy for name, make in GRAPHS.items()
              for t, copy in zip(WIDE_THREADS, widened(make(), sms=132), strict=True)}
    programs = build_many([generate_cuda_program(g) for g in graphs.values()])
    return {key: (graphs[key], program) for key, program in zip(graphs, programs, strict=True)}


@pytest.mark.parametrize("threads", WIDE_THREADS)
@pytest.mark.parametrize("name", GRAPHS)
def test_widened_builds_match_float64(built, name, threads):
    graph, program = built[(name, threads)]
    assert not isinstance(program, Exception), program
    assert block_dims(graph)[0] == (threads, 1, 1)
    result = check_on_gpu(graph, program.with_poison())
    assert result.passed, result.as_dict()
