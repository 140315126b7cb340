"""An online-softmax chain's results that only their output savers read go from its registers to the
device outputs after the loop (``OptimizerOptions.softmax_output_stores``): what the generated code
and its SASS lose (the shared round trip, the savers' passes and their barriers). On the GPU the
outputs are the same bits as through the tiles (``tests/gpu/test_softmax_output_stores_gpu.py``)."""

from __future__ import annotations

import dataclasses
import re

from codegen_helpers import needs_nvcc, sass_by_function

from benchmarks.variants import family
from mirage.codegen.compile import CompileOptions, Stage, compile_sources
from mirage.codegen.lower_program import generate_cuda_program
from mirage.mugraph.target import TARGETS
from mirage.optimizer import OptimizerOptions

WARPGROUP = dataclasses.replace(OptimizerOptions(), warpgroup_softmax=True, tma_copies=True)
ON = dataclasses.replace(WARPGROUP, softmax_output_stores=True)
PICK = ("gqa_b1", "kv_splits=16,q_splits=4,iters=2,threads=128,row_sums=True,combine_rows=8")


def _programs():
    case, label = PICK
    graph = next(g for row, g in family(case, wide=True) if row.label == label)
    return [generate_cuda_program(graph, None, options=o) for o in (ON, WARPGROUP)]  # the default: off


def _attention(code: str) -> str:
    return code.split('extern "C"')[1]


def test_chain_results_go_to_the_outputs_without_saver_passes():
    ours, tiled = (_attention(p.code) for p in _programs())
    # the row maxima, the row sums and the partial O: three sinks, no saver of the kernel left
    assert len(re.findall(r"const auto sink\d = \[&\]", ours)) == 3
    assert re.search(r"::write_back\(softmax\d+_state, [^;]*sink0, t\d+, sink1, sink2\);", ours)
    assert "OutputSaver<" not in ours and tiled.count("OutputSaver<") == 3
    assert ours.count("__syncthreads()") == tiled.count("__syncthreads()") - 2  # before and after the savers


@needs_nvcc
def test_sass_stores_fragment_pairs_and_drops_two_barriers():
    programs = _programs()
    results = compile_sources([p.code for p in programs], CompileOptions(target=TARGETS["H100"]),
                              dumps={Stage.SASS})
    ours, tiled = (sass_by_function(r.sass())[programs[0].kernels[0].name] for r in results)

    def count(pattern, sass):
        return len(re.findall(pattern, sass))

    assert count(r"\bBAR\.SYNC", ours) == count(r"\bBAR\.SYNC", tiled) - 2
    # O's 32 floats a thread: 16 paired 4-byte stores (aligned outputs) instead of fp32 shared stores
    assert count(r"\bSTG\.E ", ours) == 16 and count(r"\bSTG\.E ", tiled) == 0
    assert count(r"\bSTS ", ours) < count(r"\bSTS ", tiled) - 30
    assert "LDL" not in ours and "STL" not in ours
