"""Opaque unary ops (sigmoid, tanh, silu, gelu in both forms, softplus) as the epilogue of a fused matmul:
each µGraph lowers to its device functor and compiles for sm_90a; ``tests/gpu/test_unary_epilogues_gpu.py``
runs the same µGraphs against the float64 reference."""

from __future__ import annotations

import pytest
from codegen_helpers import needs_nvcc

from mirage.codegen.compile import CompileOptions, compile_sources
from mirage.codegen.lower_program import generate_cuda_program
from mirage.mugraph.target import TARGETS
from tests.unit.optimizer.optimizer_graphs import matmul_epilogue

FUNCTORS = {"sigmoid": "mirage::dev::Sigmoid", "tanh": "mirage::dev::Tanh", "silu": "mirage::dev::Silu",
            "gelu": "mirage::gen::GeluTanh", "gelu_erf": "mirage::dev::Gelu",
            "softplus": "mirage::dev::Softplus", "erf": "mirage::dev::Erf", "expm1": "mirage::dev::Expm1",
            "sin": "mirage::dev::Sin", "cos": "mirage::dev::Cos"}


@needs_nvcc
def test_unary_epilogues_lower_to_their_functors_and_compile():
    programs = {op: generate_cuda_program(matmul_epilogue(op), 90) for op in FUNCTORS}
    for op, program in programs.items():
        assert FUNCTORS[op] in program.code, op
    results = compile_sources([p.code for p in programs.values()], CompileOptions(target=TARGETS["H100"]),
                              return_exceptions=True)
    for op, result in zip(programs, results, strict=True):
        assert not isinstance(result, Exception), f"{op}: {result}"
        assert result.cubin()[:4] == b"\x7fELF"


@pytest.mark.parametrize("op", sorted(FUNCTORS))
def test_unary_epilogue_interprets_as_torch(op):
    """The reference interpreter computes the registry's formula, as torch does."""
    import torch
    import torch.nn.functional as F

    from mirage.mugraph.interpret import interpret

    x, w = torch.randn(16, 256, dtype=torch.float64), torch.randn(256, 512, dtype=torch.float64) / 16
    (got,) = interpret(matmul_epilogue(op), [x.half(), w.half()], dtype="float64")
    y = x.half().double() @ w.half().double()
    expected = {"sigmoid": torch.sigmoid, "tanh": torch.tanh, "silu": F.silu,
                "gelu": lambda v: F.gelu(v, approximate="tanh"), "gelu_erf": F.gelu,
                "softplus": F.softplus, "erf": torch.erf, "expm1": torch.expm1, "sin": torch.sin,
                "cos": torch.cos}[op](y)
    torch.testing.assert_close(torch.as_tensor(got, dtype=torch.float64), expected, rtol=1e-9, atol=1e-9)
