"""Padded tensor-core products on a GPU (``dev::TensorCoreMatmul`` with K or N no whole atom): the
µGraphs of benchmarks/mugraphs/padded.py (attention over ViT's 197 and CLIP's 77 tokens, one
block per head; products whose N tile is 197, 100 or 136, whose K step is 111, 50 or 100, in fp16,
bf16 and fp32 (TF32 atoms: a product that lowering refused before, as on the CUDA cores)) match
their float64 reference, outputs poisoned first so that an unwritten element shows, at two input
scales (the larger one makes garbage in the padding visible as NaN or a far-off sum)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("cupy")

from benchmarks.mugraphs.padded import GRAPHS  # noqa: E402
from mirage.codegen.gpu_check import check_on_gpu  # noqa: E402
from mirage.codegen.lower_program import generate_cuda_program  # noqa: E402
from mirage.codegen.runtime import build_many  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def built():
    graphs = {name: build() for name, build in GRAPHS.items()}
    programs = build_many([generate_cuda_program(g, None) for g in graphs.values()])
    return {name: (graphs[name], program) for name, program in zip(graphs, programs, strict=True)}


# the attention µGraphs take exp of unshifted scores: at 4× the inputs those overflow fp16
CASES = [(name, 1.0) for name in GRAPHS] + [(name, 4.0) for name in GRAPHS if not name.endswith("attention")]


@pytest.mark.parametrize(("name", "scale"), CASES)
def test_padded_products_match_float64(built, name, scale):
    graph, program = built[name]
    result = check_on_gpu(graph, program, seed=7, scale=scale, name=name)
    assert result.passed, result.failure()
    assert result.unwritten == 0
