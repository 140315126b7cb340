"""The attention members whose combine has a shape of its own (4 rows and 128 threads a block at
b = 1, 32 rows and 256 or 512 threads at b = 8; ``ATTENTION_SPLITS``' ``combine_threads``) on a GPU, in
the warpgroup form with TMA copies that selection picks: each passes the float check against the
float64 reference, with its outputs poisoned first so that an element the combine does not write fails."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

from benchmarks.variants import family  # noqa: E402
from mirage.codegen.gpu_check import check_on_gpu, random_inputs  # noqa: E402
from mirage.codegen.lower_program import generate_cuda_program  # noqa: E402
from mirage.codegen.runtime import build_many  # noqa: E402
from mirage.optimizer import OptimizerOptions  # noqa: E402

pytestmark = pytest.mark.gpu

MEMBERS = [(case, v.label) for case in ("gqa_b1", "qknorm_b1", "gqa_b8", "qknorm_b8")
           for v, _ in family(case) if "combine_threads" in v.label]
IDS = [f"{case}-{label.split('combine_')[1]}" for case, label in MEMBERS]


@pytest.mark.parametrize("case, label", MEMBERS, ids=IDS)
def test_combine_shape_members_pass_the_float_check(case, label):
    graph = next(g for v, g in family(case) if v.label == label)
    options = OptimizerOptions(warpgroup_softmax=True, tma_copies=True)
    (program,) = build_many([generate_cuda_program(graph, None, options=options)])
    result = check_on_gpu(graph, program.with_poison(), inputs=random_inputs(graph, seed=13))
    assert result.passed, result.as_dict()
