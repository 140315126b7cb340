"""Padded tensor-core products and uneven grids on a GPU, against float64 with outputs poisoned first so
that an unwritten element shows:

* the µGraphs of benchmarks/mugraphs/padded.py (``dev::TensorCoreMatmul`` with K or N no whole atom:
  attention over ViT's 197 and CLIP's 77 tokens, one block per head; products whose N tile is 197, 100
  or 136, whose K step is 111, 50 or 100, in fp16, bf16 and fp32 (TF32 atoms: a product that lowering
  refused before, as on the CUDA cores); the online-softmax chain over 100 keys a step, 112 run), at
  two input scales (the larger one makes garbage in the padding visible as NaN or a far-off sum);
* the µGraphs of benchmarks/mugraphs/uneven.py (``BlockGraph.spans``: ViT's 197-token attention in
  blocks of 50 and of 16 query rows, CLIP's 77 in blocks of 16, a projection and an RMS norm of 197
  rows), the overlapping rows included (seed 11)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("cupy")

from benchmarks.mugraphs.padded import GRAPHS  # noqa: E402
from benchmarks.mugraphs.uneven import GRAPHS as UNEVEN  # noqa: E402
from tests.gpu.gpu_helpers import assert_matches_float64, built_collection  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def built():
    return built_collection({**GRAPHS, **{f"uneven_{name}": build for name, build in UNEVEN.items()}})


# the attention µGraphs take exp of unshifted scores: at 4× the inputs those overflow fp16
CASES = [(name, 1.0) for name in GRAPHS] + [(name, 4.0) for name in GRAPHS if not name.endswith("attention")]


@pytest.mark.parametrize(("name", "scale"), CASES)
def test_padded_products_match_float64(built, name, scale):
    graph, program = built[name]
    assert_matches_float64(graph, program, seed=7, name=name, scale=scale)


@pytest.mark.parametrize("name", list(UNEVEN))
def test_uneven_graphs_match_float64(built, name):
    graph, program = built[f"uneven_{name}"]
    assert_matches_float64(graph, program, seed=11, name=name)
