"""Generated kernels on a GPU: every benchmark µGraph and random µGraphs run and match the float64
reference (mirage.codegen.gpu_check), programs replay inside CUDA graphs, and poisoned outputs expose
elements a kernel does not write.

The number of random µGraphs is ``MIRAGE_GPU_RANDOM`` (default 100); all programs are built in
parallel once per session.  ``python -m mirage.codegen.gpu_check gpu`` runs the same checks as a
report.
"""

from __future__ import annotations

import dataclasses
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

from benchmarks.mugraphs import CASES  # noqa: E402
from mirage.codegen.gpu_check import BENCHMARK_SCALE, check_on_gpu, random_inputs  # noqa: E402
from mirage.codegen.lower_program import generate_cuda_program  # noqa: E402
from mirage.codegen.random_graphs import random_graph  # noqa: E402
from mirage.codegen.runtime import Program, build_many, compile_graph  # noqa: E402
from tests.gpu.gpu_helpers import replayed  # noqa: E402

pytestmark = pytest.mark.gpu
RANDOM = int(os.environ.get("MIRAGE_GPU_RANDOM", "100"))


@pytest.fixture(scope="session")
def programs() -> dict[str, tuple]:
    graphs = {name: case.fused() for name, case in CASES.items()}
    graphs.update({f"random_{s}": random_graph(s).graph for s in range(RANDOM)})
    generated = {name: generate_cuda_program(g, None) for name, g in graphs.items()}
    built = build_many(list(generated.values()))
    return {name: (graphs[name], program) for name, program in zip(generated, built, strict=True)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_benchmark_mugraph_matches_reference(programs, name):
    graph, program = programs[name]
    assert isinstance(program, Program), program
    result = check_on_gpu(graph, program, scale=BENCHMARK_SCALE)
    assert result.passed, result.as_dict()


@pytest.mark.parametrize("seed", range(RANDOM))
def test_random_mugraph_matches_reference(programs, seed):
    graph, program = programs[f"random_{seed}"]
    assert isinstance(program, Program), program
    result = check_on_gpu(graph, program, seed=seed)
    assert result.passed, result.as_dict()


def test_program_replays_in_a_cuda_graph(programs):
    graph, program = programs["gqa_b1"]
    inputs = random_inputs(graph, 0, BENCHMARK_SCALE)
    eager = [o.clone() for o in program(*inputs)]
    static = replayed(program, inputs)
    assert all(torch.equal(a, b) for a, b in zip(eager, static, strict=True))


@pytest.mark.parametrize("name", ["gqa_b1", "qknorm_b8"])
def test_dependent_launches_give_the_same_results(programs, name):
    """Kernels launched to overlap their predecessor (programmatic dependent launch, the default on
    sm_90) compute exactly what ordinary launches compute, eagerly and replayed in a CUDA graph of
    back-to-back calls (where each call's first kernel overlaps the previous call's last)."""
    from mirage.codegen import dependent_launch

    graph, program = programs[name]
    assert program.dependent_launch and dependent_launch.available(torch.cuda.current_device())
    inputs = random_inputs(graph, 3, BENCHMARK_SCALE)
    plain = dataclasses.replace(program, dependent_launch=False)
    expected = [o.clone() for o in plain(*inputs)]
    assert all(torch.equal(a, b) for a, b in zip(expected, program(*inputs), strict=True))
    spread = dataclasses.replace(program, spread_blocks=True)  # one block per SM: the same results
    assert all(torch.equal(a, b) for a, b in zip(expected, spread(*inputs), strict=True))
    program(*inputs)
    torch.cuda.synchronize()
    captured = torch.cuda.CUDAGraph()
    with torch.cuda.graph(captured):
        calls = [program(*inputs) for _ in range(4)]
    for _ in range(3):
        captured.replay()
    torch.cuda.synchronize()
    for outputs in calls:
        assert all(torch.equal(a, b) for a, b in zip(expected, outputs, strict=True))


def test_poison_exposes_unwritten_elements(programs):
    """Launching fewer blocks than the grid leaves output elements unwritten: the check must see them."""
    graph, program = programs["rmsnorm_b1"]
    (launch,) = program.cuda.kernels
    short = dataclasses.replace(launch, grid=(launch.grid[0] // 2, 1, 1))
    broken = Program(dataclasses.replace(program.cuda, kernels=(short,)), program.cubin)
    result = check_on_gpu(graph, broken, scale=BENCHMARK_SCALE)
    assert not result.passed
    assert result.outputs[0].unwritten == result.outputs[0].shape[0] * result.outputs[0].shape[1] // 2


def test_frontend_launcher_runs_generated_kernels(programs):
    graph, program = programs["ntrans_b8"]
    inputs = random_inputs(graph, 1, BENCHMARK_SCALE)
    (expected,) = program(*inputs)
    (got,) = compile_graph(graph)(inputs)
    assert torch.equal(got, expected)


def test_quotient_by_a_square_root_is_within_two_ulp():
    """``x / sqrt(y² + 1)`` in float32 runs as ``x · rsqrt(y² + 1)`` (``DivSqrt``): rsqrt's 2 ulp, the
    product's and the argument's roundings, within 4 ulp of the float64 quotient."""
    import mirage as mi
    from mirage.codegen.runtime import compile_program

    g = mi.new_kernel_graph()
    x = g.new_input(dims=(64, 256), dtype=mi.float32)
    y = g.new_input(dims=(64, 256), dtype=mi.float32)
    tb = mi.new_threadblock_graph(grid_dim=(4, 1, 1), forloop_range=1)
    bx, by = tb.new_input(x, (0, -1, -1), -1), tb.new_input(y, (0, -1, -1), -1)
    quotient = tb.div(bx, tb.sqrt(tb.add_scalar(tb.square(by), 1.0)))
    tb.new_output(tb.forloop_accum(quotient), output_map=(0, -1, -1))
    (out,) = g.customized([x, y], tb)
    g.mark_output(out)
    program = compile_program(g)
    assert "DivSqrt{}" in program.cuda.code
    inputs = [torch.randn(64, 256, device="cuda") * 100 for _ in range(2)]
    (got,) = program(*inputs)
    expected = inputs[0].double() / torch.sqrt(inputs[1].double() ** 2 + 1)
    ulp = torch.finfo(torch.float32).eps * expected.abs()
    assert ((got.double() - expected).abs() <= 4 * ulp).all()
