"""Lowering of prepared µGraphs to kernel contexts and CUDA source (mirage.codegen.lower*), on the CPU.

Snapshots of the generated source live in ``snapshots/``; after an intended change of the optimizer
or the templates, refresh them with ``MIRAGE_UPDATE_SNAPSHOTS=1 pytest tests/unit/codegen/test_lower.py``.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

import mirage as mi
from benchmarks.mugraphs import CASES, ntrans
from mirage.codegen import lower_context as ctx
from mirage.codegen import lower_ops
from mirage.codegen.lower_ops import LoweringError, plan_pitch, tile_layout
from mirage.codegen.lower_program import CudaProgram, cfloat, generate_cuda_program, target_for
from mirage.errors import SharedMemoryError
from mirage.mugraph.graph import Node, Ref, Scalar, TensorType, ThreadGraph, ThreadInput
from mirage.mugraph.ops import Op
from mirage.mugraph.target import TARGETS
from mirage.optimizer import OptimizerOptions, RegisterOptions

SNAPSHOTS = Path(__file__).parent / "snapshots"

# nTrans lowered op by op (its rows' reductions not row-local): the form these tests look at
OP_BY_OP_ROWS = OptimizerOptions(row_reductions=False)


def rms_rows(name: str = "rms_rows") -> mi.KernelGraph:
    """exp(x) summed per row and the rms of x: element-wise, reduction and rms accumulators."""
    g = mi.new_kernel_graph(name)
    x = g.new_input(dims=(64, 256), dtype=mi.float16)
    tb = mi.new_threadblock_graph(grid_dim=(4, 1, 1), block_dim=(128, 1, 1), forloop_range=2)
    bx = tb.new_input(x, input_map=(0, -1, -1), forloop_dim=1)
    s = tb.forloop_accum(tb.exp(tb.mul_scalar(bx, 0.5)), acc="sum")
    r = tb.forloop_accum(bx, acc="rms", eps=1e-6)
    tb.new_output(tb.div(s, r), output_map=(0, -1, -1))
    (o,) = g.customized([x], tb)
    g.mark_output(o)
    return g.freeze()


def small_linear(name: str = "small_linear") -> mi.KernelGraph:
    """silu(X @ W) with the matmul accumulator in registers and a split of N over the grid."""
    g = mi.new_kernel_graph(name)
    x = g.new_input(dims=(16, 128), dtype=mi.float16)
    w = g.new_input(dims=(128, 256), dtype=mi.float16)
    tb = mi.new_threadblock_graph(grid_dim=(4, 1, 1), block_dim=(128, 1, 1), forloop_range=4)
    bx = tb.new_input(x, input_map=(-1, -1, -1), forloop_dim=1)
    bw = tb.new_input(w, input_map=(1, -1, -1), forloop_dim=0)
    tb.new_output(tb.silu(tb.forloop_accum(tb.matmul(bx, bw))), output_map=(1, -1, -1))
    (o,) = g.customized([x, w], tb)
    g.mark_output(o)
    return g.freeze()


# ---- snapshots -------------------------------------------------------------------------------------


@pytest.mark.parametrize("build", [rms_rows, small_linear], ids=lambda f: f.__name__)
def test_generated_source_matches_snapshot(build):
    code = generate_cuda_program(build(), 90).code
    path = SNAPSHOTS / f"{build.__name__}.cu"
    if os.environ.get("MIRAGE_UPDATE_SNAPSHOTS") == "1":
        path.write_text(code)
    assert path.is_file(), f"missing snapshot {path.name}: run with MIRAGE_UPDATE_SNAPSHOTS=1"
    assert code == path.read_text()


def test_generation_is_deterministic():
    assert generate_cuda_program(small_linear(), 90).code == generate_cuda_program(small_linear(), 90).code


# ---- launch description ----------------------------------------------------------------------------


def test_gqa_launch_description():
    program = generate_cuda_program(CASES["gqa_b1"].fused(), target_cc=90)
    assert [k.name for k in program.kernels] == ["gqa_k3", "gqa_k4"]
    first, combine = program.kernels
    assert first.grid == (2, 8, 16) and first.block == (128, 1, 1)
    assert first.inputs == (Ref(0), Ref(1), Ref(2))
    # the online-softmax rewrite adds the row maxima as a third output; the combine reads them
    assert first.outputs == (Ref(3, 0), Ref(3, 1), Ref(3, 2))
    assert set(combine.inputs) == {Ref(3, 0), Ref(3, 1), Ref(3, 2)}
    assert first.arguments == first.outputs + first.inputs
    for launch, kernel in zip(program.kernels, program.prepared.kernels, strict=True):
        # the plan, plus the reduction scratch (one float per warp) when a step reduces
        assert launch.smem_bytes in (kernel.smem_bytes, kernel.smem_bytes + 16)
        assert launch.smem_bytes <= TARGETS["H100"].smem_per_block
        signature = program.code.split(f" {launch.name}(")[1].split(") {")[0]
        parameters = [p.split()[-1] for p in signature.split(",")]
        expected = [f"output{j}" for j in range(len(launch.outputs))] + [
            f"input{k}" for k in range(len(launch.inputs))
        ]
        assert parameters == expected
        assert f"__launch_bounds__({launch.block[0]}) {launch.name}(" in program.code


def test_program_dict_round_trip():
    program = generate_cuda_program(rms_rows(), 90)
    again = CudaProgram.from_dict(program.to_dict())
    assert again == program
    assert again.graph.content_hash() == program.graph.content_hash()


@pytest.mark.parametrize("name", sorted(CASES))
def test_benchmark_contexts_follow_the_plan(name):
    """Every kernel's tiles sit inside their planned buffers, and the steps mirror the schedule."""
    program = generate_cuda_program(CASES[name].fused(), 90)
    for context, kernel in zip(program.contexts, program.prepared.kernels, strict=True):
        buffers = {b.node: b for b in kernel.memory.buffers}
        for tile in context.tiles:
            node = int(tile.name[1:].split("_")[0])
            buffer = buffers[node]
            size = tile.layout.storage * lower_ops.element_size(tile.element)
            assert buffer.offset <= tile.offset and tile.offset + size <= buffer.offset + buffer.size
        for it in context.iterators:
            assert it.pipelined == (it.stages > 1)
            assert it.direct or it.tile.offset == buffers[it.node].offset
        registers = {r.node for r in context.registers}
        assert registers == set(kernel.registers.accumulators)
        steps = context.pre_loop + context.loop + context.post_loop
        chained = {s.node for s in steps if s.kind in ("chain", "register_chain")}
        chained |= {s.sums.node for s in steps if s.kind == "row_sums"}
        nodes = kernel.block_graph.nodes
        folded = {nodes[s.node].inputs[0].node for s in steps
                  if s.kind == "register_chain" and s.producer.scale is not None}  # A = X·g, never stored
        roots = {
            s.node
            for s in kernel.schedule.steps
            if s.action.value in ("compute", "accumulate") and s.epilogue_of is None and s.prologue_of is None
        } - folded
        row_local = set(kernel.row_loop.nodes) if kernel.row_loop is not None else set()
        assert chained == roots - row_local  # the row-local body is one register step
        stores = [s.saver.node for s in steps if s.kind == "store"]
        stores += [s.sink.saver.node for s in steps if s.kind == "chain" and s.sink.saver is not None]
        stores += [o.node for s in steps if s.kind == "row_loop_write_back" for _, o in s.outputs]
        assert sorted(stores) == kernel.block_graph.output_nodes


def test_results_stored_once_and_read_only_by_their_saver_go_straight_to_the_output():
    """nTrans's last rms_norm (a one-iteration loop) and rmsnorm's post-loop scaling write the device
    output from their chains: no saver pass, no shared tile stores for them, no trailing barrier;
    with the option off the saver stays, and an accumulator of a longer loop keeps its tile."""
    graph = CASES["ntrans_b1"].fused()
    direct = generate_cuda_program(graph, 90, options=OP_BY_OP_ROWS)
    (context,) = direct.contexts
    sinks = [s.sink for s in context.loop if s.kind == "chain"]
    assert [s.kind for s in sinks][-1] is ctx.SinkKind.GLOBAL and sinks[-1].saver is not None
    assert not any(s.kind == "store" for s in context.post_loop)
    assert "mirage::gen::store_global<" in direct.code and "OutputSaver<" not in direct.code
    saved = generate_cuda_program(graph, 90, options=OptimizerOptions(direct_output_stores=False,
                                                                      row_reductions=False))
    assert "store_global" not in saved.code and "OutputSaver<" in saved.code
    post_loop = generate_cuda_program(CASES["rmsnorm_b8"].fused(), 90)
    (context,) = post_loop.contexts
    assert context.post_loop[-1].kind == "chain" and context.post_loop[-1].sink.kind is ctx.SinkKind.GLOBAL
    # op by op, GQA's first kernel saves accumulators of 8 iterations: they stay in their tiles
    op_by_op = OptimizerOptions(register_softmax=False)
    accumulated = generate_cuda_program(CASES["gqa_b8"].fused(), 90, options=op_by_op)
    first = accumulated.contexts[0]
    kinds = [s.sink.kind for s in first.loop if s.kind == "chain"]
    assert ctx.SinkKind.RESCALE in kinds and ctx.SinkKind.GLOBAL not in kinds
    outputs = accumulated.prepared.kernels[0].block_graph.output_nodes
    assert [s.kind for s in first.post_loop].count("store") == len(outputs)


def _odd_rows(cols: int) -> mi.KernelGraph:
    """rms over a loop of row tiles of ``cols`` columns per iteration."""
    g = mi.new_kernel_graph("odd_rows")
    x = g.new_input(dims=(64, 4 * cols), dtype=mi.float16)
    tb = mi.new_threadblock_graph(grid_dim=(4, 1, 1), block_dim=(128, 1, 1), forloop_range=4)
    bx = tb.new_input(x, input_map=(0, -1, -1), forloop_dim=1)
    tb.new_output(tb.forloop_accum(tb.exp(bx), acc="sum"), output_map=(0, -1, -1))
    (o,) = g.customized([x], tb)
    g.mark_output(o)
    return g.freeze()


def test_pipelined_loops_wait_then_load_with_one_barrier_per_iteration():
    """The wait's barrier comes before the next loads, so the loop ends without a barrier and one
    follows it. Not with inputs staged through registers (their stores land at the next load call),
    nor with the option off (the default: it measured within noise)."""
    one = OptimizerOptions(one_barrier_loops=True)
    program = generate_cuda_program(small_linear(), 90, options=one)
    (context,) = program.contexts
    assert context.loads_after_barrier and not [s for s in context.loop if s.kind == "barrier"]
    assert context.post_loop[0].kind == "barrier"
    loop = program.code[program.code.index("for (int iteration"):program.code.index("after the for-loop")]
    assert loop.index("wait_before_loads()") < loop.index(".load(iteration + 3)")
    assert "__syncthreads()" not in loop
    two = generate_cuda_program(small_linear(), 90)
    assert not two.contexts[0].loads_after_barrier and "end of iteration" in two.code
    staged = generate_cuda_program(_odd_rows(12), 90, options=one)  # 12 halves: not whole 16-byte vectors
    assert staged.contexts[0].stages > 1 and staged.contexts[0].iterators[0].pipelined
    assert not staged.contexts[0].loads_after_barrier and "end of iteration" in staged.code
    assert generate_cuda_program(_odd_rows(16), 90, options=one).contexts[0].loads_after_barrier


def test_epilogues_become_links_and_register_sinks():
    program = generate_cuda_program(CASES["gqa_b1"].fused(), 90)
    context = program.contexts[0]
    register_steps = [s for s in context.loop if s.kind == "register_chain"]
    assert len(register_steps) == 1
    (step,) = register_steps
    assert step.rescale is not None and step.links == () and step.combine == "mirage::dev::Add"
    linked = [s for s in context.loop if s.kind == "chain" and s.links]
    assert linked and all(s.producer.kind == "matmul" for s in linked)


def test_without_epilogues_every_result_is_stored():
    options = OptimizerOptions(registers=RegisterOptions(epilogues=False, register_accumulators=False))
    program = generate_cuda_program(CASES["rmsnorm_b1"].fused(), 90, options=options)
    (context,) = program.contexts
    assert context.registers == ()
    steps = context.pre_loop + context.loop + context.post_loop
    assert all(not s.links for s in steps if s.kind == "chain")
    assert "Registers" not in program.code


def test_unfused_elementwise_ops_lower_as_single_op_functions():
    program = generate_cuda_program(rms_rows(), 90, options=OptimizerOptions(fusion=False))
    (context,) = program.contexts
    functors = [s.functor for f in context.functions for s in f.statements]
    assert functors.count("mirage::dev::Exp") == 1 and "mirage::dev::MulScalar" in functors


def _thread_chain(*ops: tuple[Op, float | None]) -> ThreadGraph:
    t = (TensorType((16, 64), mi.float32),)
    nodes = [Node(Op.INPUT, (), ThreadInput(0), t)]
    for op, value in ops:
        nodes.append(Node(op, (Ref(len(nodes) - 1),), Scalar(value) if value is not None else None, t))
    return ThreadGraph(tuple(nodes), (Ref(len(nodes) - 1),))


@pytest.mark.parametrize("ops, scale", [
    ([(Op.MUL_SCALAR, 0.125)], 0.125),
    ([(Op.MUL_SCALAR, 0.5), (Op.MUL_SCALAR, 0.25)], 0.125),
    ([(Op.MUL_SCALAR, -0.125)], None),  # a negative scale reverses the order of the maxima
    ([(Op.MUL_SCALAR, 0.125), (Op.ADD_SCALAR, 1.0)], None),
    ([(Op.EXP, None)], None),
])
def test_a_positive_scalar_product_is_a_linear_score(ops, scale):
    from mirage.codegen.lower_functions import thread_function

    function = thread_function("f", _thread_chain(*ops))
    assert function.linear_scale == scale
    code = generate_cuda_program(CASES["gqa_b1"].fused(), 90).code
    assert "static constexpr float kLinearScale = 0.125f;" in code


def test_a_quotient_by_a_square_root_is_one_reciprocal_square_root():
    """``x1 / sqrt(x0 + eps)`` lowers to ``DivSqrt(x1, x0 + eps)`` (a · rsqrt(b)); a square root that
    something else reads keeps its own statement."""
    from mirage.codegen.lower_functions import DIV_SQRT, thread_function

    t = (TensorType((16, 64), mi.float32),)
    nodes = (Node(Op.INPUT, (), ThreadInput(0), t), Node(Op.INPUT, (), ThreadInput(1), t),
             Node(Op.ADD_SCALAR, (Ref(0),), Scalar(1e-6), t), Node(Op.SQRT, (Ref(2),), None, t),
             Node(Op.DIV, (Ref(1), Ref(3)), None, t), Node(Op.MUL, (Ref(4), Ref(3)), None, t))
    quotient = thread_function("f", ThreadGraph(nodes[:5], (Ref(4),)))
    assert quotient.statements[-1] == ctx.ThreadStatement("v4", DIV_SQRT, (), ("x1", "v2"))
    both = thread_function("g", ThreadGraph(nodes, (Ref(5),)))
    assert [s.functor for s in both.statements][1:] == ["mirage::dev::Sqrt", DIV_SQRT, "mirage::dev::Mul"]
    assert both.statements[-1].arguments == ("v4", "v3")
    divide = thread_function("h", ThreadGraph(nodes[:3] + (Node(Op.DIV, (Ref(1), Ref(2)), None, t),),
                                                (Ref(3),)))
    assert divide.statements[-1].functor == "mirage::dev::Div"  # no square root: a plain quotient


# ---- tables ----------------------------------------------------------------------------------------

LAYOUTS = [
    # shape, element, capacity, row-major plan, expected dims, expected pitch
    ((16, 64), "__half", 2048, True, (1, 1, 16, 64), 64),
    ((16, 64), "__half", 2304, True, (1, 1, 16, 64), 64),  # no planned pitch: whole vectors only
    ((16, 60), "__half", 2048, True, (1, 1, 16, 60), 64),
    ((16, 60), "__half", 1920, True, (1, 1, 16, 60), 60),
    ((16, 60), "__half", 2048, False, (1, 1, 16, 60), 60),
    ((16, 1), "float", 128, True, (1, 1, 16, 1), 1),
    ((2, 3, 4, 5), "float", 1024, True, (2, 3, 4, 5), 8),
    ((7,), "__nv_bfloat16", 128, True, (1, 1, 1, 7), 8),
]


@pytest.mark.parametrize("shape, element, capacity, row_major, dims, pitch", LAYOUTS)
def test_tile_layout(shape, element, capacity, row_major, dims, pitch):
    layout = tile_layout(shape, element, capacity, row_major)
    assert layout == ctx.TileLayout(dims, pitch)
    assert layout.storage * lower_ops.element_size(element) <= capacity


PLANNED_PITCHES = [
    # shape, element, capacity, planned pitch, expected pitch
    ((16, 64), "__half", 2304, 72, 72),  # the plan's extra vector per row (swizzle by padding)
    ((16, 64), "__half", 2048, 72, 64),  # the buffer is too small for it: whole vectors
    ((16, 64), "__half", 4096, 68, 64),  # not a whole number of vectors: ignored
    ((16, 64), "float", 4608, 72, 72),  # an fp32 accumulator keeps the plan's pitch in elements
    ((2, 16, 8), "__half", 1024, 16, 16),
]


@pytest.mark.parametrize("shape, element, capacity, planned, pitch", PLANNED_PITCHES)
def test_tile_layout_takes_the_planned_pitch(shape, element, capacity, planned, pitch):
    assert tile_layout(shape, element, capacity, True, planned).pitch == pitch


@pytest.mark.parametrize(
    "shape, strides, pitch",
    [
        ((16, 64), (72, 1), 72),
        ((1, 16, 64), (1152, 72, 1), 72),
        ((4, 1, 8), (8, 8, 1), 8),
        ((1, 64), (64, 1), None),
    ],
)
def test_plan_pitch(shape, strides, pitch):
    assert plan_pitch(shape, strides) == pitch


def test_matmul_operands_use_the_planned_padded_rows():
    """The optimizer pads (swizzles) matmul operand rows; the generated tiles follow its strides."""
    program = generate_cuda_program(CASES["gatedmlp_m1"].fused(), 90)
    (context,) = program.contexts
    (kernel,) = program.prepared.kernels
    for it in context.iterators:
        layout = kernel.layouts[it.node]
        planned = plan_pitch(layout.shape, layout.strides)
        assert it.tile.layout.pitch == (planned or it.tile.layout.dims[3])
    assert any(it.tile.layout.pitch > it.tile.layout.dims[3] for it in context.iterators)


def test_tile_layout_refuses_a_small_buffer():
    with pytest.raises(LoweringError, match="needs 2048 bytes"):
        tile_layout((16, 64), "__half", 1024, True)


@pytest.mark.parametrize(
    "value, literal",
    [
        (0.5, "0.5f"),
        (4096, "4096.0f"),
        (1e-06, "1e-06f"),
        (-2.0, "-2.0f"),
        (1e20, "1e+20f"),
        (float("-inf"), "mirage::gen::negative_infinity()"),
    ],
)
def test_cfloat(value, literal):
    assert cfloat(value) == literal


def test_every_elementwise_op_has_a_functor():
    from mirage.mugraph.ops import ELEMENTWISE

    assert set(lower_ops.FUNCTORS) == set(ELEMENTWISE)
    assert lower_ops.FUNCTORS[Op.GELU].name == "mirage::gen::GeluTanh"
    assert lower_ops.FUNCTORS[Op.CLAMP].constants(mi.mugraph.graph.Clamp(-1.0, 2.0)) == (-1.0, 2.0)


# ---- bad input -------------------------------------------------------------------------------------


def _big_accumulator() -> mi.KernelGraph:
    """A [256, 384] fp16 tile (192 KiB) and its fp32 accumulator (384 KiB)."""
    g = mi.new_kernel_graph("big_accumulator")
    x = g.new_input(dims=(256, 384), dtype=mi.float16)
    tb = mi.new_threadblock_graph(grid_dim=(1, 1, 1), block_dim=(128, 1, 1), forloop_range=1)
    tb.new_output(tb.forloop_accum(tb.new_input(x)))
    (o,) = g.customized([x], tb)
    g.mark_output(o)
    return g.freeze()


@pytest.mark.parametrize("target", ["H100", "A100"])
def test_over_the_shared_memory_limit(target):
    # on the H100 the plan (fp32 accumulator) overflows; on the A100 already the input tile does
    with pytest.raises(SharedMemoryError, match=f"more than the {TARGETS[target].smem_per_block}"):
        generate_cuda_program(_big_accumulator(), target=TARGETS[target])


def _rescale_by_input() -> mi.KernelGraph:
    g = mi.new_kernel_graph("rescale_by_input")
    x = g.new_input(dims=(16, 64), dtype=mi.float16)
    m = g.new_input(dims=(16, 1), dtype=mi.float16)
    tb = mi.new_threadblock_graph(grid_dim=(1, 1, 1), block_dim=(128, 1, 1), forloop_range=2)
    bx = tb.new_input(x, forloop_dim=1)
    bm = tb.new_input(m)
    tb.new_output(tb.forloop_accum_rescale(bx, bm))
    (o,) = g.customized([x, m], tb)
    g.mark_output(o)
    return g.freeze()


def test_an_op_without_a_lowering():
    with pytest.raises(LoweringError, match="only a running_max has a lowering"):
        generate_cuda_program(_rescale_by_input(), 90)


def test_an_elementwise_op_without_a_functor(monkeypatch):
    monkeypatch.delitem(lower_ops.FUNCTORS, Op.SILU)
    with pytest.raises(LoweringError, match="silu has no device functor"):
        generate_cuda_program(small_linear(), 90)


def test_float64_tiles_have_no_lowering():
    g = mi.new_kernel_graph("double")
    x = g.new_input(dims=(16, 64), dtype=mi.float64)
    tb = mi.new_threadblock_graph(grid_dim=(1, 1, 1), block_dim=(128, 1, 1), forloop_range=1)
    tb.new_output(tb.forloop_accum(tb.new_input(x)))
    (o,) = g.customized([x], tb)
    g.mark_output(o)
    with pytest.raises(LoweringError, match="float64"):
        generate_cuda_program(g.graph, 90)


def test_unknown_compute_capability():
    with pytest.raises(LoweringError, match="compute capability 42"):
        target_for(42)
    assert target_for(90).compute_capability == 90
    assert target_for(target=TARGETS["A100"]) is TARGETS["A100"]


@pytest.mark.parametrize("target_cc", ["90", 9.0, True])
def test_a_compute_capability_that_is_not_an_int_says_so(target_cc):
    with pytest.raises(LoweringError) as info:
        generate_cuda_program(CASES["gqa_b1"].fused(), target_cc)
    assert "target_cc must be an int such as 90" in str(info.value)
    assert repr(target_cc) in str(info.value)
    assert "no known GPU" not in str(info.value)


def test_options_must_be_optimizer_options():
    from mirage.optimizer.errors import OptimizerError

    with pytest.raises(OptimizerError, match=r"pass options=mirage\.optimizer\.OptimizerOptions\(") as info:
        generate_cuda_program(CASES["gqa_b1"].fused(), 90, options={"row_reductions": False})
    assert "got dict" in str(info.value)
    with pytest.raises(LoweringError, match="target must be a mirage.mugraph.target.Target"):
        generate_cuda_program(CASES["gqa_b1"].fused(), target="H100")


def test_lowering_error_is_a_mirage_error():
    assert issubclass(LoweringError, mi.MirageError)
    assert dataclasses.is_dataclass(ctx.KernelContext)


def test_accumulators_of_a_one_iteration_loop_are_stored_without_clearing():
    """nTrans op by op (forloop_range 1): the accumulator is the rms_norm's epilogue and a plain store."""
    program = generate_cuda_program(CASES["ntrans_b1"].fused(), 90, options=OP_BY_OP_ROWS)
    (context,) = program.contexts
    steps = context.pre_loop + context.loop + context.post_loop
    assert not [s for s in steps if s.kind == "fill"]
    accumulator = next(
        i for i, n in enumerate(program.prepared.kernels[0].block_graph.nodes) if n.op is Op.ACCUM
    )
    (chain,) = [s for s in steps if s.kind == "chain" and s.sink.node == accumulator]
    # a plain store (here straight into the output: only the saver reads the accumulator)
    assert chain.sink.kind in (ctx.SinkKind.STORE, ctx.SinkKind.GLOBAL) and chain.producer.kind == "rms_norm"
    rms_rows_context = generate_cuda_program(rms_rows(), 90).contexts[0]  # forloop_range 2: cleared, added
    fills = [s for s in rms_rows_context.pre_loop if s.kind == "fill"]
    assert len(fills) == 1  # the exp sum's tile; the rms sums in registers
    shared = generate_cuda_program(rms_rows(), 90, options=OptimizerOptions(register_row_sums=False))
    assert len([s for s in shared.contexts[0].pre_loop if s.kind == "fill"]) == 2


def test_mean_and_rms_accumulators_sum_in_registers():
    """An rms accumulator of a tile: declared and cleared before the loop, added per iteration
    with no shuffle or shared write, finished into its tile after the loop (no fill, no
    block reduction); with register_row_sums=False it is the shared tile's block reduction."""
    program = generate_cuda_program(rms_rows(), 90)
    (context,) = program.contexts
    (declared,) = context.row_sums
    (add,) = [s for s in context.loop if s.kind == "row_sums"]
    (back,) = [s for s in context.post_loop if s.kind == "finalize" and s.row_sums is not None]
    assert declared == add.sums == back.row_sums and back.finalize is ctx.FinalizeKind.RMS
    assert back.count == 2 * 128 and back.eps == 1e-6
    assert f"{declared.name}.clear();" in program.code
    assert f"{add.sums.name}.add({add.sums.operand.name});" in program.code
    assert "finalize_rms" not in program.code
    assert program.code.count("reduce_apply") == 1  # the exp sum's (a plain sum: no finalize step)
    assert "mirage::gen::FinishRms{256.0f, 1e-06f}" in program.code
    shared = generate_cuda_program(rms_rows(), 90, options=OptimizerOptions(register_row_sums=False))
    assert "RowSums" not in shared.code and "finalize_rms" in shared.code
    assert shared.code.count("reduce_apply") == 2


def test_reductions_get_a_scratch_after_the_planned_buffers():
    """The block-wide reduction scratch sits after the memory plan and is counted in the launch."""
    program = generate_cuda_program(ntrans.fused(1, threads=512), 90, options=OP_BY_OP_ROWS)
    ((context, kernel),) = zip(program.contexts, program.prepared.kernels, strict=True)
    producers = [s.producer for s in context.loop if s.kind == "chain" and s.producer.kind == "rms_norm"]
    assert len(producers) == 2
    offset = -(-kernel.smem_bytes // 16) * 16
    assert {p.scratch for p in producers} == {offset}
    assert program.kernels[0].smem_bytes == context.smem_bytes == offset + 4 * 512 // 32
    assert f"ReductionScratch{{mirage::dev::shared_at<float>(shared, {offset})}}" in program.code
    lora = generate_cuda_program(CASES["lora_m16"].fused(), 90)  # no reduction: no scratch
    assert lora.kernels[0].smem_bytes == lora.prepared.kernels[0].smem_bytes
    assert "ReductionScratch" not in lora.code


@pytest.mark.parametrize("case", ["gqa_b1", "rmsnorm_b8", "ntrans_b1"])
def test_kernels_overlap_their_neighbours_only_before_global_memory(case):
    """Programmatic dependent launch: each kernel lets the next launch first thing, and waits for
    the previous one before its first step (every global load and store comes after the wait)."""
    code = generate_cuda_program(CASES[case].fused()).code
    for kernel in code.split('extern "C"')[1:]:
        body = kernel.split(") {", 1)[1]
        launch = body.index("launch_dependent_grids();")
        wait = body.index("wait_for_prerequisite_grids();")
        assert launch < wait < body.index("// ---- before the for-loop")
        before = body[:wait]
        assert ".load(" not in before and "save(" not in before and ".read" not in before


def test_l2_prefetch_comes_before_the_dependency_wait():
    """``l2_prefetch_iterations`` (off by default: measured slower, docs/performance.md) pulls each
    input's first tiles into L2 before the wait; loop-invariant inputs have one tile."""
    options = dataclasses.replace(OptimizerOptions(), l2_prefetch_iterations=2)
    code = generate_cuda_program(CASES["rmsnorm_b1"].fused(), options=options).code
    body = code.split('extern "C"')[1]
    wait = body.index("wait_for_prerequisite_grids();")
    assert body.count("prefetch_l2(tile)") == 3
    assert all(body.index(f"in{i}.prefetch_l2") < wait for i in range(3))
    assert "prefetch_l2" not in generate_cuda_program(CASES["rmsnorm_b1"].fused()).code


def test_a_row_vector_product_is_folded_into_the_matmul_operand():
    """rmsnorm's (X·g) @ W: the matmul reads X and scales its A fragments by g; X·g has no step and
    no tile. With fold_operand_scale=False, X·g is stored and the matmul reads it; an X·g that
    something else reads too is stored in either case."""
    program = generate_cuda_program(CASES["rmsnorm_b8"].fused(), 90)
    (context,) = program.contexts
    (chain,) = [s for s in context.loop if s.kind == "register_chain"]
    x, gain, w = (it.tile.name for it in context.iterators)
    assert chain.producer.scale.name == gain
    assert [t.name for t in chain.producer.operands] == [x, w]
    assert f"::accumulate_scaled(registers{chain.accumulator.node}, {gain}, {x}, {w});" in program.code
    assert not [s for s in context.loop if s.kind == "chain"]
    stored = generate_cuda_program(CASES["rmsnorm_b8"].fused(), 90,
                                   options=OptimizerOptions(fold_operand_scale=False))
    assert "accumulate_scaled" not in stored.code and "map_apply" in stored.code
    g = mi.new_kernel_graph("reused_product")
    xs, gs, ws = (g.new_input(dims=s, dtype=mi.float16) for s in ((16, 256), (1, 256), (256, 64)))
    tb = mi.new_threadblock_graph(grid_dim=(1, 1, 1), block_dim=(128, 1, 1), forloop_range=2)
    bx = tb.new_input(xs, input_map=(-1, -1, -1), forloop_dim=1)
    bg = tb.new_input(gs, input_map=(-1, -1, -1), forloop_dim=1)
    bw = tb.new_input(ws, input_map=(-1, -1, -1), forloop_dim=0)
    scaled = tb.mul(bx, bg)
    tb.new_output(tb.forloop_accum(tb.matmul(scaled, bw)), output_map=(-1, -1, -1))
    tb.new_output(tb.forloop_accum(scaled, acc="sum"), output_map=(-1, -1, -1))
    outs = g.customized([xs, gs, ws], tb)
    for o in outs:
        g.mark_output(o)
    assert "accumulate_scaled" not in generate_cuda_program(g.freeze(), 90).code



@pytest.mark.parametrize("n,dtype", [(12, mi.float16), (64, mi.float32)])
def test_a_scale_is_not_folded_off_the_tensor_core_path(n, dtype):
    """(X·g) @ W with N not a multiple of 8, or fp32 operands (TF32 fragments): the tensor-core
    fragment scale does not apply, so X·g is stored and the product reads it."""
    g = mi.new_kernel_graph("off_path")
    xs, gs, ws = (g.new_input(dims=s, dtype=dtype) for s in ((16, 256), (1, 256), (256, n)))
    tb = mi.new_threadblock_graph(grid_dim=(1, 1, 1), block_dim=(128, 1, 1), forloop_range=2)
    bx = tb.new_input(xs, input_map=(-1, -1, -1), forloop_dim=1)
    bg = tb.new_input(gs, input_map=(-1, -1, -1), forloop_dim=1)
    bw = tb.new_input(ws, input_map=(-1, -1, -1), forloop_dim=0)
    tb.new_output(tb.forloop_accum(tb.matmul(tb.mul(bx, bg), bw)), output_map=(-1, -1, -1))
    (out,) = g.customized([xs, gs, ws], tb)
    g.mark_output(out)
    program = generate_cuda_program(g.freeze(), 90)
    assert "accumulate_scaled" not in program.code and "::accumulate(" in program.code


def test_tiles_that_several_blocks_load_start_at_a_row_of_their_own():
    """stagger_shared_loads: rmsnorm's X tile (every block loads it) gets the rotation by block index;
    W's tile (one per block) and the one-row gain tile do not; off by default."""
    from benchmarks.variants import family

    _, graph = family("rmsnorm_b8")[0]
    plain = generate_cuda_program(graph, 90)
    staggered = generate_cuda_program(graph, 90, options=OptimizerOptions(stagger_shared_loads=True))
    assert "kThreads, false, true> " not in plain.code
    (kernel,) = staggered.contexts
    by_source = {it.source_dims: it.staggered for it in kernel.iterators}
    assert by_source == {(1, 1, 16, 4096): True, (1, 1, 1, 4096): False, (1, 1, 4096, 6144): False}
    assert staggered.code.count("kThreads, false, true> ") == 1
    assert "static_cast<int>(blockIdx.x + 128u * (blockIdx.y + 1u * blockIdx.z))" in staggered.code


def test_weight_strips_that_no_other_block_reads_leave_l2_first():
    """evict_first_streams (on by default): rmsnorm's W tile (one strip per block) is copied with the
    evict-first L2 policy; X and the gain, which every block loads, are not; off, no iterator is."""
    from benchmarks.variants import family

    _, graph = family("rmsnorm_b8")[0]
    hinted = generate_cuda_program(graph, 90)
    plain = generate_cuda_program(graph, 90, options=OptimizerOptions(evict_first_streams=False))
    (kernel,) = hinted.contexts
    by_source = {it.source_dims: it.evict_first for it in kernel.iterators}
    assert by_source == {(1, 1, 16, 4096): False, (1, 1, 1, 4096): False, (1, 1, 4096, 6144): True}
    assert hinted.code.count("kThreads, false, false, true> ") == 1
    assert not any(it.evict_first for k in plain.contexts for it in k.iterators)
    assert "false, false, true>" not in plain.code
