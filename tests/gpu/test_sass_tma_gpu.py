"""The SASS tuner on a kernel that copies K and V by TMA, on a GPU: the sandbox encodes the kernel's
tensor maps from its own buffers, so the kernel computes there the same bits as the cp.async build
of the same warpgroup form on the same inputs (a wrong map would read other data), and a short tuning
run of the kernel has no failures and leaves the program's outputs as they were."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")
pytest.importorskip("cuda.bindings")

from benchmarks.variants import family  # noqa: E402
from mirage.codegen.lower_program import generate_cuda_program  # noqa: E402
from mirage.codegen.runtime import build_many  # noqa: E402
from mirage.optimizer import OptimizerOptions  # noqa: E402
from mirage.sass.evaluate import EvaluatorOptions  # noqa: E402
from mirage.sass.mugraph import launch_specs, tune_program  # noqa: E402
from mirage.sass.mutation import MoveSet  # noqa: E402
from mirage.sass.search import Budget, SearchOptions  # noqa: E402
from mirage.sass.tune import TuneOptions  # noqa: E402
from mirage.sass.worker import Session  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

PICK = "kv_splits=16,q_splits=4,iters=2,threads=128"  # gqa_b1's pick on the H200
WARPGROUP = OptimizerOptions(stages=2, warpgroup_softmax=True)
SMALL = TuneOptions(budget=Budget(candidates=8, time_s=30), timing_repeats=3, finalists=2, verify_sets=8,
                    search=SearchOptions(move_set=MoveSet.SWAP, repair_stalls=True, progress=False),
                    evaluator=EvaluatorOptions(rounds=5))


@pytest.fixture(scope="module")
def builds():
    graph = next(g for row, g in family("gqa_b1") if PICK in row.label)
    tma, plain = build_many([generate_cuda_program(graph, None, options=dataclasses.replace(
        WARPGROUP, tma_copies=True)), generate_cuda_program(graph, None, options=WARPGROUP)])
    assert tma.cuda.kernels[0].tensor_maps and not plain.cuda.kernels[0].tensor_maps
    return tma, plain


def test_the_sandbox_maps_give_the_cp_async_bits(builds):
    tma, plain = builds
    spec, plain_spec = launch_specs(tma)[0], launch_specs(plain)[0]
    assert len(spec.tensor_maps) == 2 and spec.kernel == plain_spec.kernel
    sessions = [Session(s, Path(p.cubin).read_bytes(), seeds=[0, 1])
                for s, p in ((spec, tma), (plain_spec, plain))]
    assert all(s.unwritten == 0 for s in sessions)
    for mine, theirs in zip(sessions[0].references, sessions[1].references, strict=True):
        for a, b in zip(mine, theirs, strict=True):
            assert bool((a.view("uint8") == b.view("uint8")).all())
    sessions[0].calibrate(200.0)  # timed launches through the driver run too


def test_short_tuning_run_of_a_tma_kernel(builds):
    tma, _ = builds
    kernel = tma.cuda.kernels[0].name
    tuned, (result,) = tune_program(tma, SMALL, kernels=[kernel], scale=0.5)
    summary = result.summary()
    assert summary["candidates"] >= 1 and summary["legality_failures"] == 0
    assert summary["verification"]["status"] == "ok"
    generator = torch.Generator(device="cuda").manual_seed(3)
    inputs = [(0.5 * torch.randn(t.shape, generator=generator, device="cuda")).to(t.dtype.torch())
              for t in tma.graph.input_types]
    for before, after in zip(tma(*inputs), tuned(*inputs), strict=True):
        assert torch.equal(before.view(torch.int16), after.view(torch.int16))
