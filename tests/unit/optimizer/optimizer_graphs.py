"""Small hand-made µGraphs and checks shared by the optimizer tests."""

from __future__ import annotations

import functools

import numpy as np

import mirage as mi
from mirage.mugraph.algebra import FloatAlgebra
from mirage.mugraph.interpret import Interpreter
from mirage.mugraph.ops import Op, reduce_to_dimx

SHAPES_QKV = [(2, 16, 32), (2, 32, 64), (2, 64, 16)]


@functools.lru_cache(maxsize=32)
def _random(shapes: tuple[tuple[int, ...], ...], seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    arrays = tuple(rng.standard_normal(s, dtype=np.float32).astype(np.float64) for s in shapes)
    for a in arrays:
        a.flags.writeable = False
    return arrays


def inputs_for(graph, seed: int = 0, scale: dict[int, float] | None = None) -> list[np.ndarray]:
    """Standard normal inputs (cached, read-only); ``scale`` multiplies input k by a factor."""
    xs = list(_random(tuple(t.shape for t in mi.as_graph(graph).input_types), seed))
    for k, factor in (scale or {}).items():
        xs[k] = xs[k] * factor
    return xs


class _Interpreter(Interpreter):
    """The reference interpreter plus block-level reduction_to_dimx, which has no registry formula yet."""

    def apply(self, node, in_types, args):
        if node.op is Op.REDUCTION_TO_DIMX:
            dim = node.attrs.dim
            return reduce_to_dimx(self.algebra, args[0], dim - in_types[0].rank, node.outputs[0].shape[dim])
        return super().apply(node, in_types, args)


def interpret(graph, xs, algebra=None) -> list[np.ndarray]:
    algebra = algebra or FloatAlgebra(np.float64)
    arrays = [np.asarray(x, algebra.dtype) for x in xs]
    return [np.asarray(o) for o in _Interpreter(algebra).run(mi.as_graph(graph), arrays)]


def assert_same_function(before, after, seed: int = 0, rtol: float = 1e-10) -> None:
    """``after`` computes what ``before`` computes (float64 interpreter, random inputs)."""
    xs = inputs_for(before, seed)
    expected = interpret(before, xs)
    got = interpret(after, xs)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=rtol, atol=rtol * max(1.0, float(np.abs(e).max())))


class Float16RangeAlgebra(FloatAlgebra):
    """float32 arithmetic in which any result beyond fp16's largest value (65504) becomes ±inf."""

    LIMIT = 65504.0

    def __init__(self) -> None:
        super().__init__(np.float32)

    def _clip(self, x):
        x = np.asarray(x, np.float32)
        return np.where(np.abs(x) > self.LIMIT, np.sign(x) * np.float32(np.inf), x)

    def add(self, x, y):
        return self._clip(super().add(x, y))

    def mul(self, x, y):
        return self._clip(super().mul(x, y))

    def div(self, x, y):
        return self._clip(super().div(x, y))

    def exp(self, x):
        return self._clip(super().exp(x))

    def matmul(self, x, y):
        return self._clip(super().matmul(x, y))

    def sum(self, x, axis, keepdims=True):
        return self._clip(super().sum(x, axis, keepdims))


def run_fp16_range(graph, xs) -> list[np.ndarray]:
    return interpret(graph, xs, Float16RangeAlgebra())


def attention_one_kernel(denominator: str = "sum", forloop_range: int = 4) -> mi.KernelGraph:
    """softmax(Q K / 5) V in one kernel: the LAX form with a plain exp, as the search finds it."""
    g = mi.new_kernel_graph("attention")
    q, k, v = (g.new_input(dims=s, dtype=mi.float16) for s in SHAPES_QKV)
    tb = mi.new_threadblock_graph(grid_dim=(2, 1, 1), forloop_range=forloop_range, reduction_dimx=4)
    bq = tb.new_input(q, input_map=(0, -1, -1))
    bk = tb.new_input(k, input_map=(0, -1, -1), forloop_dim=2)
    bv = tb.new_input(v, input_map=(0, -1, -1), forloop_dim=1)
    e = tb.exp(tb.mul_scalar(tb.matmul(bq, bk), 0.2))
    numerator = tb.forloop_accum(tb.matmul(e, bv))
    width = 64 // forloop_range
    if denominator == "sum":
        out = tb.div(numerator, tb.forloop_accum(e, acc="sum"))
    elif denominator == "mean":
        out = tb.div(tb.mul_scalar(numerator, 1.0 / (forloop_range * width)), tb.forloop_accum(e, acc="mean"))
    elif denominator == "sum_todimx":
        out = tb.div(numerator, tb.reduction(tb.forloop_accum(e, acc="sum_todimx"), 2))
    elif denominator == "elementwise":
        out = tb.div(numerator, tb.reduction(tb.forloop_accum(e), 2))
    else:
        raise ValueError(denominator)
    tb.new_output(out, output_map=(0, -1, -1))
    (o,) = g.customized([q, k, v], tb)
    g.mark_output(o)
    return g.freeze()


def softmax_after_loop() -> mi.KernelGraph:
    """softmax(Q K) with the scores accumulated over the loop and the exp after it."""
    g = mi.new_kernel_graph("softmax_after_loop")
    q = g.new_input(dims=(2, 16, 32), dtype=mi.float16)
    k = g.new_input(dims=(2, 32, 64), dtype=mi.float16)
    tb = mi.new_threadblock_graph(grid_dim=(2, 1, 1), forloop_range=4)
    bq = tb.new_input(q, input_map=(0, -1, -1), forloop_dim=2)
    bk = tb.new_input(k, input_map=(0, -1, -1), forloop_dim=1)
    e = tb.exp(tb.forloop_accum(tb.matmul(bq, bk)))
    tb.new_output(tb.div(e, tb.reduction(e, 2)), output_map=(0, -1, -1))
    (o,) = g.customized([q, k], tb)
    g.mark_output(o)
    return g.freeze()


def split_kv(combine: str = "sum", combine_range: int = 1, save_partial: bool = False) -> mi.KernelGraph:
    """Split-KV attention: kernel 1 saves per-block partials, kernel 2 sums them and divides."""
    g = mi.new_kernel_graph("split_kv")
    q, k, v = (g.new_input(dims=s, dtype=mi.float16) for s in [(2, 16, 32), (2, 32, 256), (2, 256, 16)])
    tb = mi.new_threadblock_graph(grid_dim=(2, 4, 1), forloop_range=2, reduction_dimx=16)
    bq = tb.new_input(q, input_map=(0, -1, -1))
    bk = tb.new_input(k, input_map=(0, 2, -1), forloop_dim=2)  # [1, 32, 32]
    bv = tb.new_input(v, input_map=(0, 1, -1), forloop_dim=1)  # [1, 32, 16]
    e = tb.exp(tb.mul_scalar(tb.matmul(bq, bk), 0.25))
    tb.new_output(tb.forloop_accum(e), output_map=(0, 2, -1))  # [2, 16, 256]
    tb.new_output(tb.forloop_accum(tb.matmul(e, bv)), output_map=(0, 2, -1))  # [2, 16, 64]
    sums, numerators = g.customized([q, k, v], tb)
    if save_partial:
        g.mark_output(sums)
    tb2 = mi.new_threadblock_graph(grid_dim=(2, 1, 1), forloop_range=combine_range, reduction_dimx=16)
    fmap = -1 if combine_range == 1 else 2
    ps = tb2.new_input(sums, input_map=(0, -1, -1), forloop_dim=fmap)
    pn = tb2.new_input(numerators, input_map=(0, -1, -1), forloop_dim=fmap)
    n = tb2.forloop_accum(pn, acc="sum_todimx")  # [1, 16, 16]
    if combine == "sum":
        out = tb2.div(n, tb2.forloop_accum(ps, acc="sum"))
    elif combine == "mean":
        out = tb2.div(tb2.mul_scalar(n, 1.0 / 256), tb2.forloop_accum(ps, acc="mean"))
    elif combine == "product":  # not a ratio: keeps the factor exp(G)
        out = tb2.mul(n, tb2.forloop_accum(ps, acc="sum"))
    else:
        raise ValueError(combine)
    tb2.new_output(out, output_map=(0, -1, -1))
    (o,) = g.customized([sums, numerators], tb2)
    g.mark_output(o)
    return g.freeze()


def exp_into(kind: str) -> mi.KernelGraph:
    """An exp whose uses cannot absorb a per-row factor (the rewrite must leave it alone)."""
    g = mi.new_kernel_graph(kind)
    x = g.new_input(dims=(8, 64), dtype=mi.float16)
    tb = mi.new_threadblock_graph(grid_dim=(1, 1, 1), forloop_range=4)
    bx = tb.new_input(x, forloop_dim=1)
    e = tb.exp(bx)
    if kind == "silu":
        out = tb.forloop_accum(tb.silu(e), acc="sum")
    elif kind == "rms":
        out = tb.forloop_accum(e, acc="rms")
    elif kind == "affine":
        out = tb.forloop_accum(tb.add(e, bx), acc="sum")
    else:
        raise ValueError(kind)
    tb.new_output(out)
    (o,) = g.customized([x], tb)
    g.mark_output(o)
    return g.freeze()


def elementwise_tree() -> mi.KernelGraph:
    """Element-wise chains that fuse into trees, one shared intermediate, broadcasting operands."""
    g = mi.new_kernel_graph("tree")
    x = g.new_input(dims=(16, 32), dtype=mi.float32)
    y = g.new_input(dims=(16, 32), dtype=mi.float32)
    s = g.new_input(dims=(16, 1), dtype=mi.float32)
    tb = mi.new_threadblock_graph(grid_dim=(2, 1, 1), forloop_range=2)
    bx = tb.new_input(x, input_map=(0, -1, -1), forloop_dim=1)
    by = tb.new_input(y, input_map=(0, -1, -1), forloop_dim=1)
    bs = tb.new_input(s, input_map=(0, -1, -1))
    shared = tb.exp(tb.mul_scalar(bx, 0.5))  # read twice: stays a tensor
    left = tb.add(tb.sqrt(tb.square(shared)), tb.mul(by, bs))  # a tree with a broadcast operand
    right = tb.sigmoid(shared)
    a = tb.forloop_accum(tb.sub(left, right))
    b = tb.forloop_accum(shared, acc="sum")
    tb.new_output(tb.div(tb.clamp(a, -3.0, 3.0), b), output_map=(0, -1, -1))
    (o,) = g.customized([x, y, s], tb)
    g.mark_output(o)
    return g.freeze()


def matmul_chain(m: int = 16, n: int = 32, k: int = 64, forloop_range: int = 4) -> mi.KernelGraph:
    """X @ W accumulated over the loop, then an element-wise epilogue: the GEMM shape."""
    g = mi.new_kernel_graph("gemm")
    x = g.new_input(dims=(m, k), dtype=mi.float16)
    w = g.new_input(dims=(k, n), dtype=mi.float16)
    tb = mi.new_threadblock_graph(grid_dim=(2, 1, 1), forloop_range=forloop_range)
    bx = tb.new_input(x, forloop_dim=1)
    bw = tb.new_input(w, input_map=(1, -1, -1), forloop_dim=0)
    acc = tb.forloop_accum(tb.mul_scalar(tb.matmul(bx, bw), 0.5))
    tb.new_output(tb.silu(acc), output_map=(1, -1, -1))
    (o,) = g.customized([x, w], tb)
    g.mark_output(o)
    return g.freeze()


def split_k_gemm(m: int = 16, k: int = 4096, n: int = 1024, n_blocks: int = 8, k_splits: int = 8,
                 iters: int = 4) -> mi.KernelGraph:
    """X @ W with K split across blocks: kernel 1 writes one partial product per split, kernel 2
    sums them (a for-loop over the splits)."""
    g = mi.new_kernel_graph("split_k")
    x = g.new_input(dims=(1, m, k), dtype=mi.float16)
    w = g.new_input(dims=(1, k, n), dtype=mi.float16)
    tb = mi.new_threadblock_graph(grid_dim=(n_blocks, k_splits, 1), block_dim=(128, 1, 1),
                                  forloop_range=iters)
    bx = tb.new_input(x, input_map=(-1, 2, -1), forloop_dim=2)
    bw = tb.new_input(w, input_map=(2, 1, -1), forloop_dim=1)
    tb.new_output(tb.forloop_accum(tb.matmul(bx, bw)), output_map=(2, 0, -1))  # (k_splits, m, n)
    (partials,) = g.customized([x, w], tb)
    tb2 = mi.new_threadblock_graph(grid_dim=(n_blocks, 1, 1), block_dim=(128, 1, 1), forloop_range=k_splits)
    bp = tb2.new_input(partials, input_map=(2, -1, -1), forloop_dim=0)
    tb2.new_output(tb2.forloop_accum(bp, acc="sum"), output_map=(2, -1, -1))
    (out,) = g.customized([partials], tb2)
    g.mark_output(out)
    return g.freeze()


def _blocked_matmul(name: str, m: int, k: int, n: int, n_blocks: int):
    """A kernel graph's X [m, k] and W [k, n] (fp16) and a block graph of ``n_blocks`` blocks of
    column tiles that accumulates X @ W over K in 4 steps: (g, x, w, tb, the accumulator)."""
    g = mi.new_kernel_graph(name)
    x = g.new_input(dims=(m, k), dtype=mi.float16, name="X")
    w = g.new_input(dims=(k, n), dtype=mi.float16, name="W")
    tb = mi.new_threadblock_graph(grid_dim=(n_blocks, 1, 1), block_dim=(128, 1, 1), forloop_range=4)
    bx = tb.new_input(x, input_map=(-1, -1, -1), forloop_dim=1)
    bw = tb.new_input(w, input_map=(1, -1, -1), forloop_dim=0)
    return g, x, w, tb, tb.forloop_accum(tb.matmul(bx, bw))


def matmul_then_silu(m: int = 16, k: int = 256, n: int = 1024, n_blocks: int = 8) -> mi.KernelGraph:
    """X @ W in one kernel, silu of it in a second whose blocks read one block's tile each (a fold
    with clusters of one block)."""
    g, x, w, tb, product = _blocked_matmul("matmul_silu", m, k, n, n_blocks)
    tb.new_output(product, output_map=(1, -1, -1))
    (product,) = g.customized([x, w], tb)
    tb2 = mi.new_threadblock_graph(grid_dim=(n_blocks, 1, 1), block_dim=(128, 1, 1), forloop_range=1)
    tb2.new_output(tb2.forloop_accum(tb2.silu(tb2.new_input(product, input_map=(1, -1, -1)))),
                   output_map=(1, -1, -1))
    (out,) = g.customized([product], tb2)
    g.mark_output(out)
    return g.freeze()


def matmul_epilogue(op: str, m: int = 16, k: int = 256, n: int = 512, then: str = "") -> mi.KernelGraph:
    """``op(X @ W)`` in one kernel (``op`` a unary builder method: sigmoid, tanh, silu, ...): blocks
    of 64 columns, K in 4 steps, ``op`` after the loop; ``then``: a unary op between the product and
    ``op`` (``op(then(X @ W))``)."""
    g, x, w, tb, product = _blocked_matmul(f"epilogue_{op}", m, k, n, n // 64)
    if then:
        product = getattr(tb, then)(product)
    tb.new_output(getattr(tb, op)(product), output_map=(1, -1, -1))
    (out,) = g.customized([x, w], tb)
    g.mark_output(out)
    return g.freeze()


def _softmax_along(dim: int, rows: int, cols: int, blocks: int, threads: int, dtype) -> mi.KernelGraph:
    """exp(x − max) / Σ exp(x − max) over dim ``dim`` of x (rows, cols), the other dim split over
    ``blocks`` blocks, one iteration: a max and a sum over ``dim`` of every tile."""
    g = mi.new_kernel_graph("row_softmax" if dim == 1 else "column_softmax")
    x = g.new_input(dims=(rows, cols), dtype=dtype)
    tb = mi.new_threadblock_graph(grid_dim=(blocks, 1, 1), block_dim=(threads, 1, 1), forloop_range=1)
    bx = tb.new_input(x, input_map=(1 - dim, -1, -1))
    e = tb.exp(tb.sub(bx, tb.reduction_max(bx, dim)))
    tb.new_output(tb.forloop_accum(tb.div(e, tb.reduction(e, dim))), output_map=(1 - dim, -1, -1))
    (o,) = g.customized([x], tb)
    g.mark_output(o)
    return g.freeze()


def row_softmax(rows: int = 64, cols: int = 1024, blocks: int = 8, threads: int = 256,
                dtype=mi.float16) -> mi.KernelGraph:
    """Softmax along each row, ``rows / blocks`` rows a block: a row-local loop's max and sum."""
    return _softmax_along(1, rows, cols, blocks, threads, dtype)


def column_softmax(rows: int = 64, cols: int = 1024, blocks: int = 8, threads: int = 128,
                   dtype=mi.float16) -> mi.KernelGraph:
    """Softmax down each column, ``cols / blocks`` columns a block: a column loop's max and sum."""
    return _softmax_along(0, rows, cols, blocks, threads, dtype)


def gated_rms(rows: int = 4, cols: int = 2048, threads: int = 512, dtype=mi.float16) -> mi.KernelGraph:
    """rms_norm(x) · silu(y) + z along rows of ``cols``, one block, one iteration."""
    g = mi.new_kernel_graph("gated_rms")
    x, y, z = (g.new_input(dims=(rows, cols), dtype=dtype) for _ in range(3))
    tb = mi.new_threadblock_graph(grid_dim=(1, 1, 1), block_dim=(threads, 1, 1), forloop_range=1)
    bx, by, bz = (tb.new_input(t) for t in (x, y, z))
    out = tb.add(tb.mul(tb.rms_norm(bx, eps=1e-6), tb.silu(by)), bz)
    tb.new_output(tb.forloop_accum(out))
    (o,) = g.customized([x, y, z], tb)
    g.mark_output(o)
    return g.freeze()


def rms_of_slices(rows: int = 16, cols: int = 512, iters: int = 4, threads: int = 128) -> mi.KernelGraph:
    """Σ over the loop of rms_norm(x's tile of ``rows × cols / iters``), element by element: a loop
    whose body reduces along rows of few threads each."""
    g = mi.new_kernel_graph("rms_of_slices")
    x = g.new_input(dims=(rows, cols), dtype=mi.float16)
    tb = mi.new_threadblock_graph(grid_dim=(1, 1, 1), block_dim=(threads, 1, 1), forloop_range=iters)
    bx = tb.new_input(x, forloop_dim=1)
    tb.new_output(tb.forloop_accum(tb.rms_norm(bx, eps=1e-6)))
    (o,) = g.customized([x], tb)
    g.mark_output(o)
    return g.freeze()


def logsumexp_block(iterations: int, log_softmax: bool, rows: int = 16, cols: int = 256,
                    dtype=mi.float32) -> mi.KernelGraph:
    """log Σ exp(x) over rows of ``cols`` in blocks of 4 rows, the row in ``iterations`` steps; with
    ``log_softmax`` (one step only) x − that."""
    g = mi.new_kernel_graph("logsumexp")
    x = g.new_input(dims=(rows, cols), dtype=dtype)
    tb = mi.new_threadblock_graph(grid_dim=(rows // 4, 1, 1), block_dim=(128, 1, 1), forloop_range=iterations)
    bx = tb.new_input(x, input_map=(0, -1, -1), forloop_dim=1 if iterations > 1 else -1)
    lse = tb.log(tb.forloop_accum(tb.reduction(tb.exp(bx), 1)))
    out = tb.sub(tb.forloop_accum(bx), lse) if log_softmax else lse
    tb.new_output(out, output_map=(0, -1, -1))
    (o,) = g.customized([x], tb)
    g.mark_output(o)
    return g.freeze()
