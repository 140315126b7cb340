"""An online-softmax chain's results that only their output savers read go from its registers to the
device outputs after the loop (``OptimizerOptions.softmax_output_stores``), on a GPU.

Each member is built with the stores and without (through shared tiles and the savers' passes), in
the warp-MMA form and the warpgroup form (with TMA copies), and must pass the float check against the
float64 reference and give the same bits as the tiled build over three launches into poisoned
buffers: the same fp32 values are converted once either way. The members cover one and two key
groups a row tile (two groups merge through the scratch before the stores) and QKNorm with its keys
normalized first and with per-key factors.
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

from gpu_helpers import assert_checked_and_matching  # noqa: E402

from benchmarks.variants import family  # noqa: E402
from mirage.codegen.lower_program import generate_cuda_program  # noqa: E402
from mirage.codegen.runtime import build_many  # noqa: E402
from mirage.optimizer import OptimizerOptions  # noqa: E402

pytestmark = pytest.mark.gpu

MEMBERS = {  # the suite's attention picks on the H200, and members of two key groups
    "gqa_b1": ("gqa_b1", "kv_splits=16,q_splits=4,iters=2,threads=128,", "combine_rows=8"),
    "gqa_b1_groups": ("gqa_b1", "kv_splits=16,q_splits=4,iters=2,threads=256,", "combine_rows=8"),
    "gqa_b8": ("gqa_b8", "kv_splits=4,q_splits=2,iters=8,threads=256,", "combine_rows=8"),
    "qknorm_b8": ("qknorm_b8", "kv_splits=4,q_splits=4,iters=8,threads=128,", "combine_rows=8,normalize_k"),
    "qknorm_b1_scales": ("qknorm_b1", "kv_splits=16,q_splits=4,iters=2,threads=128,",
                         "combine_rows=8,key_scales"),
}
FORMS = {"warp": {}, "warpgroup": {"warpgroup_softmax": True, "tma_copies": True}}
ON, OFF = {"softmax_output_stores": True}, {"softmax_output_stores": False}


def _member(case: str, *parts: str):
    return next(g for row, g in family(case, wide=True) if all(p in row.label for p in parts))


@pytest.fixture(scope="module")
def built() -> dict:
    graphs, programs = {}, []
    for name, (case, *parts) in MEMBERS.items():
        graph = _member(case, *parts)
        for form, settings in FORMS.items():
            graphs[name, form] = graph
            for extra in (ON, OFF):
                options = dataclasses.replace(OptimizerOptions(), **settings, **extra)
                programs.append(generate_cuda_program(graph, None, options=options))
    marker = "results that only their output savers read go from the chain's registers"
    assert all(marker in p.code for p in programs[0::2]) and not any(marker in p.code for p in programs[1::2])
    built = build_many(programs)
    return {key: (graph, built[2 * k], built[2 * k + 1]) for k, (key, graph) in enumerate(graphs.items())}


def _identical(x, y):
    assert torch.equal(x, y), f"max difference {(x.float() - y.float()).abs().max().item()}"


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("name", list(MEMBERS))
def test_chain_results_stored_from_registers_match_the_tiled_build(built, name, form):
    graph, ours, theirs = built[name, form]
    assert_checked_and_matching(graph, ours, theirs, seed=13, same=_identical)
