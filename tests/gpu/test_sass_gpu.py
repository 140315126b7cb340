"""The SASS tuner on a GPU: the sandbox runs the fixture kernels correctly, every schedule the legality
model allows computes the original's outputs, the harness catches schedules the model refuses, and a
short tuning run ends with a verified result."""

from __future__ import annotations

import random
import statistics
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
cupy = pytest.importorskip("cupy")

from mirage.sass.elf import Cubin  # noqa: E402
from mirage.sass.errors import EvaluationError  # noqa: E402
from mirage.sass.evaluate import CandidateStatus, EvaluatorOptions, SandboxEvaluator  # noqa: E402
from mirage.sass.kernel import load_kernel  # noqa: E402
from mirage.sass.launch import BufferArgument, LaunchSpec, ScalarArgument  # noqa: E402
from mirage.sass.legality import Rule, check_swap  # noqa: E402
from mirage.sass.mutation import MoveSet, apply_move, legal_moves, verify_edit  # noqa: E402
from mirage.sass.search import Budget, SearchOptions  # noqa: E402
from mirage.sass.tune import TuneOptions, tune_cubin  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sass"
ELEMENTS = 1 << 20


def elementwise_spec(kernel: str = "scaled_add_x4", x_pointer_null: bool = False) -> LaunchSpec:
    per_block = 1024 if kernel.endswith("x4") else 256
    x = ScalarArgument("x", "pointer", 0) if x_pointer_null else BufferArgument("x", (ELEMENTS,), "float32")
    return LaunchSpec(kernel=kernel, grid=(ELEMENTS // per_block, 1, 1), block=(256, 1, 1), arguments=(
        x, BufferArgument("y", (ELEMENTS,), "float32"),
        BufferArgument("out", (ELEMENTS,), "float32", output=True),
        ScalarArgument("alpha", "float32", 0.75), ScalarArgument("n", "int32", ELEMENTS)))


@pytest.fixture(scope="module")
def cubin() -> Cubin:
    return Cubin.read(FIXTURES / "elementwise.cubin")


@pytest.fixture(scope="module")
def sandbox(cubin):
    with SandboxEvaluator(cubin, elementwise_spec(), EvaluatorOptions(rounds=5, timeout_s=30)) as evaluator:
        yield evaluator


@pytest.mark.parametrize("kernel", ["scaled_add", "scaled_add_x4"])
def test_launch_path_computes_the_kernel(cubin, kernel, tmp_path):
    path = tmp_path / "k.cubin"
    cubin.write(path)
    function = cupy.RawModule(path=str(path)).get_function(kernel)
    x, y = cupy.random.standard_normal(ELEMENTS, dtype=cupy.float32), cupy.random.standard_normal(
        ELEMENTS, dtype=cupy.float32)
    out = cupy.full(ELEMENTS, cupy.nan, dtype=cupy.float32)
    spec = elementwise_spec(kernel)
    function(spec.grid, spec.block, (x, y, out, np.float32(0.75), np.int32(ELEMENTS)))
    expected = 0.75 * cupy.asnumpy(x) + cupy.asnumpy(y) ** 2
    np.testing.assert_allclose(cupy.asnumpy(out), expected, rtol=1e-6, atol=1e-6)


def test_original_against_itself_is_ok_and_unbiased(sandbox, cubin):
    # the median of five: one evaluation can be skewed when other processes share the GPU
    speedups = [sandbox.evaluate(cubin).speedup for _ in range(5)]
    assert all(s is not None for s in speedups)
    assert 0.8 < statistics.median(speedups) < 1.25, speedups


@pytest.mark.parametrize("move_set", list(MoveSet))
def test_every_schedule_the_model_allows_computes_the_same_outputs(sandbox, cubin, move_set):
    kernel = load_kernel(cubin, "scaled_add_x4")
    generator = random.Random(11)
    state = kernel
    for _ in range(8):
        moves = legal_moves(state, move_set, repair_stalls=True)
        if not moves:
            break
        state = apply_move(state, generator.choice(moves)[0], repair_stalls=True)
        verify_edit(kernel, state)
        result = sandbox.evaluate(cubin.with_text(kernel.name, state.text_bytes()))
        assert result.status is CandidateStatus.OK, result.detail


def test_value_moved_below_its_store_is_caught(sandbox, cubin):
    """The model refuses this (register dependence); forced anyway, the harness must see it fail."""
    kernel = load_kernel(cubin, "scaled_add_x4")
    position = next(p for p in range(1, len(kernel)) if kernel.instructions[p].opcode == "STG"
                    and kernel.instructions[p - 1].defs & kernel.instructions[p].uses)
    assert check_swap(kernel, position - 1, position).rule is Rule.REGISTER
    forced = kernel.swapped(position - 1)
    result = sandbox.evaluate(cubin.with_text(kernel.name, forced.text_bytes()))
    assert result.status.failed_on_gpu, result
    assert sandbox.evaluate(cubin).status is CandidateStatus.OK  # the replacement process works


def test_a_faulting_original_is_contained(cubin):
    with pytest.raises(EvaluationError, match="could not be set up"):
        with SandboxEvaluator(cubin, elementwise_spec(x_pointer_null=True),
                              EvaluatorOptions(timeout_s=30)) as evaluator:
            evaluator.evaluate(cubin)
    assert torch.ones(4, device="cuda").sum().item() == 4.0  # this process's CUDA context is untouched


def test_short_tuning_run_has_no_failures_and_a_verified_result(cubin):
    options = TuneOptions(budget=Budget(candidates=20), timing_repeats=3, verify_sets=16,
                          search=SearchOptions(move_set=MoveSet.SIP, repair_stalls=True, progress=False),
                          evaluator=EvaluatorOptions(rounds=5))
    result = tune_cubin(cubin, elementwise_spec(), options)
    summary = result.summary()
    assert summary["legality_failures"] == 0
    assert summary["verification"]["status"] == "ok"
    assert summary["candidates"] >= 1
    assert len(result.noise_speedups) == 3
