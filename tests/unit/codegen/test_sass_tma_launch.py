"""Launch descriptions of generated kernels that copy K and V by TMA (``OptimizerOptions.tma_copies``):
each tensor map becomes a by-value argument after the buffers, naming the buffer it describes with
that input's shape, strides and box, so that the sandbox encodes it from its own buffer; the
description fits the compiled kernel's parameter table and survives its JSON form."""

from __future__ import annotations

import dataclasses
import json

import pytest
from codegen_helpers import needs_nvcc

from benchmarks.variants import family
from mirage.codegen.compile import CompileOptions, compile_sources
from mirage.codegen.lower_program import generate_cuda_program
from mirage.codegen.runtime import Program
from mirage.mugraph.target import TARGETS
from mirage.optimizer import OptimizerOptions
from mirage.sass.elf import Cubin
from mirage.sass.errors import LaunchSpecError
from mirage.sass.launch import BufferArgument, LaunchSpec, TensorMapArgument, check_against_cubin
from mirage.sass.mugraph import launch_specs

PICK = "kv_splits=16,q_splits=4,iters=2,threads=128"  # gqa_b1's pick on the H200
TMA = OptimizerOptions(stages=2, warpgroup_softmax=True, tma_copies=True)


@pytest.fixture(scope="module")
def cuda():
    graph = next(g for row, g in family("gqa_b1") if PICK in row.label)
    return generate_cuda_program(graph, 90, options=TMA)


def test_tensor_maps_follow_the_buffers_and_name_k_and_v(cuda):
    (attention, combine) = launch_specs(cuda)
    assert not combine.tensor_maps  # the combine kernel copies nothing by TMA
    launch = cuda.kernels[0]
    k, v = attention.tensor_maps
    buffers = [a for a in attention.arguments if isinstance(a, BufferArgument)]
    assert attention.arguments == (*buffers, k, v) and len(buffers) == len(launch.arguments)
    by_name = {b.name: b for b in buffers}
    assert (by_name[k.source].shape, k.shape, k.strides) == ((2, 64, 4096),) * 2 + ((64 * 4096, 4096, 1),)
    assert (by_name[v.source].shape, v.shape, v.strides) == ((2, 4096, 64),) * 2 + ((4096 * 64, 64, 1),)
    assert [(m.box, m.swizzle, m.transposed) for m in (k, v)] == [
        (s.box, s.swizzle, s.transposed) for s in launch.tensor_maps]
    assert LaunchSpec.from_json(attention.to_json()) == attention


@needs_nvcc
def test_the_description_fits_the_compiled_kernel(cuda, tmp_path):
    (result,) = compile_sources([cuda.code], CompileOptions(target=TARGETS["H100"]))
    path = tmp_path / "kernel.cubin"
    path.write_bytes(result.cubin())
    cubin = Cubin.read(path)
    for spec in launch_specs(Program(cuda, path)):
        check_against_cubin(spec, cubin)  # two 128-byte parameters after the pointers
    (attention, _) = launch_specs(Program(cuda, path))
    without = dataclasses.replace(attention, arguments=attention.arguments[:-1])
    with pytest.raises(LaunchSpecError, match="parameters"):
        check_against_cubin(without, cubin)


def test_a_map_must_read_an_input_buffer_of_16_bit_elements(cuda):
    (attention, _) = launch_specs(cuda)
    k = attention.tensor_maps[0]
    output = attention.outputs[0].name
    for source in ("missing", output):
        bad = dataclasses.replace(k, source=source)
        arguments = (*attention.arguments[:-2], bad, attention.arguments[-1])
        with pytest.raises(LaunchSpecError, match="not an input buffer of 16-bit"):
            dataclasses.replace(attention, arguments=arguments)
    with pytest.raises(LaunchSpecError, match="rank 1 to 4"):
        TensorMapArgument("m", k.source, (1, 2), (2,), (1, 1, 64, 64))
    assert json.loads(attention.to_json())["arguments"][-1]["kind"] == "tensor_map"
