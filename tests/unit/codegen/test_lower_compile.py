"""Generated CUDA compiles with this machine's nvcc for sm_90a (the CI subset).

CI builds a small, fixed subset in parallel through the cubin cache: a few benchmark µGraphs, random
µGraphs and search results.  The full set (every benchmark µGraph at both sizes, 60 random µGraphs,
every search result) runs as ``python -m mirage.codegen.gpu_check compile --random 60 --search
tests/unit/codegen/snapshots/search_sample.json``; its report is committed under benchmarks/results/.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from codegen_helpers import needs_nvcc

from benchmarks.mugraphs import CASES
from mirage.codegen.compile import CompileOptions, Stage, compile_sources
from mirage.codegen.lower_program import generate_cuda_program
from mirage.codegen.random_graphs import random_graph
from mirage.mugraph.serialize import graph_from_dict
from mirage.mugraph.target import TARGETS
from mirage.optimizer import OptimizerOptions
from tests.unit.verifier.verifier_graphs import masked_attention

SEARCH_SAMPLE = Path(__file__).parent / "snapshots" / "search_sample.json"
BENCHMARKS = ["gqa_b1", "rmsnorm_b8", "lora_m16", "ntrans_b1"]
RANDOM_SEEDS = [0, 1, 2, 5, 98]  # 98: a SIMT register accumulator (no K split)
SEARCH_NAMES = ["search_gated_0", "search_softmax_rows_0"]
MASKED_FORMS = ["whole", "split"]  # attention with an additive mask, one kernel and FlashDecoding's two



pytestmark = needs_nvcc


def _search_graph(name: str):
    records = json.loads(SEARCH_SAMPLE.read_text())["graphs"]
    return graph_from_dict(next(r["graph"] for r in records if r["name"] == name))


def _register_attention():
    """The tuned QKNorm member: K-normalize kernel, softmax chain in registers, row-local combine."""
    from benchmarks.variants import family

    return family("qknorm_b1")[0][1]


def _key_scales():
    """The tuned QKNorm member that divides each score by its key's rms (per-key factors)."""
    from benchmarks.variants import family

    return next(g for row, g in family("qknorm_b1") if "key_scales" in row.label)


def _normalize_k():
    """The QKNorm member that normalizes K in a kernel of its own: its attention kernel copies its first
    V stages before waiting for that kernel (early loads)."""
    from benchmarks.variants import family

    return next(g for row, g in family("qknorm_b8") if "normalize_k" in row.label)


def _gqa_b8_long_iterations():
    """The gqa_b8 member of 4 key splits: 128 keys an iteration, two 64-key sub-tiles a warpgroup."""
    from benchmarks.variants import family

    return next(g for row, g in family("gqa_b8") if "kv_splits=4,q_splits=2,iters=8,threads=256" in row.label)


def _folded_attention():
    """A GQA member whose combine folds into the attention kernel (clusters of 16 blocks)."""
    from benchmarks.variants import family

    return next(g for row, g in family("gqa_b1", fold=True)
                if "combine_threads=128" in row.label and "kv_splits=16" in row.label)


def _gqa_b8():
    """The suite's gqa_b8 member: 128 query rows over 4 warps (one warpgroup, two 64-row tiles)."""
    from benchmarks.variants import family

    return next(g for row, g in family("gqa_b8") if "threads=128" in row.label and "iters=8" in row.label
                and "combine_rows=8" in row.label)


def _gqa_b1_32_splits():
    """A GQA member of 32 key splits: its combine's direct loop runs 32 iterations, over the 26 whose
    reads fit a batch's registers, so in two batches."""
    from benchmarks.variants import family

    return next(g for row, g in family("gqa_b1", wide=True)
                if row.label == "kv_splits=32,q_splits=4,iters=2,threads=128,row_sums=True,combine_rows=8")


def _masked(form: str = "whole", pattern: str = ""):
    """Attention with an additive mask: 64-row blocks looping over 64 keys at a time, or 4 key splits;
    ``pattern``: the mask input's (the causal one is computed by the chain, not read)."""
    return masked_attention(heads=4, queries=128, keys=256, dim=64, form=form,
                            rows=64 if form == "whole" else 16, key_tile=64, kv_splits=4, pattern=pattern)


def _per_key(form: str = "whole"):
    """Attention with a key-padding mask: one value a key, (1, 1, 256), which every query row adds."""
    return masked_attention(heads=4, queries=128, keys=256, dim=64, form=form,
                            rows=64 if form == "whole" else 16, key_tile=64, kv_splits=4, per_key=True)


def _causal(form: str = "whole"):
    return _masked(form, "causal:128")


def _rmsnorm_b8():
    from benchmarks.mugraphs import mlp

    return mlp.rmsnorm_fused(8, grid=128, iters=16, threads=256)


WITH_OPTIONS = {"gqa_folded": (_folded_attention, OptimizerOptions(cluster_folds=True)),
          "rmsnorm_multicast": (_rmsnorm_b8, OptimizerOptions(multicast_cluster=2)),
          "qknorm_normalize_k_early_loads": (_normalize_k, OptimizerOptions()),
          "gqa_counter_folded": (_folded_attention, OptimizerOptions(counter_folds=True)),
          "qknorm_key_norms": (_key_scales, OptimizerOptions(chain_key_norms=True)),
          "gqa_warpgroup": (_gqa_b8, OptimizerOptions(warpgroup_softmax=True)),
          # K and V copied by TMA (the selected form; with cp.async copies the 128-key sub-tiles spill)
          "qknorm_warpgroup_key_norms": (_key_scales,
                                         OptimizerOptions(warpgroup_softmax=True, tma_copies=True)),
          "gqa_warpgroup_deferred": (_gqa_b8, OptimizerOptions(warpgroup_softmax=True, defer_values=True)),
          "gqa_warpgroup_sub_tiles": (_gqa_b8_long_iterations,
                                      OptimizerOptions(warpgroup_softmax=True, tma_copies=True)),
          "ntrans_op_by_op": (CASES["ntrans_b1"].fused, OptimizerOptions(row_reductions=False)),
          "gqa_32_splits": (_gqa_b1_32_splits, OptimizerOptions(warpgroup_softmax=True, tma_copies=True)),
          "masked_attention_warpgroup": (_masked, OptimizerOptions(warpgroup_softmax=True, tma_copies=True)),
          "per_key_attention_whole": (_per_key, OptimizerOptions()),
          "per_key_attention_split": (lambda: _per_key("split"), OptimizerOptions()),
          "per_key_attention_warpgroup": (_per_key,
                                          OptimizerOptions(warpgroup_softmax=True, tma_copies=True)),
          "causal_attention_whole": (_causal, OptimizerOptions()),
          "causal_attention_split": (lambda: _causal("split"), OptimizerOptions()),
          "causal_attention_warpgroup": (_causal, OptimizerOptions(warpgroup_softmax=True, tma_copies=True)),
          "causal_attention_read": (_causal, OptimizerOptions(generated_masks=False))}
TWO_PASS = "#define MIRAGE_SOFTMAX_INTERLEAVE 0\n"
PER_ELEMENT = "#define MIRAGE_SOFTMAX_FOLD_SCALE 0\n"
# name → (the build it recompiles, the macros before its code)
LAZY_RESCALE = "#define MIRAGE_SOFTMAX_RESCALE_SLACK 8\n"
IN_TURN = "#define MIRAGE_SOFTMAX_LOOKAHEAD 0\n"
SUB_KEYS_64 = "#define MIRAGE_WARPGROUP_SUB_KEYS 64\n"  # two 64-key sub-tiles where an iteration has 128 keys
SKIP_HIDDEN = "#define MIRAGE_SOFTMAX_SKIP_HIDDEN 1\n"
PREFIXES = {"masked_attention_whole_skip": ("masked_attention_whole", SKIP_HIDDEN),
            "masked_attention_warpgroup_skip": ("masked_attention_warpgroup", SKIP_HIDDEN),
            "qknorm_two_pass": ("qknorm_registers", TWO_PASS),
            "qknorm_per_element": ("qknorm_registers", PER_ELEMENT),
            "gqa_warpgroup_lazy": ("gqa_warpgroup", LAZY_RESCALE),
            "gqa_warpgroup_64_key_sub_tiles": ("gqa_warpgroup_sub_tiles", SUB_KEYS_64),
            "gqa_warpgroup_sub_tiles_in_turn": ("gqa_warpgroup_sub_tiles", SUB_KEYS_64 + IN_TURN),
            "qknorm_lazy": ("qknorm_registers", LAZY_RESCALE)}


@pytest.fixture(scope="module")
def built():
    graphs = {name: CASES[name].fused() for name in BENCHMARKS}
    graphs["qknorm_registers"] = _register_attention()
    graphs["qknorm_key_scales"] = _key_scales()
    graphs.update({f"random_{s}": random_graph(s).graph for s in RANDOM_SEEDS})
    graphs.update({name: _search_graph(name) for name in SEARCH_NAMES})
    graphs.update({f"masked_attention_{form}": _masked(form) for form in MASKED_FORMS})
    programs = {name: generate_cuda_program(g, 90) for name, g in graphs.items()}
    programs.update({name: generate_cuda_program(build(), 90, options=o)
                     for name, (build, o) in WITH_OPTIONS.items()})
    programs.update({name: programs[base] for name, (base, _) in PREFIXES.items()})
    results = compile_sources(
        [PREFIXES.get(name, ("", ""))[1] + p.code for name, p in programs.items()],
        CompileOptions(target=TARGETS["H100"]),
        dumps={Stage.SASS},
        return_exceptions=True,
    )
    return {name: (programs[name], result) for name, result in zip(programs, results, strict=True)}


@pytest.mark.parametrize("name", BENCHMARKS + ["qknorm_registers", "qknorm_key_scales", *WITH_OPTIONS]
                         + [f"random_{s}" for s in RANDOM_SEEDS]
                         + SEARCH_NAMES + [f"masked_attention_{form}" for form in MASKED_FORMS])
def test_generated_cuda_compiles_for_sm90a(built, name):
    program, result = built[name]
    assert not isinstance(result, Exception), str(result)
    assert result.cubin()[:4] == b"\x7fELF"
    sass = result.sass()
    functions = re.findall(r"Function : (\S+)", sass)
    assert sorted(functions) == sorted(k.name for k in program.kernels)
    assert "arch = sm_90a" in sass or "sm_90a" in sass


def test_tensor_core_and_async_copy_paths_are_taken(built):
    """The GQA kernels load tiles with cp.async and multiply on tensor cores (HMMA)."""
    _, result = built["gqa_b1"]
    sass = result.sass()
    assert "LDGSTS" in sass and "HMMA" in sass


def test_register_attention_runs_on_tensor_cores_without_local_memory(built):
    """The softmax chain's S and P stay in registers: HMMA, quad shuffles, no spills."""
    program, result = built["qknorm_registers"]
    assert "mirage::gen::OnlineSoftmax<" in program.code and "row-local loop body" in program.code
    sass = result.sass()
    assert "HMMA" in sass and "SHFL.BFLY" in sass
    assert "LDL" not in sass and "STL" not in sass
    functions = {f.split()[0]: f for f in sass.split("Function : ")[1:]}
    combine = functions[program.kernels[-1].name]  # reads its splits straight from global memory
    assert re.search(r"LDG\.E\.(64|128)\.CONSTANT", combine)  # 8- or 16-byte vectors per thread
    # ...and divides and writes its output from registers: no shared memory, no barrier at all
    assert "LDGSTS" not in combine and "BAR.SYNC" not in combine and "STS" not in combine


@pytest.mark.parametrize("name", [f"masked_attention_{form}" for form in
                                  ("whole", "split", "warpgroup", "whole_skip", "warpgroup_skip")])
def test_masked_attention_runs_the_register_chain(built, name):
    """c · S + M with an input tile M: the chain adds M / c to its products (MaskTile), on warp MMAs or,
    with 64-row tiles on sm_90a, warpgroup MMAs; nothing spills. With MIRAGE_SOFTMAX_SKIP_HIDDEN, whether
    a sub-step's mask hides every key is a warp vote, or in the warpgroup form a barrier reduction over
    the warpgroup; without, neither is there."""
    program, result = built[name]
    assert "mirage::gen::OnlineSoftmax<" in program.code and "mirage::gen::MaskTile<" in program.code
    sass = result.sass()
    warpgroup, skip = "warpgroup" in name, name.endswith("skip")
    assert ("HGMMA" in sass) == warpgroup and "LDL" not in sass and "STL" not in sass
    assert ("BAR.RED.AND" in sass) == (skip and warpgroup)
    assert ("VOTE.ALL" in sass) == (skip and not warpgroup)


@pytest.mark.parametrize("name", ["per_key_attention_whole", "per_key_attention_split",
                                  "per_key_attention_warpgroup"])
def test_a_key_padding_mask_runs_the_register_chain_from_its_one_row(built, name):
    """A mask of one value a key, (1, 1, N): the chain reads it as a MaskTile of N values, one row that
    every query row adds, so the block copies N values a step instead of a tile of its rows."""
    program, result = built[name]
    assert "mirage::gen::OnlineSoftmax<" in program.code
    assert re.search(r"MaskTile<mirage::dev::SharedTile<__half, mirage::dev::\w+<1, 1, 1, \d+", program.code)
    sass = result.sass()
    assert ("HGMMA" in sass) == name.endswith("warpgroup") and "LDL" not in sass and "STL" not in sass


@pytest.mark.parametrize("name", ["causal_attention_whole", "causal_attention_split",
                                  "causal_attention_warpgroup"])
def test_a_causal_pattern_is_computed_by_the_chain(built, name):
    """A mask input that names the causal pattern: the chain computes it from its fragments' positions
    (CausalMask), so the kernel neither copies nor stores it, and runs only the loop steps whose keys
    some row of the block sees; with the option off the tile is read."""
    program, result = built[name]
    assert "mirage::gen::CausalMask>" in program.code or "mirage::gen::CausalMask," in program.code
    assert "mirage::gen::MaskTile<" not in program.code and "computed, never read" in program.code
    # the loop stops after the last step whose keys some row of the block sees and no tile past it is
    # copied, where the loop runs the chain alone (the split form loads its one tile in the loop: its
    # chain returns at once instead)
    bounded = "for (int iteration = 0; iteration < iterations; ++iteration)" in program.code
    assert bounded == (name != "causal_attention_split")
    # where the loop is bounded, the row blocks that run the most steps (the last rows) launch first
    assert ("reversed_along(::blockIdx, ::gridDim, 2)" in program.code) == bounded
    (kernel, *_) = program.prepared.kernels
    mask = kernel.softmax_chain.column
    assert kernel.softmax_chain.mask_rows == 128 and mask not in {b.node for b in kernel.memory.buffers}
    read, _ = built["causal_attention_read"]
    assert "mirage::gen::MaskTile<" in read.code and read.prepared.kernels[0].smem_bytes > kernel.smem_bytes
    sass = result.sass()
    assert "LDL" not in sass and "STL" not in sass and ("HGMMA" in sass) == ("warpgroup" in name)


def _longest_load_run(sass: str) -> int:
    """The most global loads that issue one after another with no use of a loaded value between
    them (a load's fp16 → fp32 conversion, ``HADD2.F32``, is the first use)."""
    longest = run = 0
    for line in sass.splitlines():
        if "LDG.E" in line:
            run += 1
            longest = max(longest, run)
        elif "HADD2.F32" in line:
            run = 0
    return longest


def test_direct_loop_batches_issue_their_loads_together(built):
    """A direct loop of 32 iterations runs as two batches of 16, each a compile-time count, so that
    every load of a batch is in flight before the first is used.  With batches of 26 and a run-time
    exit test after each iteration, each iteration's loads were used before the next were issued
    (the 32-split combine took 9.6 µs against 2.4 at 16 splits on the H100)."""
    program, result = built["gqa_32_splits"]
    assert "constexpr int kBatch = 16;" in program.code
    functions = {f.split()[0]: f for f in result.sass().split("Function : ")[1:]}
    combine = functions[program.kernels[-1].name]
    # 16 iterations of a maximum, a sum and 4 columns of O: 96 scalar loads, or 48 with vectors
    assert _longest_load_run(combine) >= 48
    assert "LDL" not in combine and "STL" not in combine


def test_softmax_orders_run_the_same_instructions(built):
    """The chain's exponentials and P·V products interleaved per 16 keys (the default) or in two
    passes: the same tensor-core and SFU instructions (ptxas may schedule both orders alike), and still
    no spills."""
    def counts(sass: str) -> tuple[int, int]:
        return len(re.findall(r"\bHMMA\.", sass)), len(re.findall(r"\bMUFU\.EX2\b", sass))

    interleaved, two_pass = (built[name][1].sass() for name in ("qknorm_registers", "qknorm_two_pass"))
    assert counts(interleaved) == counts(two_pass) and counts(interleaved)[1] > 0
    assert "LDL" not in two_pass and "STL" not in two_pass


def test_lazy_rescale_skips_o_when_no_row_raises_its_reference(built):
    """With a slack (MIRAGE_SOFTMAX_RESCALE_SLACK > 0) O's rescale (an FMUL per accumulator) sits
    behind a warp vote, in both forms of the chain; with none (the default) there is no vote."""
    for name in ("qknorm_lazy", "gqa_warpgroup_lazy"):
        assert "VOTE.ANY" in built[name][1].sass(), name
    for name in ("qknorm_registers", "gqa_warpgroup"):
        assert "VOTE.ANY" not in built[name][1].sass(), name
    for name in ("qknorm_lazy", "gqa_warpgroup_lazy"):
        assert "LDL" not in built[name][1].sass() and "STL" not in built[name][1].sass()


def test_softmax_scale_fold_cuts_the_per_score_work(built):
    """The score scale 1/8 folded into the exponent's FFMA: the chain's row maxima are taken over the
    raw products, and each score costs FMNMX, FFMA, MUFU instead of FMUL, FMUL, FMNMX, FADD, MUFU
    (ptxas merges some of those: at least one instruction a score remains saved)."""
    def counts(sass: str) -> dict[str, int]:  # of the kernel with the most tensor-core work: the chain
        functions = sass.split("Function : ")[1:]
        chain = max(functions, key=lambda f: len(re.findall(r"\bHMMA\.", f)))
        return {op: len(re.findall(rf"\b{op}\b", chain)) for op in ("HMMA", "FMUL", "FADD", "FFMA", "MUFU")}

    assert "kLinearScale = 0.125f" in built["qknorm_registers"][0].code
    folded = counts(built["qknorm_registers"][1].sass())
    per_element = counts(built["qknorm_per_element"][1].sass())
    scores = folded["MUFU"] // 2  # per thread and sub-step (MUFU.EX2: the scores and a few rescales)
    arithmetic = [c["FMUL"] + c["FADD"] + c["FFMA"] for c in (folded, per_element)]
    assert folded["FMUL"] <= per_element["FMUL"] - scores and arithmetic[0] <= arithmetic[1] - scores
    assert (folded["HMMA"], folded["MUFU"]) == (per_element["HMMA"], per_element["MUFU"])
    assert "LDL" not in built["qknorm_per_element"][1].sass()


def test_elementwise_chains_use_vector_shared_accesses(built):
    """nTrans op by op: the rms_norm producers and their element-wise epilogues read and store whole
    chunks (16-byte shared accesses), and a block-wide reduction combines across warps."""
    _, result = built["ntrans_op_by_op"]
    sass = result.sass()
    assert "LDS.128" in sass and "STS.128" in sass
    assert "LDL" not in sass and "STL" not in sass


def test_per_key_factors_stay_in_registers(built):
    """The key_scales kernel: the chain on tensor cores with its factors, no spills, and the sum of
    squares read through the square (a prologue: no separate pass of squares)."""
    program, result = built["qknorm_key_scales"]
    first = program.code.split('extern "C"')[1]
    assert "mirage::gen::ColumnScore" in first and "mirage::gen::ColumnFactor<" in first
    loop = first.split("// ---- the for-loop")[1].split("// ---- after the for-loop")[0]
    assert "map_apply<" not in loop  # the squares are no step of their own
    sass = result.sass()
    assert "HMMA" in sass and "LDL" not in sass and "STL" not in sass


def test_folded_combine_meets_its_cluster_and_reads_through_l2(built):
    """The folded kernel: one function, a cluster barrier (release: MEMBAR before the arrive;
    acquire: L1 invalidated after the wait), the partials read back coherently, no spills."""
    program, result = built["gqa_folded"]
    (launch,) = program.kernels
    assert launch.consumer >= 0 and launch.cluster == (1, 16, 1)
    assert "__cluster_dims__(1, 16, 1)" in program.code
    sass = result.sass()
    arrive, wait = sass.index("UCGABAR_ARV"), sass.index("UCGABAR_WAIT")
    assert "MEMBAR" in sass[:arrive] and "CCTL.IVALL" in sass[wait:]
    loads = set(re.findall(r"LDG\.E[\w.]*", sass))
    assert loads and not any("CONSTANT" in load for load in loads)  # no non-coherent reads of the partials
    assert "LDL" not in sass and "STL" not in sass


def test_counter_fold_meets_at_an_atomic_counter(built):
    """The counter fold: no cluster, one atomic add per block on the group's counter between a fence
    and the spin that waits for the group, the partials read back coherently, no spills."""
    program, result = built["gqa_counter_folded"]
    (launch,) = program.kernels
    assert launch.counter and launch.cluster == (1, 1, 1) and "__cluster_dims__" not in program.code
    sass = result.sass()
    assert "UCGABAR" not in sass
    add = sass.index("ATOMG.E.ADD.64")
    assert "MEMBAR" in sass[:add] and "NANOSLEEP" in sass[add:]
    loads = set(re.findall(r"LDG\.E[\w.]*", sass))
    assert loads and not any("CONSTANT" in load for load in loads)
    assert "LDL" not in sass and "STL" not in sass


def test_multicast_input_is_bulk_copied_to_the_cluster(built):
    """rmsnorm's X, which every block reads whole, goes to clusters of two blocks by multicast bulk
    copies counted on transaction barriers; the weight keeps its cp.async copies; no spills."""
    program, result = built["rmsnorm_multicast"]
    (launch,) = program.kernels
    assert launch.cluster == (2, 1, 1) and "__cluster_dims__(2, 1, 1)" in program.code
    code = program.code
    protocol = ("in0.init();", "mirage::dev::cluster_sync();", "in0.wait(iteration);",
                "in0.release(iteration);", "in0.done();", "mirage::dev::cluster_wait();")
    steps = [code.index(s) for s in protocol]
    assert steps == sorted(steps)
    assert "MulticastIterator<__half" in code and code.count("MulticastIterator<") == 1  # X, not G or W
    sass = result.sass()
    assert "UBLKCP.S.G.MULTICAST" in sass and "SYNCS.ARRIVE.TRANS64" in sass and "LDGSTS" in sass
    assert "LDL" not in sass and "STL" not in sass


def test_key_norms_come_from_the_k_fragments(built):
    """With chain_key_norms the chain computes each key's sum of squares on the tensor cores from
    the K fragments it loads anyway: no reduction step in the loop, no spills."""
    program, result = built["qknorm_key_norms"]
    first = program.code.split('extern "C"')[1]
    assert "mirage::gen::KeyNorms<" in first
    loop = first.split("// ---- the for-loop")[1].split("// ---- after the for-loop")[0]
    assert "reduce_apply<" not in loop and "map_apply<" not in loop
    sass = result.sass()
    assert "HMMA" in sass and "LDL" not in sass and "STL" not in sass


def test_warpgroup_key_norms_are_traded_through_the_scratch(built):
    """A warpgroup chain computes the key norms itself: each warp sums a quarter of a sub-tile's keys
    by mma.sync (HMMA) on K's fragments while Q·K runs on HGMMA, the warpgroup trades the factors
    through the scratch past a barrier of its own (barrier 1, 128 threads); no step reduces K in the
    loop, no spills."""
    program, result = built["qknorm_warpgroup_key_norms"]
    first = program.code.split('extern "C"')[1]
    assert re.search(r"::step\(softmax\d+_state, t\d+, t\d+, t\d+, mirage::gen::KeyNorms<.*>"
                     r"\{mirage::dev::shared_at<float>\(shared, \d+\)\}\);", first)
    loop = first.split("// ---- the for-loop")[1].split("// ---- after the for-loop")[0]
    assert "reduce_apply<" not in loop and "map_apply<" not in loop
    functions = {f.split()[0]: f for f in result.sass().split("Function : ")[1:]}
    attention = functions[program.kernels[0].name]
    assert "HGMMA.64x64x16.F32" in attention and "HMMA.16816.F32" in attention
    assert re.search(r"BAR\.SYNC(\.DEFER_BLOCKING)? 0x1, 0x80", attention)
    assert "LDL" not in attention and "STL" not in attention


@pytest.mark.parametrize("name", ["gqa_warpgroup", "gqa_warpgroup_deferred"])
def test_warpgroup_chain_runs_wgmma_on_swizzled_tiles(built, name):
    """With warpgroup_softmax both products of the chain are warpgroup MMAs (HGMMA, B from shared
    memory through descriptors, transposed: K and V are contiguous along N) reading Q, K and V from
    swizzled tiles published with a proxy fence; no spills; Q·K's A operand from registers (Q's
    fragments by ldmatrix, ``q_fragments``), or from Q's tile without it. Deferred P·V: V's ring has
    a third slot."""
    program, result = built[name]
    first = program.code.split('extern "C"')[1]
    assert first.count("Swizzled128Layout<1, 1, 64, 64>") >= 4  # K and V: iterators and the chain
    assert "Swizzled128Layout<1, 1, 128, 64>" in first  # Q
    assert "Pipeline<2, true>::wait()" in first and "__align__(1024)" in first
    deferred = name.endswith("deferred")
    assert f"mirage::gen::NoTile, {str(deferred).lower()}, true>;" in first  # DeferValues, QFragments
    assert ("Swizzled128Layout<1, 1, 64, 64>, 3, kThreads> in2" in first) == deferred
    functions = {f.split()[0]: f for f in result.sass().split("Function : ")[1:]}
    attention = functions[program.kernels[0].name]
    assert re.search(r"HGMMA\.64x64x16\.F32 .*gdesc\[UR\d+\]\.tnspB", attention)
    assert "HMMA" not in attention and "FENCE.VIEW.ASYNC.S" in attention
    assert "LDSM" in attention and not re.search(r"HGMMA\.64x64x16\.F32 R\d+, gdesc", attention)
    assert "LDL" not in attention and "STL" not in attention


def _between_waits(sass: str) -> list[str]:
    """The attention kernel's SASS cut at its full warpgroup waits (``WARPGROUP.DEPBAR.LE gsb0, 0x0``)."""
    return re.split(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x0", sass)


@pytest.mark.parametrize("name, ahead", [("gqa_warpgroup_64_key_sub_tiles", True),
                                         ("gqa_warpgroup_sub_tiles_in_turn", False)])
def test_sub_tile_products_overlap_the_softmax_only_with_lookahead(built, name, ahead):
    """Where an iteration has two 64-key sub-tiles (gqa_b8 with 4 key splits, built with
    ``MIRAGE_WARPGROUP_SUB_KEYS`` 64 where the default takes one of 128 keys), the lookahead issues
    the second sub-tile's Q·K (a fresh accumulator: ``RZ, !UPT``) after the first one's wait and
    before its exponentials, so one stretch between full waits holds both; issued in turn
    (``MIRAGE_SOFTMAX_LOOKAHEAD`` 0), no stretch does. Both without spills."""
    program, result = built[name]
    functions = {f.split()[0]: f for f in result.sass().split("Function : ")[1:]}
    attention = functions[program.kernels[0].name]
    both = [part for part in _between_waits(attention)
            if re.search(r"HGMMA\.64x64x16\.F32 R\d+, R\d+, gdesc\[UR\d+\]\.tnspB, RZ, !UPT", part)
            and "MUFU.EX2" in part]
    assert bool(both) == ahead
    assert "LDL" not in attention and "STL" not in attention


def test_early_loads_in_the_attention_kernel_compile_without_spills(built):
    """The K-normalize member's attention kernel issues its first V copies before the dependency wait
    (mirage.codegen.early_loads), and the K-normalize kernel signals after its own wait."""
    program, result = built["qknorm_normalize_k_early_loads"]
    contexts = program.contexts
    assert any(c.early_loads for c in contexts) and contexts[0].signal_after_wait
    sass = result.sass()
    assert "LDL" not in sass and "STL" not in sass
