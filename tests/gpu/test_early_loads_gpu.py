"""Early loads of program inputs on a GPU (mirage.codegen.early_loads): a kernel after the program's
first copies its first weight stages before its dependency wait.

The early build must pass the float check against the float64 reference and equal the build without
early loads bit for bit over several launches (only when the weight's first stage is fetched changes),
under dependent launches. And a weight that the kernel before the program writes must be read after
that write: the kernel before the early reader signals only after its own wait.
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

from gpu_helpers import assert_checked_and_matching  # noqa: E402

from benchmarks.mugraphs import mlp  # noqa: E402
from mirage.codegen.lower_program import generate_cuda_program  # noqa: E402
from mirage.codegen.runtime import build_many  # noqa: E402
from mirage.optimizer import OptimizerOptions  # noqa: E402

pytestmark = pytest.mark.gpu


def _builds(b: int, stages: int, multicast: int):
    graph = mlp.rmsnorm_two_kernels(b, grid=128, iters=8, threads=256)
    options = dataclasses.replace(OptimizerOptions(), stages=stages, multicast_cluster=multicast)
    early = generate_cuda_program(graph, None, options=options)
    assert early.contexts[-1].early_loads and early.contexts[0].signal_after_wait
    late = generate_cuda_program(graph, None, options=dataclasses.replace(options, early_input_loads=False))
    return graph, build_many([early, late])


@pytest.mark.parametrize(("b", "stages", "multicast"), [(8, 2, 2), (8, 3, 0), (1, 2, 0)])
def test_early_build_matches_the_late_build(b, stages, multicast):
    graph, (ours, theirs) = _builds(b, stages, multicast)
    assert ours.dependent_launch
    assert_checked_and_matching(graph, ours, theirs, 3, lambda x, y: torch.equal(x, y), launches=5)


def test_a_weight_written_by_the_kernel_before_is_read_after_it():
    """Program A writes the weight (its output buffer, the same at every call) and program B reads it
    at once. A's kernel lets B's first kernel launch as soon as it starts; were B's first kernel to do
    the same, B's second kernel could copy the weight while A still writes it."""
    import mirage as mi
    from mirage.codegen.gpu_check import random_inputs

    graph, (ours, theirs) = _builds(8, 2, 2)
    x, gain, w = random_inputs(graph, seed=4)
    g = mi.new_kernel_graph("writer")
    g.mark_output(g.mul_scalar(g.new_input(dims=tuple(w.shape), dtype=mi.float16, name="S"), 1.0))
    (writer,) = build_many([generate_cuda_program(g.freeze(), None)])
    sources = [torch.randn_like(w) for _ in range(2)]
    expected = [theirs(x, gain, v)[0].clone() for v in sources]
    assert not torch.equal(expected[0], expected[1])
    for k in range(8):
        (written,) = writer(sources[k % 2])
        assert torch.equal(ours(x, gain, written)[0], expected[k % 2]), f"call {k}"
