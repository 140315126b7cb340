"""Row-local bodies that reduce along their rows (``OptimizerOptions.row_reductions``), on a GPU.

Each build runs in registers from its inputs' global memory to its output and is checked against
the float64 reference, then against the same graph lowered op by op (``row_reductions=False``) over
three launches into poisoned buffers: nGPT's update at b = 1, 3 and 8 with 128 to 1024 threads a row
(rows spanning up to 32 warps), softmax rows of one warp each over a grid of blocks, an rms-gated sum
in fp16 and bf16, and a loop whose body reduces rows of eight threads. A misaligned input takes the
loop's scalar reads and must give the same values. Split-KV combines whose division after the loop
runs in registers (``row_epilogues``) match the tiled form bit for bit. A sweep of shapes (rows of 64
to 8192 columns, 1 to 64 rows a block, 64 to 1024 threads, fp16, bf16 and fp32; a thread's columns in
one group or interleaved groups of 8) checks every build that comes out row-local against float64.
Bodies that reduce over their tiles' rows (a column softmax in three types, QKNorm's key norm) run a
column a thread with ``column_loops`` and match the reference and the op-by-op build."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

import mirage as mi  # noqa: E402
from benchmarks.mugraphs import ntrans  # noqa: E402
from benchmarks.variants import attention_fused  # noqa: E402
from mirage.codegen.gpu_check import check_on_gpu  # noqa: E402
from mirage.codegen.lower_program import generate_cuda_program  # noqa: E402
from mirage.codegen.runtime import build_many  # noqa: E402
from mirage.optimizer import OptimizerOptions  # noqa: E402
from tests.gpu.gpu_helpers import assert_checked_and_matching, assert_matching_on_misaligned  # noqa: E402
from tests.unit.optimizer.optimizer_graphs import (  # noqa: E402
    column_softmax,
    gated_rms,
    rms_of_slices,
    row_softmax,
)

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


def _pairs(graphs: dict, marker: str, ours=None, theirs=None) -> dict:
    """name → (graph, its build with options ``ours``, whose code holds ``marker``, its build with
    options ``theirs``, whose code does not)."""
    programs = [[generate_cuda_program(g, options=o) for g in graphs.values()] for o in (ours, theirs)]
    assert all(marker in p.code for p in programs[0]) and not any(marker in p.code for p in programs[1])
    mine, other = (build_many(p) for p in programs)
    return {name: (graph, mine[k], other[k]) for k, (name, graph) in enumerate(graphs.items())}


@pytest.fixture(scope="module")
def built() -> dict:
    return _pairs(GRAPHS, "row_combine<", theirs=OFF)


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


def test_combine_of_32_splits_in_batches(monkeypatch):
    """A combine of 32 key splits reads them in batches of a compile-time count each: two of 16, or,
    with fewer registers for the reads, 11, 11 and a last one of 10.  Both pass the float64 check
    and give the same bits (each row's splits are added in the same order)."""
    import mirage.codegen.lower_rowloop as lowering

    graph = attention_fused(1, False, row_sums=True, combine_rows=8, kv_splits=32, q_splits=4, iters=2,
                            threads=128)
    even = generate_cuda_program(graph)
    monkeypatch.setattr(lowering, "READ_REGISTERS", 66)
    ragged = generate_cuda_program(graph)
    assert "kBatch = 16;" in even.code and "kBatch = 11;" in ragged.code
    ours, theirs = build_many([ragged, even])
    assert_checked_and_matching(graph, ours, theirs, seed=5, same=_identical)
    assert_checked_and_matching(graph, theirs, ours, seed=6, same=_identical)


def _identical(x, y):
    assert torch.equal(x, y), f"max difference {(x.float() - y.float()).abs().max().item()}"


def _sweep() -> dict:
    """Shapes of no other test: rows of 64 to 8192 columns, 1 to 64 rows a block, 64 to 1024 threads,
    fp16 and bf16; those whose body runs row-local with reductions."""
    graphs = {}
    for rows, cols, blocks, threads in itertools.product((8, 64), (64, 1024, 4096), (1, 8), (64, 256, 1024)):
        graphs[f"softmax_{rows}x{cols}_{blocks}b_{threads}t"] = (row_softmax, (rows, cols, blocks, threads))
    types = {"fp16": mi.float16, "bf16": mi.bfloat16, "fp32": mi.float32}
    for rows, cols, threads, dtype in itertools.product((1, 4, 16), (128, 8192), (128, 1024), types):
        graphs[f"gated_{rows}x{cols}_{threads}t_{dtype}"] = (gated_rms, (rows, cols, threads, types[dtype]))
    for rows, cols, iters, threads in itertools.product((4, 16), (256, 1024), (2, 4), (64, 256)):
        graphs[f"slices_{rows}x{cols}_{iters}i_{threads}t"] = (rms_of_slices, (rows, cols, iters, threads))
    return graphs


SWEEP = _sweep()


@pytest.fixture(scope="module")
def swept() -> dict:
    programs = {}
    for name, (build, arguments) in SWEEP.items():
        try:
            program = generate_cuda_program(build(*arguments))
        except mi.MirageError:
            continue  # too large for shared memory op by op, where the body is not row-local
        if "row_combine<" in program.code:
            programs[name] = program
    assert len(programs) >= 30  # 35 of the 76 when written
    return dict(zip(programs, build_many(list(programs.values())), strict=True))


@pytest.mark.parametrize("name", list(SWEEP))
def test_row_local_shapes_match_the_reference(swept, name):
    if name not in swept:
        pytest.skip("not row-local at this shape")
    build, arguments = SWEEP[name]
    result = check_on_gpu(build(*arguments), swept[name].with_poison(), seed=5)
    assert result.passed, result.as_dict()


COLUMNS = dataclasses.replace(OptimizerOptions(), column_loops=True)
COLUMN_GRAPHS = {  # bodies that reduce over their tiles' rows: a column a thread (row_loop.transposed)
    **{f"column_softmax_{r}x{c}_{b}b_{t}t_{name}": column_softmax(r, c, b, t, dtype)
       for (r, c, b, t), (name, dtype) in itertools.product(
           ((64, 1024, 8, 128), (32, 2048, 8, 256), (8, 384, 3, 128), (48, 768, 8, 96)),
           (("fp16", mi.float16), ("bf16", mi.bfloat16), ("fp32", mi.float32)))},
    **{f"qknorm_b{b}_norm_blocks{n}": attention_fused(
        b, True, row_sums=True, combine_rows=8, normalize_k=True, norm_blocks=n, kv_splits=4, q_splits=4,
        iters=8, threads=128) for b in (1, 8) for n in (32, 64)},
}


@pytest.fixture(scope="module")
def built_columns() -> dict:
    return _pairs(COLUMN_GRAPHS, "read_column(", ours=COLUMNS)


@pytest.mark.parametrize("name", list(COLUMN_GRAPHS))
def test_column_local_build_matches_reference_and_op_by_op(built_columns, name):
    """Checked against the float64 reference, then against the op-by-op build over three launches
    into poisoned buffers."""
    graph, ours, theirs = built_columns[name]
    assert_checked_and_matching(graph, ours, theirs, seed=9, same=_close)


NOT_RAGGED = dataclasses.replace(OptimizerOptions(), ragged_rows=False)
RAGGED = {  # rows no chunk divides, or whose chunks leave threads of the block idle: padded
    # GPT-2's slice: 14 columns a thread; then whole chunks of 16 past 2,000
    "softmax_8x1733_128t": row_softmax(rows=8, cols=1733, blocks=8, threads=128),
    "softmax_8x1733_256t": row_softmax(rows=8, cols=1733, blocks=8, threads=256),
    "softmax_8x2000_128t": row_softmax(rows=8, cols=2000, blocks=8, threads=128),
    "softmax_64x1000_256t": row_softmax(rows=64, cols=1000, blocks=8, threads=256),  # 8 rows a block
    "softmax_4x16032_256t": row_softmax(rows=4, cols=16032, blocks=4, threads=256),  # groups of 8 masked
    "gated_1x4008_128t_bf16": gated_rms(rows=1, cols=4008, threads=128, dtype=mi.bfloat16),
    "gated_1x5087_128t_fp16": gated_rms(rows=1, cols=5087, threads=128),  # BERT's vocabulary in 6 slices
    "gated_2x3000_512t_bf16": gated_rms(rows=2, cols=3000, threads=512, dtype=mi.bfloat16),
}


@pytest.fixture(scope="module")
def built_ragged() -> dict:
    return _pairs(RAGGED, "kRowWidth", theirs=NOT_RAGGED)


@pytest.mark.parametrize("name", list(RAGGED))
def test_ragged_rows_match_reference_and_op_by_op(built_ragged, name):
    """The padding's columns take no part in the row's max, sum or rms and are not stored: the build
    matches float64 and the op-by-op build over launches into poisoned outputs."""
    graph, ours, theirs = built_ragged[name]
    assert_checked_and_matching(graph, ours, theirs, seed=13, same=_close)


@pytest.mark.parametrize("name", ["softmax_8x2000_128t", "gated_1x5087_128t_fp16"])
def test_ragged_rows_on_a_misaligned_input(built_ragged, name):
    graph, ours, theirs = built_ragged[name]
    assert_matching_on_misaligned(graph, ours, theirs, index=0, seed=17, same=_close)


NOT_SHORT = dataclasses.replace(OptimizerOptions(), short_rows=False, ragged_rows=False)


def _split_log_softmax(rows: int, cols: int, splits: int, threads: int) -> mi.KernelGraph:
    from mirage.generator import split_rows
    from tests.unit.generator.test_split_rows import lse_reference

    graph = lse_reference(rows, cols, True)
    return split_rows.split_graph(graph, split_rows.match(graph), splits, threads)


SHORT = {  # a split log_softmax's combine: the row's partials over a warp's lanes, reduced by shuffles
    "gpt2_29_128t": _split_log_softmax(8, 50257, 29, 128),  # slices of 1,733: ragged too
    "gpt2_29_256t": _split_log_softmax(8, 50257, 29, 256),
    "llama3_64_256t": _split_log_softmax(4, 128256, 64, 256),  # two partials a lane
    "llama_8_256t": _split_log_softmax(8, 32000, 8, 256),
    "llama_16_128t": _split_log_softmax(8, 32000, 16, 128),
    "bert_6_512t": _split_log_softmax(4, 30522, 6, 512),  # slices of 5,087
}


def test_split_combines_with_short_rows_match_reference_and_op_by_op():
    for graph, ours, theirs in _pairs(SHORT, "// a short value", theirs=NOT_SHORT).values():
        assert_checked_and_matching(graph, ours, theirs, seed=19, same=_close)
