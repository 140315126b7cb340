"""The SASS legality model keeps memory accesses out of a barrier's shadow (rule 5 of
``mirage.sass.legality``): in a generated QKNorm kernel whose warps trade key factors through shared
memory (an ``STS``, a named ``BAR.SYNC.DEFER_BLOCKING``, then ``LDS``es), ptxas leaves instructions
that touch no memory between the barrier and the first load.  On an H200 the tuner's candidate with
one such load moved up to sit right after the barrier read factors other warps had not yet written;
the model now refuses every move that brings an access closer to a barrier than ptxas put it."""

from __future__ import annotations

from pathlib import Path

import pytest
from codegen_helpers import needs_nvcc

from benchmarks.variants import family
from mirage.codegen.compile import CompileOptions, compile_sources
from mirage.codegen.lower_program import generate_cuda_program
from mirage.mugraph.target import TARGETS
from mirage.optimizer import OptimizerOptions
from mirage.sass.elf import Cubin
from mirage.sass.isa import MemorySpace
from mirage.sass.kernel import Kernel, load_kernel
from mirage.sass.legality import Rule, check_swap

pytestmark = needs_nvcc


@pytest.fixture(scope="module")
def kernel(tmp_path_factory) -> Kernel:
    graph = next(g for row, g in family("qknorm_b1") if "key_scales" in row.label)
    cuda = generate_cuda_program(graph, 90, options=OptimizerOptions(
        stages=2, warpgroup_softmax=True, tma_copies=True))
    (result,) = compile_sources([cuda.code], CompileOptions(target=TARGETS["H100"]))
    path = Path(tmp_path_factory.mktemp("shadow")) / "kernel.cubin"
    path.write_bytes(result.cubin())
    return load_kernel(Cubin.read(path), cuda.kernels[0].name)


def _accesses(instruction) -> bool:
    return instruction.memory is not None and bool(instruction.memory.spaces - {MemorySpace.CONSTANT})


def _shadows(kernel: Kernel) -> list[tuple[int, int]]:
    """(barrier, first access after it) in one block with at least one instruction between."""
    found = []
    for i, barrier in enumerate(kernel.instructions):
        if barrier.opcode != "BAR":
            continue
        block = kernel.blocks[kernel.block_of[i]]
        j = next((j for j in range(i + 1, block.end) if _accesses(kernel.instructions[j])), None)
        if j is not None and j > i + 1:
            found.append((i, j))
    return found


def test_no_access_moves_up_into_a_barriers_shadow(kernel):
    shadows = _shadows(kernel)
    assert shadows, "the key-factor trade's barrier is followed by work that touches no memory"
    for barrier, access in shadows:
        legality = check_swap(kernel, access - 1, access)
        assert not legality.ok
        if not kernel.instructions[access - 1].pinned:
            assert legality.rule is Rule.SHADOW, legality.reason
            assert "shadow of" in legality.reason and kernel.instructions[barrier].text in legality.reason


def test_accesses_still_trade_places_outside_shadows(kernel):
    """The rule refuses only moves toward a barrier: loads after the first access keep their moves."""
    legal = [i for i in range(len(kernel) - 1) if check_swap(kernel, i, i + 1).ok
             and (_accesses(kernel.instructions[i]) or _accesses(kernel.instructions[i + 1]))]
    assert legal
