"""Row-local bodies that reduce along their rows (``OptimizerOptions.row_reductions``), on a GPU.

Each build runs in registers from its inputs' global memory to its output and is checked against
the float64 reference, then against the same graph lowered op by op (``row_reductions=False``) over
three launches into poisoned buffers: nGPT's update at b = 1, 3 and 8 with 128 to 1024 threads a row
(rows spanning up to 32 warps), softmax rows of one warp each over a grid of blocks, an rms-gated sum
in fp16 and bf16, and a loop whose body reduces rows of eight threads. A misaligned input takes the
loop's scalar reads and must give the same values. Split-KV combines whose division after the loop
runs in registers (``row_epilogues``) match the tiled form bit for bit."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

import mirage as mi  # noqa: E402
from benchmarks.mugraphs import ntrans  # noqa: E402
from benchmarks.variants import attention_fused  # noqa: E402
from mirage.codegen.lower_program import generate_cuda_program  # noqa: E402
from mirage.codegen.runtime import build_many  # noqa: E402
from mirage.optimizer import OptimizerOptions  # noqa: E402
from tests.gpu.gpu_helpers import assert_checked_and_matching, assert_matching_on_misaligned  # noqa: E402
from tests.unit.optimizer.optimizer_graphs import gated_rms, rms_of_slices, row_softmax  # noqa: E402

pytestmark = pytest.mark.gpu

OFF = dataclasses.replace(OptimizerOptions(), row_reductions=False)

GRAPHS = {
    **{f"ntrans_b{b}_t{t}": ntrans.fused(b, threads=t) for b in (1, 3, 8) for t in (128, 256, 512, 1024)},
    "softmax_rows": row_softmax(rows=64, cols=1024, blocks=8, threads=256),
    "softmax_wide_rows": row_softmax(rows=8, cols=2048, blocks=2, threads=512),
    "gated_rms_fp16": gated_rms(rows=4, cols=2048, threads=512),
    "gated_rms_bf16": gated_rms(rows=4, cols=2048, threads=512, dtype=mi.bfloat16),
    "rms_of_slices": rms_of_slices(rows=16, cols=512, iters=4, threads=128),
}


NO_EPILOGUES = dataclasses.replace(OptimizerOptions(), row_epilogues=False)
COMBINES = {  # split-KV attention: its combine's O / l after the loop, from registers to the output
    "gqa_combine": attention_fused(1, False, row_sums=True, combine_rows=16, kv_splits=8, q_splits=8,
                                   iters=4, threads=128),
    "qknorm_combine": attention_fused(1, True, row_sums=True, combine_rows=8, kv_splits=16, q_splits=4,
                                      iters=2, threads=128),
}


@pytest.fixture(scope="module")
def built() -> dict:
    ours = [generate_cuda_program(g) for g in GRAPHS.values()]
    assert all("row_combine<" in p.code for p in ours)
    theirs = [generate_cuda_program(g, options=OFF) for g in GRAPHS.values()]
    assert not any("row_combine<" in p.code for p in theirs)
    ours, theirs = build_many(ours), build_many(theirs)
    return {name: (GRAPHS[name], ours[k], theirs[k]) for k, name in enumerate(GRAPHS)}


def _close(x, y):
    # the op-by-op build rounds intermediate values to 16 bits in its shared tiles; the row-local
    # body keeps them in fp32 registers, so the two differ by a rounding of the inputs' type
    torch.testing.assert_close(x.float(), y.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("name", list(GRAPHS))
def test_row_local_build_matches_reference_and_op_by_op(built, name):
    graph, ours, theirs = built[name]
    assert_checked_and_matching(graph, ours, theirs, seed=7, same=_close)


@pytest.mark.parametrize("name", ["ntrans_b8_t512", "softmax_rows", "rms_of_slices"])
def test_misaligned_input_takes_scalar_reads(built, name):
    graph, ours, theirs = built[name]
    assert_matching_on_misaligned(graph, ours, theirs, index=0, seed=3, same=_close)


def test_combine_epilogue_in_registers_is_bit_identical():
    """The combine's division after the loop reads the states from registers instead of their fp32
    tiles: the same values, so the same bits, as with ``row_epilogues=False``."""
    graphs = list(COMBINES.values())
    ours = build_many([generate_cuda_program(g) for g in graphs])
    theirs = build_many([generate_cuda_program(g, options=NO_EPILOGUES) for g in graphs])
    for graph, a, b in zip(graphs, ours, theirs, strict=True):
        assert_checked_and_matching(graph, a, b, seed=11, same=_identical)


def _identical(x, y):
    assert torch.equal(x, y), f"max difference {(x.float() - y.float()).abs().max().item()}"
