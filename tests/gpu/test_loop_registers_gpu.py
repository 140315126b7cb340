"""Loop work kept in registers, on a GPU.

* Mean and rms accumulators summed in registers (gen::RowSums): rows that fill a block, that do
  not, and that take several rounds; rows whose length is not a multiple of the lanes' vector
  reads; fp16 and bf16; each against the float64 reference and against the same graph built with
  the shared-tile block reduction (OptimizerOptions(register_row_sums=False)).
* A matmul operand X·g scaled in the A fragments (accumulate_scaled): bit-identical to the same
  graph that stores X·g first (OptimizerOptions(fold_operand_scale=False)), fp16 and bf16.
* The online-softmax chain's two instruction orders (MIRAGE_SOFTMAX_INTERLEAVE): bit-identical.
* Staggered loads of tiles that several blocks load (stagger_shared_loads): bit-identical.
* The chain's score scale folded into the exponent (MIRAGE_SOFTMAX_FOLD_SCALE): against float64 and
  against the chain that scales each score, fp16 and bf16.
* Per-key factors in the chain (QKNorm's scores divided by their key's rms, ``key_scales``), the rms
  computed by the chain from its K fragments (KeyNorms) and by a step of its own: against float64
  and against the same graph lowered op by op, fp16 and bf16, with one and with two row tiles per
  warp.
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

import mirage as mi  # noqa: E402
from benchmarks.mugraphs import mlp  # noqa: E402
from benchmarks.variants import family  # noqa: E402
from mirage.codegen.gpu_check import check_on_gpu, random_inputs  # noqa: E402
from mirage.codegen.lower_program import generate_cuda_program  # noqa: E402
from mirage.codegen.runtime import build_many  # noqa: E402
from mirage.optimizer import OptimizerOptions  # noqa: E402

pytestmark = pytest.mark.gpu

# (rows, columns per iteration, iterations, threads, accumulator, dtype)
CASES = [
    (16, 512, 8, 256, "rms", mi.float16),  # rmsnorm_b8's shape: 16 lanes a row, one round
    (2, 256, 16, 256, "rms", mi.float16),  # rmsnorm_b1's: most threads idle
    (3, 200, 4, 128, "mean", mi.float16),  # odd rows and columns: scalar reads, a partial round
    (40, 64, 4, 128, "rms", mi.bfloat16),  # more rows than a round: three rounds
    (1, 96, 3, 64, "mean", mi.bfloat16),
]


def _graph(rows: int, cols: int, iters: int, threads: int, acc: str, dtype) -> mi.KernelGraph:
    g = mi.new_kernel_graph(f"row_sums_{acc}")
    x = g.new_input(dims=(rows, cols * iters), dtype=dtype)
    tb = mi.new_threadblock_graph(grid_dim=(1, 1, 1), block_dim=(threads, 1, 1), forloop_range=iters)
    bx = tb.new_input(x, input_map=(-1, -1, -1), forloop_dim=1)
    kwargs = {"eps": 1e-6} if acc == "rms" else {}
    tb.new_output(tb.forloop_accum(bx, acc=acc, **kwargs), output_map=(-1, -1, -1))
    (out,) = g.customized([x], tb)
    g.mark_output(out)
    return g.freeze()


@pytest.fixture(scope="module")
def built() -> dict:
    graphs = {case: _graph(*case) for case in CASES}
    programs = [generate_cuda_program(g, None) for g in graphs.values()]
    shared = [generate_cuda_program(g, None, options=OptimizerOptions(register_row_sums=False))
              for g in graphs.values()]
    assert all("RowSums<" in p.code for p in programs)
    assert not any("RowSums<" in p.code for p in shared)
    registers, tiles = build_many(programs), build_many(shared)
    return {case: (graphs[case], registers[k], tiles[k]) for k, case in enumerate(CASES)}


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:4])) + f"-{c[4]}-{c[5].short}")
def test_register_row_sums_match_the_reference(built, case):
    graph, registers, tiles = built[case]
    inputs = random_inputs(graph, 3)
    result = check_on_gpu(graph, registers, inputs=inputs)
    assert result.passed, result.as_dict()
    (ours,), (theirs,) = registers(*inputs), tiles(*inputs)
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=2e-3, atol=1e-5)


def _scaled_linear(rows: int, dtype, threads: int) -> mi.KernelGraph:
    """(X · g) @ W with X (rows, 1024), g (1, 1024), W (1024, 256): a K loop of 4 tiles."""
    g = mi.new_kernel_graph("scaled_linear")
    x, gain, w = (g.new_input(dims=s, dtype=dtype) for s in ((rows, 1024), (1, 1024), (1024, 256)))
    tb = mi.new_threadblock_graph(grid_dim=(4, 1, 1), block_dim=(threads, 1, 1), forloop_range=4)
    bx = tb.new_input(x, input_map=(-1, -1, -1), forloop_dim=1)
    bg = tb.new_input(gain, input_map=(-1, -1, -1), forloop_dim=1)
    bw = tb.new_input(w, input_map=(1, -1, -1), forloop_dim=0)
    tb.new_output(tb.forloop_accum(tb.matmul(tb.mul(bx, bg), bw)), output_map=(1, -1, -1))
    (out,) = g.customized([x, gain, w], tb)
    g.mark_output(out)
    return g.freeze()


SCALED = [
    ("scaled_fp16_m16", _scaled_linear(16, mi.float16, 128)),
    ("scaled_bf16_m5", _scaled_linear(5, mi.bfloat16, 256)),
    ("rmsnorm_b8", mlp.rmsnorm_fused(8, grid=128, iters=8, threads=256)),
    ("rmsnorm_b1", mlp.rmsnorm_fused(1, grid=128, iters=16, threads=512)),
]


@pytest.mark.parametrize("name,graph", SCALED, ids=[n for n, _ in SCALED])
def test_scaled_operand_is_bit_identical_to_the_stored_product(name, graph):
    folded = generate_cuda_program(graph, None)
    stored = generate_cuda_program(graph, None, options=OptimizerOptions(fold_operand_scale=False))
    assert "accumulate_scaled(" in folded.code and "accumulate_scaled(" not in stored.code
    ours, theirs = build_many([folded, stored])
    inputs = random_inputs(graph, 5)
    result = check_on_gpu(graph, ours, inputs=inputs)
    assert result.passed, result.as_dict()
    (a,), (b,) = ours(*inputs), theirs(*inputs)
    assert torch.equal(a, b)


@pytest.mark.parametrize("case", ["gqa_b8", "qknorm_b1"])
def test_softmax_orders_are_bit_identical(case):
    _, graph = family(case)[0]
    program = generate_cuda_program(graph, None)
    two_pass = dataclasses.replace(program, code="#define MIRAGE_SOFTMAX_INTERLEAVE 0\n" + program.code)
    interleaved, separate = build_many([program, two_pass])
    inputs = random_inputs(graph, 7)
    result = check_on_gpu(graph, interleaved, inputs=inputs)
    assert result.passed, result.as_dict()
    assert torch.equal(interleaved(*inputs)[0], separate(*inputs)[0])


def _with_dtype(value, dtype):
    """``value`` (a µGraph, or any part of one) with its fp16 tensors retyped to ``dtype``."""
    from mirage.mugraph.graph import TensorType

    if isinstance(value, TensorType):
        return dataclasses.replace(value, dtype=dtype) if value.dtype is mi.float16 else value
    if isinstance(value, tuple):
        return tuple(_with_dtype(v, dtype) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = [f.name for f in dataclasses.fields(value) if f.init]
        return dataclasses.replace(value, **{f: _with_dtype(getattr(value, f), dtype) for f in fields})
    return value


PER_ELEMENT = "#define MIRAGE_SOFTMAX_FOLD_SCALE 0\n"


@pytest.mark.parametrize("case, dtype", [("gqa_b8", mi.float16), ("qknorm_b1", mi.float16),
                                         ("gqa_b1", mi.bfloat16)])
def test_softmax_scale_fold_matches_the_reference(case, dtype):
    _, graph = family(case)[0]
    if dtype is not mi.float16:
        graph = _with_dtype(graph, dtype)
    program = generate_cuda_program(graph, None)
    assert "kLinearScale" in program.code
    folded, per_element = build_many([program, dataclasses.replace(program, code=PER_ELEMENT + program.code)])
    inputs = random_inputs(graph, 11)
    for built in (folded, per_element):
        result = check_on_gpu(graph, built, inputs=inputs)
        assert result.passed, result.as_dict()
    (a,), (b,) = folded(*inputs), per_element(*inputs)
    assert not torch.equal(a, b)  # the forms differ (so both ran), by rounding only
    torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)


def _key_scale_member(case: str, label_part: str):
    return next(g for row, g in family(case) if "key_scales" in row.label and label_part in row.label)


@pytest.mark.parametrize("case, label, dtype", [
    ("qknorm_b1", "kv_splits=16,q_splits=4,iters=2,threads=128", mi.float16),
    ("qknorm_b8", "kv_splits=8,q_splits=2,iters=8,threads=128", mi.float16),  # two row tiles a warp
    ("qknorm_b1", "kv_splits=16,q_splits=2,iters=2,threads=256", mi.bfloat16),
])
def test_per_key_factors_match_the_reference(case, label, dtype):
    graph = _key_scale_member(case, label)
    if dtype is not mi.float16:
        graph = _with_dtype(graph, dtype)
    program = generate_cuda_program(graph, None, options=OptimizerOptions(chain_key_norms=True))
    assert "KeyNorms<" in program.code and "ColumnFactor<" in program.code  # norms from K's fragments
    stepped = generate_cuda_program(graph, None)  # the factors computed by a step of their own
    assert "KeyNorms<" not in stepped.code and "ColumnFactor<" in stepped.code
    op_by_op = generate_cuda_program(graph, None, options=OptimizerOptions(register_softmax=False))
    assert "ColumnScore" not in op_by_op.code
    built = build_many([program, stepped, op_by_op])
    inputs = random_inputs(graph, 13)
    for each in built:
        result = check_on_gpu(graph, each, inputs=inputs)
        assert result.passed, result.as_dict()
    (reference,) = built[-1](*inputs)
    for each in built[:-1]:
        (a,) = each(*inputs)
        torch.testing.assert_close(a.float(), reference.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("case", ["rmsnorm_b8", "lora_m16", "gqa_b1"])
def test_staggered_loads_are_bit_identical(case):
    """stagger_shared_loads only changes the order in which a block copies a tile's rows."""
    _, graph = family(case)[0]
    program = generate_cuda_program(graph, None, options=OptimizerOptions(stagger_shared_loads=True))
    assert ", true>" in program.code
    staggered, plain = build_many([program, generate_cuda_program(graph, None)])
    inputs = random_inputs(graph, 17)
    result = check_on_gpu(graph, staggered.with_poison(), inputs=inputs)
    assert result.passed, result.as_dict()
    for a, b in zip(staggered.with_poison()(*inputs), plain(*inputs), strict=True):
        assert torch.equal(a, b)
