"""The runtime (mirage.codegen.runtime) without a GPU: kernel-level ops through torch, input checks,
and building programs through the compile cache (nvcc runs; nothing is launched)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from codegen_helpers import needs_nvcc

import mirage as mi
from mirage.codegen import runtime as runtime_module
from mirage.codegen.compile import CompileError, CompileOptions
from mirage.codegen.lower_program import generate_cuda_program
from mirage.codegen.runtime import LaunchError, Program, build, compile_program
from mirage.mugraph.target import TARGETS


def kernel_level_graph(op: str) -> mi.KernelGraph:
    g = mi.new_kernel_graph(f"kernel_{op}")
    x = g.new_input(dims=(4, 16), dtype=mi.float32)
    w = g.new_input(dims=(16, 8), dtype=mi.float32)
    y = g.matmul(x, w)
    table = {
        "exp": lambda: g.exp(y),
        "silu": lambda: g.silu(y),
        "gelu": lambda: g.gelu(y),
        "gelu_erf": lambda: g.gelu_erf(y),
        "relu": lambda: g.relu(y),
        "sigmoid": lambda: g.sigmoid(y),
        "tanh": lambda: g.tanh(y),
        "log": lambda: g.log(g.square(y)),
        "softplus": lambda: g.softplus(g.mul_scalar(y, 10.0)),
        "clamp": lambda: g.clamp(y, -0.5, 0.5),
        "reduction": lambda: g.reduction(y, 1),
        "reduction_max": lambda: g.reduction_max(y, 0),
        "rms_norm": lambda: g.rms_norm(y, eps=1e-6),
        "square_sqrt": lambda: g.sqrt(g.square(y)),
        "scalars": lambda: g.add_scalar(g.mul_scalar(y, 0.25), 1.0),
        "div": lambda: g.div(y, g.exp(y)),
    }
    g.mark_output(table[op]())
    return g.freeze()


KERNEL_OPS = [
    "exp",
    "silu",
    "gelu",
    "gelu_erf",
    "relu",
    "sigmoid",
    "tanh",
    "log",
    "softplus",
    "clamp",
    "reduction",
    "reduction_max",
    "rms_norm",
    "square_sqrt",
    "scalars",
    "div",
]


@pytest.mark.parametrize("op", KERNEL_OPS)
def test_kernel_level_ops_run_through_torch(op):
    """A graph without graph-defined ops needs no kernels: torch computes the registry formulas."""
    graph = kernel_level_graph(op)
    program = build(generate_cuda_program(graph, 90))
    assert program.cubin is None and program.cuda.kernels == ()
    generator = torch.Generator().manual_seed(1)
    inputs = [torch.randn(t.shape, generator=generator) for t in graph.input_types]
    (out,) = program(*inputs)
    (expected,) = mi.interpret(graph, inputs)
    np.testing.assert_allclose(out.numpy(), expected, rtol=2e-5, atol=2e-5)


def test_program_checks_its_inputs():
    graph = kernel_level_graph("exp")
    program = build(generate_cuda_program(graph, 90))
    x, w = torch.zeros(4, 16), torch.zeros(16, 8)
    with pytest.raises(LaunchError, match="takes 2 inputs, got 1"):
        program(x)
    with pytest.raises(LaunchError, match=r"input 1 has shape \(8, 16\)"):
        program(x, torch.zeros(8, 16))
    with pytest.raises(LaunchError, match="cast it first"):
        program(x, w.half())
    with pytest.raises(LaunchError, match="pass torch tensors"):
        program(x, np.zeros((16, 8), np.float32))





def tiny() -> mi.KernelGraph:
    g = mi.new_kernel_graph("tiny")
    x = g.new_input(dims=(8, 64), dtype=mi.float16)
    tb = mi.new_threadblock_graph(grid_dim=(2, 1, 1), block_dim=(64, 1, 1), forloop_range=2)
    tb.new_output(
        tb.forloop_accum(tb.sigmoid(tb.new_input(x, input_map=(0, -1, -1), forloop_dim=1))),
        output_map=(0, -1, -1),
    )
    (o,) = g.customized([x], tb)
    g.mark_output(o)
    return g.freeze()


@needs_nvcc
def test_generated_kernels_need_cuda_tensors(tmp_path, monkeypatch):
    monkeypatch.setenv("MIRAGE_CACHE_DIR", str(tmp_path))
    program = compile_program(tiny(), TARGETS["H100"])
    assert program.cubin is not None and program.cubin.is_file()
    assert program.cubin.read_bytes()[:4] == b"\x7fELF"
    with pytest.raises(LaunchError, match="need CUDA tensors"):
        program(torch.zeros(8, 64, dtype=torch.float16))


@needs_nvcc
def test_nvcc_failure_is_reported_and_not_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("MIRAGE_CACHE_DIR", str(tmp_path))
    cuda = generate_cuda_program(tiny(), 90)
    broken = cuda.__class__(
        cuda.graph,
        cuda.code.replace("mirage::gen::fill", "mirage::gen::no_such_function"),
        cuda.kernels,
        cuda.target,
    )
    if "no_such_function" not in broken.code:
        broken = cuda.__class__(
            cuda.graph, cuda.code + '\nstatic_assert(false, "broken");\n', cuda.kernels, cuda.target
        )
    with pytest.raises(CompileError) as caught:
        build(broken, CompileOptions())
    message = str(caught.value)
    assert "nvcc" in message and "-gencode=arch=compute_90a,code=sm_90a" in message and "error" in message
    cubins = list((tmp_path / "cubins").rglob("kernel.cubin"))
    assert cubins == []  # nothing cached from the failed build
    assert isinstance(build(cuda), Program)  # the intact source still builds


def test_program_without_kernels_on_cpu_is_a_callable_launcher():
    from mirage.codegen.runtime import compile_graph

    graph = kernel_level_graph("reduction")
    launch = compile_graph(graph)
    x, w = torch.ones(4, 16), torch.ones(16, 8)
    (out,) = launch([x, w])
    assert out.shape == (4, 1) and torch.all(out == 128.0)


def test_kernel_level_ops_compute_in_fp32():
    """fp16 rms_norm of values past 256 would overflow in fp16 (x² > 65504); the runtime computes in fp32."""
    g = mi.new_kernel_graph("large_rows")
    x = g.new_input(dims=(4, 16), dtype=mi.float16)
    g.mark_output(g.rms_norm(g.mul_scalar(x, 300.0), eps=1e-5))
    graph = g.freeze()
    program = build(generate_cuda_program(graph, 90))
    inputs = [torch.ones(4, 16, dtype=torch.float16)]
    (out,) = program(*inputs)
    assert out.dtype == torch.float16
    (expected,) = mi.interpret(graph, inputs)
    np.testing.assert_allclose(out.float().numpy(), expected, rtol=1e-3)


@needs_nvcc
def test_compile_chosen_builds_as_profiling_chose(monkeypatch):
    """The pipeline depth and launch mode that selection picked (kept in the search cache as a
    dict) are what the frontend's program is built with."""
    import mirage.codegen.lower_program as lower_program
    from benchmarks.mugraphs import CASES
    from mirage.codegen.runtime import BuildChoice, compile_chosen

    chosen = BuildChoice.from_dict({"stages": 3, "dependent_launch": False, "spread_blocks": True})
    assert chosen == BuildChoice(3, False, True) and BuildChoice.from_dict(chosen.as_dict()) == chosen
    assert BuildChoice.from_dict({"stages": 3}) == BuildChoice(3)  # entries written before a field existed
    assert BuildChoice.from_dict(None) == BuildChoice()
    monkeypatch.setattr(lower_program, "target_for", lambda arch, target: TARGETS["H100"])  # no GPU here
    graph = CASES["rmsnorm_b1"].fused()
    program, default = compile_chosen(graph, chosen.as_dict()), compile_chosen(graph)
    assert not program.dependent_launch and default.dependent_launch
    assert program.spread_blocks and not default.spread_blocks
    assert "Pipeline<3>" in program.source and "Pipeline<3>" not in default.source


def two_kernels(return_middle: bool, torch_reads_middle: bool) -> mi.KernelGraph:
    """``exp`` of X in one kernel, ``exp`` of that in a second; the middle tensor is returned or read
    by a kernel-level op as asked."""
    g = mi.new_kernel_graph("two_kernels")
    x = g.new_input(dims=(8, 64), dtype=mi.float16)
    values = [x]
    for _ in range(2):
        tb = mi.new_threadblock_graph(grid_dim=(8, 1, 1), block_dim=(128, 1, 1), forloop_range=1)
        bx = tb.new_input(values[-1], input_map=(0, -1, -1), forloop_dim=-1)
        tb.new_output(tb.forloop_accum(tb.exp(bx)), output_map=(0, -1, -1))
        values += g.customized([values[-1]], tb)
    g.mark_output(values[2])
    if return_middle:
        g.mark_output(values[1])
    if torch_reads_middle:
        g.mark_output(g.exp(values[1]))
    return g.freeze()


@pytest.mark.parametrize("return_middle, torch_reads_middle", [(False, False), (True, False), (False, True)])
def test_launch_plan_keeps_only_tensors_that_kernels_alone_read(return_middle, torch_reads_middle):
    """A kernel output that only later kernels read is kept from call to call (scratch); one the
    program returns or a torch op reads is allocated afresh in each call."""
    program = Program(generate_cuda_program(two_kernels(return_middle, torch_reads_middle), 90), None)
    _, steps, _ = program._steps()
    kernels = [kinds for kind, kinds, _ in steps if kind == "kernel"]
    assert len(kernels) == 2
    (first,), (second,) = kernels
    assert first[2] is not (return_middle or torch_reads_middle)
    assert second[2] is False  # the program's result


def test_a_call_holds_its_streams_scratch_while_it_launches(monkeypatch):
    """Two threads calling one program on one stream must not interleave their kernels over the kept
    tensors: each call holds the scratch's lock from its first launch to its last (launches faked)."""
    import mirage.codegen.runtime as runtime

    program = Program(generate_cuda_program(two_kernels(False, False), 90), None)
    monkeypatch.setattr(runtime, "_raw_stream", lambda index: 7)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    held = []

    def launch(self, launch, outputs, inputs, stream=None):
        (scratch,) = self._scratches.values()
        held.append((stream, scratch.lock.locked(), outputs[0].data_ptr()))

    monkeypatch.setattr(Program, "_launch", launch)
    results = [program.run([torch.full((8, 64), v, dtype=torch.float16)]) for v in (0.0, 1.0)]
    assert len(results) == 2 and [(s, locked) for s, locked, _ in held] == [(7, True)] * 4
    assert held[0][2] == held[2][2] and held[1][2] != held[3][2]  # the middle kept, the result fresh
    (scratch,) = program._scratches.values()
    assert not scratch.lock.locked()  # released after each call


def test_waves_are_named_once_per_case(caplog, monkeypatch):
    """A kernel whose clusters run in waves is named once per process for each distinct case (a
    selection loads many builds of one kernel)."""
    monkeypatch.setattr(runtime_module, "_CLUSTER_WAVES_WARNED", set())
    with caplog.at_level(logging.WARNING, logger=runtime_module.log.name):
        assert not runtime_module.warn_cluster_waves("k4", 64, 2, 66)  # every cluster at once
        assert runtime_module.warn_cluster_waves("k4", 768, 2, 264)
        assert not runtime_module.warn_cluster_waves("k4", 768, 2, 264)  # another build of the same kernel
        assert runtime_module.warn_cluster_waves("k4", 768, 2, 198)  # another launch mode: other numbers
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert messages[0].startswith("k4: 768 clusters of 2 blocks, but the GPU runs 264 at once")
    assert "multicast_cluster" in messages[0]


def test_first_plain_launches_only_the_later_kernels_as_dependents():
    """``Program.first_plain``: every kernel but the program's first may start under the one before
    it; without dependent launches none does."""
    import dataclasses

    from mirage.codegen.lower_program import generate_cuda_program
    from mirage.codegen.runtime import Program

    cuda = generate_cuda_program(two_kernels(False, False), 90)
    first, second = cuda.kernels
    program = Program(cuda, None)
    assert program.overlaps(first) and program.overlaps(second)
    inner = dataclasses.replace(program, first_plain=True)
    assert not inner.overlaps(first) and inner.overlaps(second)
    plain = dataclasses.replace(inner, dependent_launch=False)
    assert not plain.overlaps(first) and not plain.overlaps(second)
