"""Block products of a K or an N that is no whole tensor-core atom, too large for the CUDA cores, run
padded on tensor cores: the µGraphs of benchmarks/mugraphs/padded.py compute what PyTorch does
(float64, through the interpreter) and compile for sm_90a with their products as HMMAs
(tests/gpu/test_padded_products_gpu.py runs them), and so do random µGraphs of odd tile dims
(``random_graph(seed, odd=True)``)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from codegen_helpers import compile_collection, needs_nvcc

from benchmarks.mugraphs.padded import GRAPHS
from mirage.codegen.compile import CompileOptions, Stage, compile_sources
from mirage.codegen.lower_program import generate_cuda_program
from mirage.codegen.random_graphs import random_graph
from mirage.codegen.toolchain import library_include_dir
from mirage.mugraph.interpret import interpret
from mirage.mugraph.target import TARGETS
from mirage.mugraph.tensor_cores import MAX_SIMT_ROUNDS


def test_the_search_and_the_device_library_share_the_cuda_core_limit():
    header = (library_include_dir() / "mirage" / "matmul.cuh").read_text()
    (value,) = re.findall(r"inline constexpr int kMaxSimtRounds = (\d+);", header)
    assert int(value) == MAX_SIMT_ROUNDS


def _torch_reference(name: str, inputs: list[np.ndarray]) -> np.ndarray:
    tensors = [torch.from_numpy(x).double() for x in inputs]
    if name.endswith("attention"):
        q, k, v, *mask = tensors  # a causal mask: the input that names its pattern
        scores = q @ k * q.shape[-1] ** -0.5 + (mask[0] if mask else 0)
        return (torch.softmax(scores, dim=-1) @ v).numpy()
    x, w = tensors
    return (x @ w).numpy()


@pytest.mark.parametrize("name", list(GRAPHS))
def test_the_graphs_compute_the_programs_function(name):
    graph = GRAPHS[name]()
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(t.shape) for t in graph.input_types]
    (got,) = interpret(graph, inputs, dtype=np.float64)
    np.testing.assert_allclose(got, _torch_reference(name, inputs), rtol=1e-9, atol=1e-9)


@needs_nvcc
def test_padded_products_compile_to_tensor_core_instructions():
    for name, result in compile_collection(GRAPHS).items():
        sass = result.sass()
        assert "HMMA" in sass, name
        assert "LDL" not in sass and "STL" not in sass, f"{name} spills"


# random µGraphs of odd tile dims whose products run padded (fp16; 27 batched)
ODD_SEEDS = [3, 13, 27, 47]


@needs_nvcc
def test_random_graphs_of_odd_dims_compile_with_padded_products():
    graphs = [random_graph(seed, odd=True).graph for seed in ODD_SEEDS]
    results = compile_sources([generate_cuda_program(g, 90).code for g in graphs],
                              CompileOptions(target=TARGETS["H100"]), dumps={Stage.SASS},
                              return_exceptions=True)
    for graph, result in zip(graphs, results, strict=True):
        assert not isinstance(result, Exception), f"{graph.name}: {result}"
        assert "HMMA" in result.sass(), graph.name
