"""TMA copies of a warpgroup chain's K and V (``OptimizerOptions.tma_copies``): which inputs qualify,
what the generated kernel declares and how it launches, that it compiles to TMA instructions instead
of the threads' copies, and the errors for tensors that a tensor map cannot describe. The GPU checks
(bit-identical to the cp.async build) are in tests/gpu/test_tma_gpu.py."""

from __future__ import annotations

import dataclasses
import re

import pytest
from codegen_helpers import needs_nvcc

from benchmarks.mugraphs import attention
from benchmarks.variants import family
from mirage.codegen import tensor_maps
from mirage.codegen.compile import CompileOptions, Stage, compile_sources
from mirage.codegen.lower_program import KernelLaunch, generate_cuda_program
from mirage.mugraph.target import TARGETS
from mirage.optimizer import OptimizerOptions

WARPGROUP = OptimizerOptions(warpgroup_softmax=True)
TMA = dataclasses.replace(WARPGROUP, tma_copies=True, tma_release=False)
RELEASE = dataclasses.replace(TMA, tma_release=True)


def _gqa(case: str = "gqa_b8", *parts: str):
    return next(g for row, g in family(case) if all(p in row.label for p in parts))


@pytest.fixture(scope="module")
def gqa_b8():
    graph = _gqa("gqa_b8", "kv_splits=8,q_splits=2,iters=8,threads=128,", "combine_rows=8")
    return {name: generate_cuda_program(graph, 90, options=options)
            for name, options in (("cp_async", WARPGROUP), ("tma", TMA), ("release", RELEASE),
                                  ("producer", dataclasses.replace(RELEASE, producer_warp=True)))}


def test_k_and_v_of_the_warpgroup_chain_get_tensor_maps(gqa_b8):
    """K (input 1) and V (input 2) are copied through tensor maps, Q is not (loaded before the loop)."""
    tma = gqa_b8["tma"]
    attention = tma.kernels[0]
    assert attention.tensor_maps == (tensor_maps.TensorMapSpec(1, (1, 1, 64, 64)),
                                     tensor_maps.TensorMapSpec(2, (1, 1, 64, 64)))
    assert all(not k.tensor_maps for k in tma.kernels[1:])  # the combine copies nothing by TMA
    assert KernelLaunch.from_dict(attention.to_dict()) == attention
    code = tma.code
    assert "const __grid_constant__ CUtensorMap tmap1," in code
    assert "const __grid_constant__ CUtensorMap tmap2) {" in code
    assert len(re.findall(r"TensorMapIterator<__half, mirage::dev::Swizzled128Layout", code)) == 2
    assert "in1.wait(iteration);" in code and "in2.wait(iteration);" in code
    assert "InputIterator<__half, mirage::dev::Swizzled128Layout<1, 1, 128, 64>" in code  # Q
    # the stages' barriers follow the buffers: the plan grows by them
    assert attention.smem_bytes > gqa_b8["cp_async"].kernels[0].smem_bytes


def test_a_head_dim_of_128_gets_two_boxes_a_value_tile():
    """A shape no suite case has: K's tiles are 128 rows of one box, V's 64 rows of two boxes."""
    graph = attention.rows_fused(2, 128, 128, 2048, kv_splits=8, q_splits=2, iters=4, threads=128,
                                 combine_splits=2)
    program = generate_cuda_program(graph, 90, options=RELEASE)
    assert program.kernels[0].tensor_maps == (tensor_maps.TensorMapSpec(1, (1, 1, 128, 64)),
                                              tensor_maps.TensorMapSpec(2, (1, 1, 64, 64)))
    assert "Swizzled128Layout<1, 1, 64, 128>, 2, kThreads> in2(" in program.code
    assert "release(iteration)" in program.code


def test_no_tensor_maps_without_the_warpgroup_chain_or_with_folds():
    graph = _gqa("gqa_b8", "kv_splits=8,q_splits=2,iters=8,threads=128,", "combine_rows=8")
    warp = generate_cuda_program(graph, 90, options=OptimizerOptions(tma_copies=True))
    assert not any(k.tensor_maps for k in warp.kernels) and "TensorMapIterator" not in warp.code
    folded = next(g for row, g in family("gqa_b1", fold=True)
                  if "combine_threads=128" in row.label and "kv_splits=16" in row.label)
    program = generate_cuda_program(folded, 90, options=dataclasses.replace(TMA, cluster_folds=True))
    assert "TensorMapIterator" not in program.code
    rms = next(g for row, g in family("rmsnorm_b8"))
    assert "TensorMapIterator" not in generate_cuda_program(rms, 90, options=TMA).code


def _loop(code: str) -> str:
    return code.split("// ---- the for-loop")[1].split("// ---- after the for-loop")[0]


def test_released_stages_take_the_block_barriers_out_of_the_loop(gqa_b8):
    """With tma_release the loop waits for its stages' transaction barriers and hands each stage back
    through its empty barrier: no block barrier and no cp.async wait in the loop, one after it."""
    loop = _loop(gqa_b8["release"].code)
    assert "__syncthreads" not in loop and "Pipeline" not in loop
    assert "in1.release(iteration);" in loop and "in2.release(iteration);" in loop
    assert "TensorMapIterator<__half, mirage::dev::Swizzled128Layout<1, 1, 64, 64>, 2, kThreads>" in (
        gqa_b8["release"].code)
    after = gqa_b8["release"].code.split("// ---- after the for-loop")[1]
    assert after.lstrip().startswith("__syncthreads();")
    assert "__syncthreads();  // end of iteration" in _loop(gqa_b8["tma"].code)  # without: as before


def test_stages_are_not_released_where_the_loop_has_more_than_the_chain():
    """QKNorm's key-scale members whose key norms are not the chain's reduce K's columns in the loop (a
    step with its own barrier): they keep the block barriers. With the chain's key norms (the default)
    the loop is the chain's step alone and hands its stages back."""
    scales = next(g for row, g in family("qknorm_b8") if "key_scales" in row.label)
    stepped = dataclasses.replace(RELEASE, warpgroup_key_norms=False)
    program = generate_cuda_program(scales, 90, options=stepped)
    assert "TensorMapIterator" in program.code and "release(iteration)" not in program.code
    loop = _loop(generate_cuda_program(scales, 90, options=RELEASE).code)
    assert "__syncthreads" not in loop and "in1.release(iteration);" in loop


def test_a_deferred_values_tile_is_released_a_step_late():
    """A deferred P·V reads V during the next step: K's stage goes back after its step, V's after the
    next one, and the loop has no block barrier."""
    graph = _gqa("gqa_b8", "kv_splits=8,q_splits=2,iters=8,threads=128,", "combine_rows=8")
    deferred = generate_cuda_program(graph, 90, options=dataclasses.replace(RELEASE, defer_values=True))
    loop = deferred.code.split("for (int iteration = 0;")[1].split("// ---- after the for-loop")[0]
    assert "in1.release(iteration);" in loop and "if (iteration > 0) in2.release(iteration - 1);" in loop
    assert "__syncthreads" not in loop and "Pipeline<" not in loop


def test_a_producer_warp_issues_every_copy_and_joins_the_barriers_before_the_loop(gqa_b8):
    """With producer_warp the released loop's copies move to one more warp: the block launches with 32
    more threads (and asks the registers for them), the iterators copy from the first thread past the
    computing ones; that warp issues the first stages, meets the computing threads at their one block
    barrier before the loop (Q has landed), issues the rest and leaves before the computing code; the
    loop only waits, computes and releases. Without a released loop, or where a pre-loop step holds
    barriers of its own (QKNorm's Q norm), nothing changes."""
    program = gqa_b8["producer"]
    assert program.kernels[0].block == (160, 1, 1) and "__launch_bounds__(160)" in program.code
    assert "Swizzled128Layout<1, 1, 64, 64>, 2, kThreads, kThreads> in1(" in program.code
    producer = program.code.split("if (mirage::dev::thread_index() >= kThreads) {")[1].split("return;")[0]
    first, rest = producer.split("__syncthreads();  // the computing threads' barrier 1 before the loop")
    assert "wait_for_prerequisite_grids();" in first and "iteration < 2;" in first
    assert "in1.load(iteration);" in first and "in2.load(iteration);" in rest and "__syncthreads" not in rest
    before = program.code.split("// ---- before the for-loop")[1].split("// ---- the for-loop")[0]
    assert before.count("::wait();") + before.count("__syncthreads") == 1  # the barrier it joins
    loop = _loop(program.code)
    assert ".load(" not in loop and "__syncthreads" not in loop and "in1.release(iteration);" in loop
    assert program.kernels[1].block == (128, 1, 1)  # the combine: no TMA, no producer warp
    graph = _gqa("gqa_b8", "kv_splits=8,q_splits=2,iters=8,threads=128,", "combine_rows=8")
    blocked = generate_cuda_program(graph, 90, options=dataclasses.replace(TMA, producer_warp=True))
    assert "thread_index() >= kThreads" not in blocked.code and blocked.kernels[0].block == (128, 1, 1)
    normed = next(g for row, g in family("qknorm_b1") if "key_scales" in row.label)
    program = generate_cuda_program(normed, 90, options=dataclasses.replace(RELEASE, producer_warp=True))
    assert "thread_index() >= kThreads" not in program.code and "release(iteration)" in program.code


@needs_nvcc
def test_tma_build_compiles_to_tensor_copies(gqa_b8):
    """The TMA build issues UTMALDG and keeps the threads' LDGSTS only for Q: far fewer than the
    cp.async build's, which copies K and V too."""
    results = compile_sources([p.code for p in gqa_b8.values()], CompileOptions(target=TARGETS["H100"]),
                              dumps={Stage.SASS})
    functions = {name: r.sass().split("Function : ")[1:] for name, r in zip(gqa_b8, results, strict=True)}
    attention = {name: next(f for f in fs if "HGMMA" in f) for name, fs in functions.items()}
    assert "UTMALDG" in attention["tma"] and "UTMALDG" not in attention["cp_async"]
    copies = {name: len(re.findall(r"\bLDGSTS", f)) for name, f in attention.items()}
    assert copies["tma"] * 2 < copies["cp_async"], copies
    barriers = {name: len(re.findall(r"\bBAR\.SYNC", f)) for name, f in attention.items()}
    assert barriers["release"] < barriers["tma"], barriers
    assert "UTMALDG" in attention["producer"], "the producer warp's copies"
    for name in ("tma", "release", "producer"):
        assert "LDL" not in attention[name] and "STL" not in attention[name]


@needs_nvcc
def test_q_fragments_feed_the_products_from_registers():
    """With ``q_fragments`` every Q·K warpgroup MMA reads its A operand from registers (ldmatrix in the
    loop); without, only the P·V ones do, and Q·K reads Q through descriptors."""
    graph = _gqa("gqa_b8", "kv_splits=8,q_splits=2,iters=8,threads=256,", "combine_rows=8")
    codes = [generate_cuda_program(graph, 90, options=dataclasses.replace(RELEASE, q_fragments=f)).code
             for f in (True, False)]
    results = compile_sources(codes, CompileOptions(target=TARGETS["H100"]), dumps={Stage.SASS})
    attention = [next(f for f in r.sass().split("Function : ")[1:] if "HGMMA" in f) for r in results]
    from_registers = [len(re.findall(r"HGMMA\.64x64x16\.F32 R\d+, R\d+, gdesc", f)) for f in attention]
    from_shared = [len(re.findall(r"HGMMA\.64x64x16\.F32 R\d+, gdesc", f)) for f in attention]
    assert from_shared[0] == 0 and from_registers[0] == 2 * from_registers[1] > 0, from_registers
    assert from_shared[1] == from_registers[1]  # 4 Q·K (descriptors) and 4 P·V (registers) per sub-tile
    for f in attention:
        assert "LDL" not in f and "STL" not in f


def test_tensor_maps_refuse_what_tma_cannot_copy():
    torch = pytest.importorskip("torch")
    spec = tensor_maps.TensorMapSpec(1, (1, 1, 64, 64))
    with pytest.raises(tensor_maps.TensorMapError, match="fp16/bf16"):
        tensor_maps.encode(torch.zeros(16, 64, 4096), spec)
    with pytest.raises(tensor_maps.TensorMapError, match="innermost stride"):
        tensor_maps.encode(torch.zeros(16, 4096, 64, dtype=torch.float16).transpose(1, 2), spec)
    rows_of_ten = torch.zeros(16, 64, 4101, dtype=torch.float16)[:, :, :4096]
    with pytest.raises(tensor_maps.TensorMapError, match="16-byte"):
        tensor_maps.encode(rows_of_ten, spec)
    # a map of an input read in place describes the row-major tensor the input is a view of
    transposed = tensor_maps.TensorMapSpec(1, (1, 1, 64, 64), transposed=True)
    assert tensor_maps.TensorMapSpec.from_dict(transposed.to_dict()) == transposed
    with pytest.raises(tensor_maps.TensorMapError, match="innermost stride"):
        tensor_maps.encode(torch.zeros(16, 64, 4096, dtype=torch.float16), transposed)


def test_a_tensor_map_spec_keeps_its_swizzle_and_refuses_spans_the_driver_lacks():
    """0 lands rows as they are (a weight strip's unpadded tiles); a record written before the field
    existed reads back as the 128-byte swizzle it meant."""
    unswizzled = tensor_maps.TensorMapSpec(2, (1, 1, 256, 48), swizzle=0)
    assert tensor_maps.TensorMapSpec.from_dict(unswizzled.to_dict()) == unswizzled
    assert tensor_maps.TensorMapSpec.from_dict({"input": 1, "box": [1, 1, 64, 64]}).swizzle == 128
    with pytest.raises(tensor_maps.TensorMapError, match="0, 32, 64 or 128"):
        tensor_maps.TensorMapSpec(1, (1, 1, 64, 64), swizzle=48)


def test_a_misaligned_input_is_copied_into_aligned_storage():
    torch = pytest.importorskip("torch")
    base = torch.arange(16 * 64 * 64 + 8, dtype=torch.float16)
    shifted = base[1:1 + 16 * 64 * 64].view(16, 64, 64)
    assert shifted.data_ptr() % 16 == 2
    copy = tensor_maps.aligned(shifted)
    assert copy.data_ptr() % 16 == 0 and torch.equal(copy, shifted)
    whole = base[:16 * 64 * 64].view(16, 64, 64)
    assert tensor_maps.aligned(whole) is whole
