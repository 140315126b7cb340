"""Families of fused µGraphs per benchmark case: the grid, for-loop and block-size splits that
profile-guided selection chooses among (the axes the search enumerates: grid dims, forloop ranges,
block dims).

Each family is a table of :class:`Variant` rows (the builder's keyword arguments); rows whose µGraph
is not valid (a split that does not divide a dim, a tile over the shared-memory limit) are dropped.
The tables keep the members that came out on top of two wider explorations on the H100
(docs/performance.md; every member's time is in benchmarks/results/perf_explore_*.json):

* rmsnorm, gatedmlp: weight streaming (GEMV).  128 blocks (of 96–384 tried), K tiles of 256–512
  rows (one pipeline stage holds 24–48 KB), 3 stages (2 and 4 measured slower).
* ntrans: one block per row; only the block size varies (block-wide reductions use every warp).
* lora: the N split of the 4096 output columns, with and without ``concat_matmul``, K in one step
  or in a for-loop of 2–4 (``(X·LA)·LB`` summed step by step).
* gqa, qknorm: FlashDecoding-like splits with per-row partial sums (``row_sums``): query rows per
  block (``256 / q_splits``), key splits across blocks (``kv_splits``), keys per for-loop iteration
  (``4096 / (kv_splits · iters)``), 8 or 16 query rows per block of the combine; QKNorm divides each
  score by its key's rms in the attention kernel (``key_scales``), computed there from each key's sum
  of squares that a kernel of its own computes first (``key_sums``), or normalizes K in a kernel of
  its own first (``normalize_k``).  The splits are the fastest of explorations of
  the wider families (``WIDE_ROWS``, ``python -m benchmarks.explore --family wide``).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import mirage as mi
from benchmarks.mugraphs import CASES, attention, mlp, ntrans
from mirage.errors import GraphError
from mirage.mugraph.graph import KernelGraph

KEYS = 4096  # keys per head in the attention cases
QUERIES = 256  # query rows per head


@dataclass(frozen=True)
class Variant:
    """One member of a family: the builder's keyword arguments (besides the case size)."""

    arguments: tuple[tuple[str, int | bool], ...]
    stages: tuple[int, ...] = field(default=(2, 3, 4), compare=False)  # pipeline depths worth timing

    @property
    def label(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.arguments)

    def kwargs(self) -> dict[str, int | bool]:
        return dict(self.arguments)


def _rows(stages: tuple[int, ...], **axes) -> list[Variant]:
    names = list(axes)
    return [
        Variant(tuple(zip(names, values, strict=True)), stages)
        for values in itertools.product(*axes.values())
    ]


# How QKNorm treats its keys: normalized once, in a kernel of 64 blocks per head, before the attention
# kernel, or divided out of each score by its key's rms, computed in the attention kernel (the chain
# multiplies each product by a per-key factor)
NORMALIZE_K = (("normalize_k", True), ("norm_blocks", 64))
# ...in fewer blocks, or in blocks of fewer threads: with the 32-row combines, 32 blocks of 128 threads
# and 64 of 64 threads came out fastest of 16 shapes at b = 8 on an H200 (19.79-19.92 against 20.19 µs;
# explore_h200_2026-11-29_norm.json)
NORMALIZE_K_32 = (("normalize_k", True), ("norm_blocks", 32))
NORMALIZE_K_64_64 = (("normalize_k", True), ("norm_blocks", 64), ("norm_threads", 64))
KEY_SCALES = (("key_scales", True),)
# ...or divided out of each score by its key's rms, computed in the attention kernel from each key's sum
# of squares, which a kernel of 64 blocks per head computes first (the chain reads the sums as they land)
KEY_SUMS = (("key_sums", True), ("norm_blocks", 64))

# (kv_splits, q_splits, iters, threads, combine_rows[, combine_threads]) and the program's extra
# arguments: the fastest splits of the explorations with the register-resident softmax chain and the
# direct-read combine (benchmarks/results/explore_h100_2026-11-22_wide_direct.json; the two 128-thread
# GQA members of 8 key splits and 2 query splits, whose warps take two row tiles each, from
# …_paired_tiles.json; QKNorm's
# key_scales members from …_key_scales.json, b = 1 first, and the 256-thread one of the warpgroup
# chain's own key norms from explore_h100_2026-11-26_key_norms.json), per program. The combines of 4
# rows and 128 threads (the b = 1 splits) and of 32 rows and 256 or 512 threads (the b = 8 splits)
# came out fastest of 21 shapes on an H200 (explore_h200_2026-11-29_combine.json: gqa_b1 6.29 against
# 6.62 µs for 8 rows, gqa_b8 15.53-15.59 against 16.11, qknorm_b1 7.13 against 7.39)
ATTENTION_SPLITS: dict[str, list[tuple[tuple[int, ...], tuple[tuple[str, int | bool], ...]]]] = {
    "gqa": [(splits, ()) for splits in (
        (8, 2, 8, 128, 8), (8, 2, 8, 128, 16), (16, 2, 2, 256, 8), (16, 4, 2, 128, 8), (16, 4, 2, 128, 16),
        (16, 4, 2, 128, 4, 128), (8, 4, 4, 128, 16), (4, 2, 8, 256, 8), (4, 2, 8, 256, 32, 256),
        (4, 2, 8, 256, 32, 512), (8, 2, 8, 256, 8), (4, 4, 8, 128, 8),
    )],
    "qknorm": [(splits, NORMALIZE_K) for splits in (
        (16, 4, 4, 128, 8), (16, 4, 2, 128, 8), (4, 4, 8, 128, 8), (4, 4, 8, 128, 32, 256),
        (4, 4, 8, 128, 32, 512),
    )]
    + [((4, 4, 8, 128, 32, 256), NORMALIZE_K_32), ((4, 4, 8, 128, 32, 512), NORMALIZE_K_32),
       ((4, 4, 8, 128, 32, 512), NORMALIZE_K_64_64)]
    + [(splits, KEY_SCALES) for splits in (
        (16, 4, 2, 128, 8), (16, 4, 2, 128, 4, 128), (16, 2, 2, 256, 8), (32, 2, 2, 256, 16),
        (8, 2, 8, 128, 8), (8, 2, 8, 128, 16), (8, 2, 4, 128, 8), (8, 2, 8, 256, 8),
    )]
    + [(splits, KEY_SUMS) for splits in ((8, 2, 8, 256, 8),)],  # of four: the fastest at b = 8 and b = 1
}


def _split(kv_splits: int, q_splits: int, iters: int, threads: int) -> tuple[tuple[str, int | bool], ...]:
    """The arguments of a row-sum attention split (before its combine's and the program's own)."""
    return (("kv_splits", kv_splits), ("q_splits", q_splits), ("iters", iters), ("threads", threads),
            ("row_sums", True))


def _attention_rows(program: str, twins: bool = False) -> list[Variant]:
    """Row-sum µGraphs (Mirage's element-wise sums measured slower on every split, see
    docs/performance.md), and with ``twins``, beside each split that a cluster can hold, its twin
    for a cluster fold: a combine of the first kernel's threads whose blocks take
    ``rows / kv_splits`` query rows each, so that each block of a cluster runs one combine block."""
    from mirage.optimizer.cluster_fold import MAX_CLUSTER

    rows = []
    for shape, extra in ATTENTION_SPLITS[program]:
        kv_splits, q_splits, iters, threads, combine_rows, *combine_threads = shape
        splits = _split(kv_splits, q_splits, iters, threads)
        combine = (("combine_rows", combine_rows), *(("combine_threads", t) for t in combine_threads))
        rows.append(Variant((*splits, *combine, *extra), (2, 3)))
        fold_rows = QUERIES // q_splits // kv_splits
        if twins and kv_splits <= MAX_CLUSTER and fold_rows >= 2:
            twin = (*splits, ("combine_rows", fold_rows), ("combine_threads", threads), *extra)
            rows.append(Variant(twin, (2, 3)))
    return list(dict.fromkeys(rows))  # two splits that differ only in the combine have one twin


def _wide_attention_rows(extra: tuple[tuple[str, int | bool], ...] = (),
                         kv_splits: tuple[int, ...] = (4, 8, 16, 32),
                         q_splits: tuple[int, ...] = (1, 2, 4, 8, 16)) -> list[Variant]:
    """Every split of the register-resident attention kernel worth timing: key splits across blocks,
    query rows per block (``256 / q_splits``), keys per iteration (64, 128 or 256), 4, 8 or 16 warps, and 8
    or 16 query rows per block of the combine; rows
    whose warps do not split the tile (``softmax_chain.warp_split``) are dropped."""
    from mirage.optimizer.softmax_chain import warp_split

    rows = []
    axes = (kv_splits, q_splits, (64, 128, 256), (128, 256, 512), (8, 16))
    for kv, qs, keys, threads, combine in itertools.product(*axes):
        iters = KEYS // (kv * keys)
        if iters < 1 or warp_split(QUERIES // qs, keys, threads) is None:
            continue
        arguments = (*_split(kv, qs, iters, threads), ("combine_rows", combine), *extra)
        rows.append(Variant(arguments, (2,)))
    return rows


def _wide_qknorm_rows() -> list[Variant]:
    """QKNorm: K normalized in a kernel of its own (tiles of 128 or 64 keys), its rms dividing the
    scores in the attention kernel (``key_scales``, or ``key_sums`` from a kernel of per-key sums), or
    K normalized in the attention kernel when each key is read by one or two blocks only (``q_splits``
    1 or 2)."""
    rows = []
    # 32 blocks a head: slower on every split on the H100 (explore_h100_2026-11-22_run7.json), 0.07-0.16 µs
    # faster on the H200 (explore_h200_2026-11-28_wide_qknorm_b8.json); both are explored
    for norm_blocks in (32, 64):
        rows += _wide_attention_rows((("normalize_k", True), ("norm_blocks", norm_blocks)),
                                     kv_splits=(4, 8, 16, 32), q_splits=(2, 4, 8))
    rows += _wide_attention_rows(KEY_SCALES, kv_splits=(8, 16, 32), q_splits=(2, 4, 8))
    # ...or each key's sum of squares from a kernel of its own, K' never written (``key_sums``)
    rows += _wide_attention_rows(KEY_SUMS, kv_splits=(4, 8), q_splits=(2, 4))
    return rows + _wide_attention_rows(q_splits=(1, 2))


def attention_fused(
    b: int, qknorm: bool, row_sums: bool = False, combine_rows: int | None = None, normalize_k: bool = False,
    norm_blocks: int = 32, key_scales: bool = False, key_sums: bool = False, combine_threads: int = 128,
    norm_threads: int = 128, **splits,
) -> KernelGraph:
    """Mirage's attention µGraph (``attention.fused``), or with ``row_sums`` its variant that sums
    ``exp(S)`` over the keys inside the first kernel (``forloop_accum(..., acc="sum")``): the partial
    sums are then one value per query row and key split instead of one per key, which the first
    kernel writes and the combine reads (a µGraph of the same search space).  ``combine_rows``:
    query rows per block of the combine kernel (default: those of the first kernel), and
    ``combine_threads`` its threads (a cluster fold runs the combine in the first kernel's blocks, so
    it needs as many as those have).

    QKNorm's keys: normalized in a kernel of their own (``normalize_k``), tile by tile in the first
    kernel (the default), or, with ``key_scales``, not at all: ``(q · k) / rms(k)`` divides each
    score by its key's rms, computed from the K tile in the first kernel (the softmax chain then
    multiplies each product by a per-key factor, gen/softmax.cuh).  ``key_sums``: as ``key_scales``,
    but each key's sum of squares comes from a kernel of its own (``norm_blocks`` blocks per head), so
    that the attention kernel reads one value per key beside K (which that kernel leaves in L2) instead
    of reducing every K tile over its 64 rows.  ``norm_threads``: the threads of either kernel's blocks."""
    if not row_sums:
        return attention.fused(b, qknorm, **splits)
    kv_splits, q_splits, iters = splits["kv_splits"], splits["q_splits"], splits["iters"]
    combine_splits = QUERIES // (combine_rows or QUERIES // q_splits)
    heads = 2 * b
    g = mi.new_kernel_graph("qknorm" if qknorm else "gqa")
    q, k, v = (
        g.new_input(dims=s, dtype=mi.float16, name=n) for s, n in zip(attention.shapes(b), "QKV", strict=True)
    )
    tb = mi.new_threadblock_graph(
        grid_dim=(heads, kv_splits, q_splits),
        block_dim=(splits["threads"], 1, 1),
        forloop_range=iters,
        reduction_dimx=64,
    )
    if qknorm and normalize_k:
        k = _normalized_keys(g, k, heads, norm_blocks, norm_threads)
    squares = _key_sums(g, k, heads, norm_blocks, norm_threads) if qknorm and key_sums else None
    rows_axis = 1 if q_splits > 1 else -1  # grid z splits the query rows (a grid of 1 maps nothing)
    bq = tb.new_input(q, input_map=(0, -1, rows_axis), forloop_dim=-1)  # [1, 256 / q_splits, 64]
    bk = tb.new_input(k, input_map=(0, 2, -1), forloop_dim=2)  # [1, 64, keys]
    bv = tb.new_input(v, input_map=(0, 1, -1), forloop_dim=1)  # [1, keys, 64]
    scores = None
    if qknorm:
        bq = tb.rms_norm(bq, eps=attention.EPS)
        if squares is not None:
            bs = tb.new_input(squares, input_map=(0, 2, -1), forloop_dim=2)  # [1, 1, keys]: Σ_d k²
            rms = tb.sqrt(tb.add_scalar(tb.mul_scalar(bs, 1.0 / bk.dims[1]), attention.EPS))
            scores = tb.div(tb.matmul(bq, bk), rms)
        elif key_scales:
            scores = tb.div(tb.matmul(bq, bk), attention.key_rms(tb, bk))
        elif not normalize_k:
            bk = attention._rms_k(tb, bk)
    e = tb.exp(tb.mul_scalar(tb.matmul(bq, bk) if scores is None else scores, attention.SCALE))
    sums = tb.forloop_accum(e, acc="sum")  # [1, rows, 1]
    numerators = tb.forloop_accum(tb.matmul(e, bv))  # [1, rows, 64]
    tb.new_output(sums, output_map=(0, 2, rows_axis))  # [2b, 256, kv_splits]
    tb.new_output(numerators, output_map=(0, 2, rows_axis))  # [2b, 256, 64 kv_splits]
    operands = [q, k, v] + ([squares] if squares is not None else [])
    g.mark_output(attention.combine(g, g.customized(operands, tb), heads, combine_splits,
                                    threads=combine_threads))
    return g.freeze()


def _normalized_keys(g, k, heads: int, key_blocks: int = 32, threads: int = 128):
    """K / rms(K) over dim 1, as one graph-defined kernel of ``heads × key_blocks`` blocks."""
    tb = mi.new_threadblock_graph(grid_dim=(heads, key_blocks, 1), block_dim=(threads, 1, 1), forloop_range=1)
    bk = tb.new_input(k, input_map=(0, 2, -1), forloop_dim=-1)  # [1, 64, keys / key_blocks]
    tb.new_output(tb.forloop_accum(attention._rms_k(tb, bk)), output_map=(0, 2, -1))
    (normalized,) = g.customized([k], tb)
    return normalized


def _key_sums(g, k, heads: int, key_blocks: int, threads: int = 128):
    """Σ_d K[d, n]² of every key n (2b, 1, keys), as one graph-defined kernel of ``heads × key_blocks``
    blocks."""
    tb = mi.new_threadblock_graph(grid_dim=(heads, key_blocks, 1), block_dim=(threads, 1, 1), forloop_range=1)
    bk = tb.new_input(k, input_map=(0, 2, -1), forloop_dim=-1)  # [1, 64, keys / key_blocks]
    tb.new_output(tb.forloop_accum(tb.reduction(tb.square(bk), 1)), output_map=(0, 2, -1))
    (sums,) = g.customized([k], tb)
    return sums


def rmsnorm_variant(b: int, two_kernels: bool = False, **splits) -> KernelGraph:
    """rmsnorm's fused µGraph (``mlp.rmsnorm_fused``), or with ``two_kernels`` the normalization in a
    kernel of its own before the weight streaming (``mlp.rmsnorm_two_kernels``)."""
    return (mlp.rmsnorm_two_kernels if two_kernels else mlp.rmsnorm_fused)(b, **splits)


def gatedmlp_variant(m: int, library_product: bool = False, **splits) -> KernelGraph:
    """GatedMLP's fused µGraph (``mlp.gatedmlp_fused``), or with ``library_product`` both products by
    the library and the gate in a kernel of its own (``mlp.gatedmlp_library``)."""
    return (mlp.gatedmlp_library if library_product else mlp.gatedmlp_fused)(m, **splits)


# program → (family rows, builder(size, **arguments))
FAMILIES: dict[str, tuple[list[Variant], Callable[..., KernelGraph]]] = {
    # RMSNorm: 128 blocks; or the normalization in a kernel of its own, which leaves the GEMV room for a
    # third stage of 512-row K tiles at b = 8 (the fused kernel's norm tiles do not fit beside them)
    "rmsnorm": (_rows((3,), grid=(128,), iters=(8, 16), threads=(256, 512))
                + _rows((3,), two_kernels=(True,), grid=(128,), iters=(8,), threads=(256,))
                # ...or that kernel and then the kernel graph's pre-defined matmul (the library's GEMM):
                # on an H200 cuBLAS streams W in 13.2-14.7 µs, our GEMV in 15.3-17.2
                # (stream_floor_h200_2026-11-28.json); its normalization's threads (128-1024 a row) do
                # not matter (suite_h200_2026-11-29_gemv.json: 15.78-15.82 µs at b = 1, 15.68-15.73 at b = 8)
                + _rows((2,), two_kernels=(True,), library_product=(True,)), rmsnorm_variant),
    # GatedMLP: 128 blocks, K tiles of 256 or 128 rows; or 64 wider blocks with a deeper ring (the fastest
    # at m = 1 of the wide family at depths 3–5: explore_h100_2026-11-26_gatedmlp_depths.json)
    "gatedmlp": (_rows((3, 4), grid=(128,), iters=(16, 32), threads=(128, 256))
                 + _rows((4,), grid=(64,), iters=(32,), threads=(256,)), gatedmlp_variant),
    # LoRA: the whole of K in one step, or a K loop of 2–4 steps over more, narrower blocks
    "lora": (_rows((2,), grid=(32, 64), concat=(False, True), threads=(128, 256))
             + _rows((2, 3), grid=(64, 128), concat=(False, True), threads=(128,), iters=(2, 4)),
             mlp.lora_fused),
    "ntrans": (_rows((2,), threads=(256, 512, 1024)), ntrans.fused),
    "gqa": (_attention_rows("gqa"), lambda b, **kw: attention_fused(b, False, **kw)),
    "qknorm": (_attention_rows("qknorm"), lambda b, **kw: attention_fused(b, True, **kw)),
}


# wider families for explorations (``python -m benchmarks.explore --family wide``)
WIDE_ROWS: dict[str, Callable[[], list[Variant]]] = {
    "gqa": _wide_attention_rows,
    "qknorm": _wide_qknorm_rows,
    # GEMV: K tiles of 64–256 rows with 2–4 stages (smaller tiles, deeper pipelines), fewer, wider
    # blocks (each reads all of X: fewer blocks, less X traffic), and more, narrower ones
    "rmsnorm": lambda: (_rows((2, 3, 4), grid=(128,), iters=(16, 32, 64), threads=(256, 512))
                        + _rows((3, 4), two_kernels=(True,), grid=(128,), iters=(16, 32),
                                threads=(128, 256))
                        + _rows((2, 3), two_kernels=(True,), grid=(128,), iters=(8,), threads=(256, 512))
                        # K split in two as well: 256 blocks, two a column strip, partial sums added
                        # after (two blocks an SM stream more of W at once: stream_floor, boxes);
                        # measured slower on the H200, best 17.33 µs at b = 1 against 16.54, 19.81 at
                        # b = 8 against 18.56 (explore_h200_2026-11-28_rmsnorm_split_k.json)
                        + _rows((2, 3, 4), two_kernels=(True,), grid=(128,), k_splits=(2,), iters=(4, 8),
                                threads=(256, 512))
                        + _rows((2,), grid=(64, 96, 128), iters=(8, 16), threads=(256, 512))
                        # more, narrower blocks: two blocks on some SMs, more weight streams
                        + _rows((2, 3), grid=(192, 256), iters=(8, 16), threads=(128, 256))
                        # fewer, wider blocks with deeper rings of shorter K tiles (torch.compile's
                        # Triton template at b = 8: 48 blocks of 128 columns, K tiles of 128, 4 stages):
                        # measured slower, best 24.9 µs at b = 8 with 96 blocks, 36.4 with 48
                        # (explore_h100_2026-11-23_wide_gemv_blocks.json)
                        + _rows((3, 4, 5), grid=(48, 64, 96), iters=(32, 64), threads=(256, 512))
                        # the library's product after a normalization of 128-1024 threads a row
                        + _rows((2,), two_kernels=(True,), library_product=(True,),
                                norm_threads=(128, 256, 512, 1024))),
    # LoRA: one kernel of 32–256 blocks (128–16 of the 4096 output columns each), K in 1, 2 or 4 steps,
    # pipelines of 2–4 stages
    "lora": lambda: _rows((2, 3, 4), grid=(32, 64, 128, 256), concat=(True,), threads=(128, 256),
                          iters=(1, 2, 4)),
    "gatedmlp": lambda: (_rows((2, 3, 4), grid=(128,), iters=(16, 32, 64), threads=(128, 256))
                         + _rows((3, 4), grid=(64,), iters=(32, 64), threads=(256, 512))
                         # the library's two products, then the gate in 8-32 blocks: slower, 27.9 µs at
                         # m = 1, 29.3 at m = 8 (cuBLAS splits K, 10.8 µs a product and 1.6 a reduction;
                         # explore_h200_2026-11-29_gatedmlp_library.json)
                         + _rows((2,), library_product=(True,), grid=(8, 16, 32), threads=(128, 256))),
}


# the tuned attention families and the twins of their members for a cluster fold (measured slower:
# docs/performance.md; ``python -m benchmarks.explore --family fold --also cluster_folds=true``)
FOLD_ROWS: dict[str, Callable[[], list[Variant]]] = {
    program: functools.partial(_attention_rows, program, twins=True) for program in ("gqa", "qknorm")
}


def _combine_rows(program: str) -> list[Variant]:
    """Each tuned attention split with every shape of its combine kernel: 2 to 64 query rows a block,
    64 to 512 threads (less the shapes whose threads outnumber the block's elements)."""
    rows = []
    for (kv_splits, q_splits, iters, threads, *_), extra in ATTENTION_SPLITS[program]:
        splits = _split(kv_splits, q_splits, iters, threads)
        for combine_rows, combine_threads in itertools.product((2, 4, 8, 16, 32, 64), (64, 128, 256, 512)):
            if combine_rows * 64 >= combine_threads:
                arguments = (*splits, ("combine_rows", combine_rows), ("combine_threads", combine_threads))
                rows.append(Variant((*arguments, *extra), (2,)))
    return list(dict.fromkeys(rows))  # splits that differ only in their combine: one set of shapes


COMBINE_ROWS: dict[str, Callable[[], list[Variant]]] = {
    program: functools.partial(_combine_rows, program) for program in ("gqa", "qknorm")
}


def _norm_rows() -> list[Variant]:
    """QKNorm's tuned splits whose keys pass through a kernel of their own (K normalized, or each key's
    sum of squares) with every shape of that kernel: 16 to 128 blocks a head, 64 to 512 threads."""
    rows = []
    for shape, extra in ATTENTION_SPLITS["qknorm"]:
        if "norm_blocks" not in dict(extra):
            continue
        kv_splits, q_splits, iters, threads, combine_rows, *combine_threads = shape
        combine = (("combine_rows", combine_rows), *(("combine_threads", t) for t in combine_threads))
        own = tuple(item for item in extra if item[0] not in ("norm_blocks", "norm_threads"))
        for blocks, norm_threads in itertools.product((16, 32, 64, 128), (64, 128, 256, 512)):
            arguments = (*_split(kv_splits, q_splits, iters, threads), *combine, *own,
                         ("norm_blocks", blocks), ("norm_threads", norm_threads))
            rows.append(Variant(arguments, (2,)))
    return list(dict.fromkeys(rows))  # splits listed with several key-kernel shapes: one set of shapes


def family(case_name: str, wide: bool = False, fold: bool = False, combine: bool = False,
           norm: bool = False) -> list[tuple[Variant, KernelGraph]]:
    """The valid members of ``case_name``'s family with their µGraphs (``wide``: the exploration's
    wider family, ``fold``: with cluster-fold twins, where the program has one, ``combine``: each
    attention split with every shape of its combine kernel, ``norm``: QKNorm's splits with every
    shape of their key kernel)."""
    case = CASES[case_name]
    rows, build = FAMILIES[case.program]
    if wide and case.program in WIDE_ROWS:
        rows = WIDE_ROWS[case.program]()
    elif fold and case.program in FOLD_ROWS:
        rows = FOLD_ROWS[case.program]()
    elif combine and case.program in COMBINE_ROWS:
        rows = COMBINE_ROWS[case.program]()
    elif norm and case.program == "qknorm":
        rows = _norm_rows()
    out = []
    for row in rows:
        try:
            out.append((row, build(case.size, **row.kwargs())))
        except GraphError:
            continue
    return out


def variants(case_name: str) -> list[KernelGraph]:
    """The µGraphs of ``case_name``'s family (what ``benchmarks.run --ours select`` times)."""
    return [graph for _, graph in family(case_name)]


def interpreted_error(case_name: str, graph: KernelGraph, seed: int = 5) -> float:
    """How far ``graph`` (a member of ``case_name``'s family) is from the case's reference: the largest
    difference of their outputs, both interpreted in float64 on the same random fp16 inputs, relative
    to the reference's largest output (0 up to rounding for a member that computes the function)."""
    import numpy as np

    from mirage.mugraph.interpret import interpret

    reference = CASES[case_name].reference()
    rng = np.random.default_rng(seed)
    inputs = [rng.standard_normal(t.shape).astype(np.float16) for t in reference.input_types]
    expected = np.asarray(interpret(reference, inputs, dtype=np.float64)[0])
    got = np.asarray(interpret(graph, inputs, dtype=np.float64)[0])
    return float(np.abs(got - expected).max() / np.abs(expected).max())
