"""QKNorm with each key's sum of squares from a kernel of its own (``variants.attention_fused(
key_sums=True)``) on a GPU: the attention kernel's chain maps each loaded sum to its key's factor
(``gen::FactorTile``), in the warp form, the warpgroup form and the warpgroup form with K, V and the
sums copied by TMA. Every build passes the float check against the float64 reference of the suite's
QKNorm program (an independent reference: no key sums, K normalized as written), and fetching the
loop's first stages before Q's rms (``early_prologue``) changes no bit of the outputs."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

from benchmarks.mugraphs import CASES  # noqa: E402
from benchmarks.variants import attention_fused  # noqa: E402
from mirage.codegen.gpu_check import check_on_gpu, random_inputs  # noqa: E402
from mirage.codegen.lower_program import generate_cuda_program  # noqa: E402
from mirage.codegen.runtime import build_many  # noqa: E402
from mirage.optimizer import OptimizerOptions  # noqa: E402

pytestmark = pytest.mark.gpu

SPLITS = {
    "two_warpgroups": dict(kv_splits=8, q_splits=2, iters=8, threads=256, combine_rows=8),
    "one_warpgroup": dict(kv_splits=16, q_splits=4, iters=2, threads=128, combine_rows=8),
}
FORMS = {
    "warp": OptimizerOptions(),
    "warpgroup": OptimizerOptions(warpgroup_softmax=True),
    "tma": OptimizerOptions(warpgroup_softmax=True, tma_copies=True),
}


@pytest.mark.parametrize("splits", list(SPLITS))
@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("stages", [2, 3])
def test_key_sums_match_the_reference_early_or_not(splits, form, stages):
    graph = attention_fused(1, True, key_sums=True, norm_blocks=64, row_sums=True, **SPLITS[splits])
    options = dataclasses.replace(FORMS[form], stages=stages)
    early, late = build_many([
        generate_cuda_program(graph, None, options=dataclasses.replace(options, early_prologue=flag))
        for flag in (True, False)])
    reference = CASES["qknorm_b1"].reference()
    inputs = random_inputs(reference, seed=3)
    result = check_on_gpu(reference, early.with_poison(), inputs=inputs)
    assert result.passed, result.as_dict()
    expected = late(*inputs)
    for _ in range(2):  # the same bits, launch after launch
        for x, y in zip(early.with_poison()(*inputs), expected, strict=True):
            assert torch.equal(x, y)
