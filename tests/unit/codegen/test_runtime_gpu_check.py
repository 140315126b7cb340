"""The GPU check's comparison and suite machinery (mirage.codegen.gpu_check), exercised on the CPU
with graphs whose ops all run through torch."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import mirage as mi
from mirage.codegen.gpu_check import (
    TOLERANCES,
    SuiteCase,
    check_on_gpu,
    compare,
    random_inputs,
    run_gpu_suite,
    write_report,
)
from mirage.codegen.lower_program import generate_cuda_program
from mirage.codegen.runtime import build


def softmax_graph(name: str = "softmax") -> mi.KernelGraph:
    g = mi.new_kernel_graph(name)
    x = g.new_input(dims=(4, 32), dtype=mi.float16)
    e = g.exp(x)
    g.mark_output(g.div(e, g.reduction(e, 1)))
    return g.freeze()


def test_check_passes_a_correct_program_on_cpu():
    graph = softmax_graph()
    result = check_on_gpu(graph, build(generate_cuda_program(graph, 90)), device="cpu")
    assert result.passed and result.kernels == 0
    (output,) = result.outputs
    assert 0 < output.relative_error < TOLERANCES[mi.float16] and output.unwritten == 0


@pytest.mark.parametrize(
    "damage, unwritten, passed",
    [
        (lambda t: t, 0, True),
        (lambda t: t.index_fill(0, torch.tensor([1]), float("nan")), 32, False),  # a block that never wrote
        (lambda t: t * 1.05, 0, False),  # 5% off
        (lambda t: t + 0.001 * t.abs().max(), 0, True),  # within fp16 tolerance
    ],
)
def test_compare_flags_unwritten_and_wrong_elements(damage, unwritten, passed):
    graph = softmax_graph()
    inputs = random_inputs(graph, seed=3, device="cpu")
    (reference,) = mi.interpret(graph, inputs)
    got = damage(torch.from_numpy(reference).half())
    (check,) = compare([got], [reference], graph)
    assert check.unwritten == unwritten
    assert check.passed is passed


def test_random_inputs_are_seeded_and_rounded():
    graph = softmax_graph()
    a, b = random_inputs(graph, 7, 0.5, "cpu"), random_inputs(graph, 7, 0.5, "cpu")
    assert torch.equal(a[0], b[0]) and a[0].dtype == torch.float16
    assert 0.3 < float(a[0].float().std()) < 0.7


def test_suite_runs_cases_in_workers_and_writes_a_report(tmp_path):
    cases = [
        SuiteCase("softmax_a", "search", softmax_graph("a"), seed=1),
        SuiteCase("softmax_b", "search", softmax_graph("b"), seed=2, baseline=softmax_graph("c")),
    ]
    rows = run_gpu_suite(cases, tmp_path / "scratch", workers=1, processes=2, device="cpu")
    assert [r["name"] for r in rows] == ["softmax_a", "softmax_b"]
    assert all(r["passed"] for r in rows), rows
    assert rows[1]["baseline_error"] < 1e-2
    json_path, md_path = write_report(rows, tmp_path, "codegen_test", {"device": "cpu"}, "test")
    saved = json.loads(json_path.read_text())
    assert saved["summary"] == {"search": {"cases": 2, "passed": 2}}
    assert "| softmax_a | search | 0 | yes |" in md_path.read_text()
    assert np.isfinite(saved["cases"][0]["worst_error"])


def test_a_failed_check_says_whether_outputs_were_non_finite():
    from mirage.codegen.gpu_check import CheckResult

    graph = softmax_graph()
    inputs = random_inputs(graph, seed=3, device="cpu")
    (reference,) = mi.interpret(graph, inputs)
    good = torch.from_numpy(reference).half()
    overflowed = good.index_fill(0, torch.tensor([2]), float("inf"))
    results = [CheckResult("softmax", compare([t], [reference], graph), 0, 0.0, 0.0)
               for t in (good, overflowed, good * 1.05)]
    assert [r.failure() for r in results][0] == ""
    assert results[1].unwritten == 32 and "32 output element(s) NaN or inf" in results[1].failure()
    assert results[2].failure().startswith("relative error 0.05")


def quotient_graph() -> mi.KernelGraph:
    g = mi.new_kernel_graph("quotient")
    a = g.new_input(dims=(4, 32), dtype=mi.float16)
    b = g.new_input(dims=(4, 32), dtype=mi.float16)
    g.mark_output(g.div(a, b))
    return g.freeze()


@pytest.mark.parametrize(
    "overflow, passed",
    [
        (lambda ref: torch.sign(ref) * float("inf"), True),  # the reference rounded to float16
        (lambda ref: torch.sign(ref) * 65504.0, True),  # the largest float16, its sign kept
        (lambda ref: -torch.sign(ref) * float("inf"), False),  # the wrong sign
        (lambda ref: torch.full_like(ref, float("nan")), False),  # never written
        (lambda ref: torch.sign(ref) * 1000.0, False),  # finite, far off
    ],
)
def test_elements_beyond_the_dtype_range_must_overflow_with_their_sign(overflow, passed):
    """A quotient by a value near zero lies beyond float16 in float64: the GPU's infinity there is the
    rounded reference, not an error, and those elements leave the error's scale."""
    graph = quotient_graph()
    a = torch.tensor([[3.0, -2.0] * 16] * 4, dtype=torch.float16)
    b = torch.full((4, 32), 0.5, dtype=torch.float16)
    b[1, :2] = 1e-5  # 3 / 1e-5 and -2 / 1e-5 overflow float16
    (reference,) = mi.interpret(graph, [a, b])
    got = torch.from_numpy(reference).half()
    over = torch.from_numpy(np.abs(reference) > 65504)
    assert int(over.sum()) == 2
    got = torch.where(over, overflow(torch.from_numpy(reference)).half(), got)
    (check,) = compare([got], [reference], graph)
    assert check.passed is passed
    assert check.reference_max == 6.0  # 3 / 0.5: the overflowing quotients are left out
    assert check.unwritten == (0 if passed else 2)
