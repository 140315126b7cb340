"""Builds that would take minutes: a compiler run past ``MIRAGE_COMPILE_TIME_LIMIT`` is stopped, with the
processes it started, and fails as a build with a message that names the limit (a µGraph of odd tiles
once kept cicc busy for minutes and stalled a whole selection); a product that would run on the CUDA
cores with too many outputs a thread, what made those builds slow, is not generated at all (products
that tensor cores can read run there, padded where their shape needs)."""

from __future__ import annotations

import time

import pytest

from mirage import config
from mirage.codegen import compile as compiling
from mirage.codegen.compile import CompileError, Stage
from mirage.errors import MirageError


def test_a_run_past_the_limit_fails_and_leaves_no_process(monkeypatch, tmp_path):
    monkeypatch.setenv("MIRAGE_COMPILE_TIME_LIMIT", "0.5")
    marker = tmp_path / "child-finished"
    start = time.perf_counter()
    with pytest.raises(CompileError, match="compile time limit") as error:
        compiling._run(Stage.CUBIN, ["sh", "-c", f"sleep 2; touch {marker}"], tmp_path)
    assert time.perf_counter() - start < 1.5 and error.value.stage is Stage.CUBIN
    time.sleep(2.0)
    assert not marker.exists()  # the shell's child was stopped too


def test_a_run_within_the_limit_returns_its_output(monkeypatch, tmp_path):
    monkeypatch.setenv("MIRAGE_COMPILE_TIME_LIMIT", "10")
    assert compiling._run(Stage.CUBIN, ["sh", "-c", "echo built"], tmp_path).stdout == "built\n"
    with pytest.raises(CompileError, match="exit status 3"):
        compiling._run(Stage.CUBIN, ["sh", "-c", "exit 3"], tmp_path)


@pytest.mark.parametrize("value", ["soon", "0", "-4"])
def test_a_limit_that_is_not_a_positive_number_is_refused(monkeypatch, value):
    monkeypatch.setenv("MIRAGE_COMPILE_TIME_LIMIT", value)
    with pytest.raises(MirageError, match="MIRAGE_COMPILE_TIME_LIMIT"):
        config.compile_time_limit_s()


def _gemm(m: int, n: int, k: int):
    import mirage as mi

    g = mi.new_kernel_graph()
    x = g.new_input(dims=(m, 4 * k), dtype=mi.float16)
    w = g.new_input(dims=(4 * k, 8 * n), dtype=mi.float16)
    tb = mi.new_threadblock_graph(grid_dim=(8, 1, 1), block_dim=(128, 1, 1), forloop_range=4)
    xt = tb.new_input(x, input_map=(-1, -1, -1), forloop_dim=1)
    wt = tb.new_input(w, input_map=(1, -1, -1), forloop_dim=0)
    tb.new_output(tb.forloop_accum(tb.matmul(xt, wt)), output_map=(1, -1, -1))
    (y,) = g.customized([x, w], tb)
    g.mark_output(y)
    return g.freeze()


def _product_of_products():
    """(X·A ⊙ X·B) · W: the A operand of the last product is an element-wise tile of 80 × 12, which the
    memory plan leaves at a dense pitch (12 halves, not whole 16-byte vectors), so tensor cores cannot
    read it; 80 × 200 outputs over 128 threads would be 125 a thread on the CUDA cores."""
    import mirage as mi

    g = mi.new_kernel_graph()
    x = g.new_input(dims=(80, 40), dtype=mi.float16)
    w1, w2 = (g.new_input(dims=(40, 12), dtype=mi.float16) for _ in range(2))
    w = g.new_input(dims=(12, 800), dtype=mi.float16)
    tb = mi.new_threadblock_graph(grid_dim=(4, 1, 1), block_dim=(128, 1, 1), forloop_range=1)
    xt, a, b = (tb.new_input(t, input_map=(-1, -1, -1), forloop_dim=-1) for t in (x, w1, w2))
    wt = tb.new_input(w, input_map=(1, -1, -1), forloop_dim=-1)
    gated = tb.mul(tb.matmul(xt, a), tb.matmul(xt, b))
    tb.new_output(tb.forloop_accum(tb.matmul(gated, wt)), output_map=(1, -1, -1))
    (y,) = g.customized([x, w1, w2, w], tb)
    g.mark_output(y)
    return g.freeze()


def test_a_cuda_core_matmul_of_too_many_outputs_a_thread_is_not_generated():
    """K = 12 is no whole tensor-core step: 128 × 72 outputs over 128 threads (72 a thread on the CUDA
    cores, where nvcc took 51 s) now run padded on tensor cores, 64 × 64 (32 a thread) on the CUDA
    cores; a product that tensor cores cannot read and the CUDA cores would take at 125 a thread is
    refused when lowered, with the reason."""
    from mirage.codegen.lower_ops import LoweringError
    from mirage.codegen.lower_program import generate_cuda_program

    generate_cuda_program(_gemm(128, 72, 12), 90)
    generate_cuda_program(_gemm(64, 64, 12), 90)
    generate_cuda_program(_gemm(256, 72, 48), 90)
    with pytest.raises(LoweringError, match=r"125 outputs a thread \(at most 64\), since tensor cores cannot "
                                            r"take 16-bit rows of 12 and \d+ elements"):
        generate_cuda_program(_product_of_products(), 90)
