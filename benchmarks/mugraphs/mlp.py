"""RMSNorm + linear, gated MLP and LoRA (BENCHMARKS.md)."""

from __future__ import annotations

import mirage as mi

EPS = 1e-6


def rmsnorm_shapes(b: int) -> list[tuple[int, ...]]:
    # G (4096) is bound as a (1, 4096) view: element-wise operands have equal rank in µGraphs
    return [(2 * b, 4096), (1, 4096), (4096, 6144)]


def rmsnorm_reference(b: int) -> mi.KernelGraph:
    g = mi.new_kernel_graph("rmsnorm")
    x, gain, w = (g.new_input(dims=s, dtype=mi.float16, name=n)
                  for s, n in zip(rmsnorm_shapes(b), "XGW", strict=True))
    g.mark_output(g.matmul(g.mul(g.rms_norm(x, eps=EPS), gain), w))
    return g.freeze()


def rmsnorm_fused(b: int, grid: int = 64, iters: int = 64, threads: int = 128) -> mi.KernelGraph:
    """One kernel: the rms accumulates beside the matmul; the division happens once, after the loop.
    ``grid`` blocks split the 6144 output columns, ``iters`` for-loop iterations the 4096 of K."""
    g = mi.new_kernel_graph("rmsnorm")
    x, gain, w = (g.new_input(dims=s, dtype=mi.float16, name=n)
                  for s, n in zip(rmsnorm_shapes(b), "XGW", strict=True))
    tb = mi.new_threadblock_graph(grid_dim=(grid, 1, 1), block_dim=(threads, 1, 1), forloop_range=iters)
    bx = tb.new_input(x, input_map=(-1, -1, -1), forloop_dim=1)
    bg = tb.new_input(gain, input_map=(-1, -1, -1), forloop_dim=1)
    bw = tb.new_input(w, input_map=(1, -1, -1), forloop_dim=0)
    rms = tb.forloop_accum(bx, acc="rms", eps=EPS)
    acc = tb.forloop_accum(tb.matmul(tb.mul(bx, bg), bw))
    tb.new_output(tb.div(acc, rms), output_map=(1, -1, -1))
    (out,) = g.customized([x, gain, w], tb)
    g.mark_output(out)
    return g.freeze()


def rmsnorm_two_kernels(b: int, grid: int = 128, iters: int = 16, threads: int = 256,
                        norm_threads: int = 256, k_splits: int = 1,
                        library_product: bool = False) -> mi.KernelGraph:
    """Two kernels: ``Y = rms(X) · G`` (one block per row), then the weight-streaming ``Y @ W``.  The
    second kernel's weight tiles depend on nothing the first writes, so, launched while the first
    runs (programmatic dependent launch), it pulls its first tiles into L2 during it.  ``k_splits``:
    the product split along K too (:func:`streamed_matmul`).  ``library_product``: the product is the
    kernel graph's pre-defined matmul (the vendor library's GEMM, as a Mirage µGraph's kernel-level
    operators are) instead of a generated kernel; ``grid``, ``iters``, ``threads`` then go unused."""
    g = mi.new_kernel_graph("rmsnorm")
    x, gain, w = (g.new_input(dims=s, dtype=mi.float16, name=n)
                  for s, n in zip(rmsnorm_shapes(b), "XGW", strict=True))
    rows = rmsnorm_shapes(b)[0][0]
    tn = mi.new_threadblock_graph(grid_dim=(rows, 1, 1), block_dim=(norm_threads, 1, 1), forloop_range=1)
    bx = tn.new_input(x, input_map=(0, -1, -1), forloop_dim=-1)  # [1, 4096]
    bg = tn.new_input(gain, input_map=(-1, -1, -1), forloop_dim=-1)  # [1, 4096]
    tn.new_output(tn.forloop_accum(tn.mul(tn.rms_norm(bx, eps=EPS), bg)), output_map=(0, -1, -1))
    (y,) = g.customized([x, gain], tn)
    g.mark_output(g.matmul(y, w) if library_product else streamed_matmul(g, y, w, grid, iters, threads,
                                                                         k_splits))
    return g.freeze()


def streamed_matmul(g, x, w, grid: int, iters: int, threads: int, k_splits: int = 1):
    """``X @ W`` as one weight-streaming kernel: ``grid`` blocks split W's columns, ``iters``
    for-loop iterations its rows (every block reads all of X).  With ``k_splits`` > 1 the blocks split
    K as well (grid y; each reads its part of X and ``iters`` tiles of its rows of W), their partial
    products stacked along the rows, and a second kernel of ``grid`` blocks sums them: two blocks of a
    column strip an SM stream more of W at once (a cluster fold can run the sum in the first kernel)."""
    tb = mi.new_threadblock_graph(grid_dim=(grid, k_splits, 1), block_dim=(threads, 1, 1),
                                  forloop_range=iters)
    along = (1, 0) if k_splits > 1 else (-1, -1)  # grid y: X's columns, W's rows, the partials' rows
    bx = tb.new_input(x, input_map=(-1, along[0], -1), forloop_dim=1)
    bw = tb.new_input(w, input_map=(1, along[1], -1), forloop_dim=0)
    tb.new_output(tb.forloop_accum(tb.matmul(bx, bw)), output_map=(1, along[1], -1))
    (out,) = g.customized([x, w], tb)
    if k_splits == 1:
        return out
    ts = mi.new_threadblock_graph(grid_dim=(grid, 1, 1), block_dim=(threads, 1, 1), forloop_range=k_splits)
    tp = ts.new_input(out, input_map=(1, -1, -1), forloop_dim=0)  # one split's rows an iteration
    ts.new_output(ts.forloop_accum(tp), output_map=(1, -1, -1))  # summed over the iterations
    (total,) = g.customized([out], ts)
    return total


def gatedmlp_shapes(m: int) -> list[tuple[int, ...]]:
    return [(m, 4096), (4096, 4096), (4096, 4096)]


def gatedmlp_reference(m: int) -> mi.KernelGraph:
    g = mi.new_kernel_graph("gatedmlp")
    x, w1, w2 = (g.new_input(dims=s, dtype=mi.float16, name=n)
                 for s, n in zip(gatedmlp_shapes(m), ("X", "W1", "W2"), strict=True))
    g.mark_output(g.mul(g.silu(g.matmul(x, w1)), g.matmul(x, w2)))
    return g.freeze()


def gatedmlp_fused(m: int, grid: int = 128, iters: int = 64, threads: int = 128) -> mi.KernelGraph:
    g = mi.new_kernel_graph("gatedmlp")
    x, w1, w2 = (g.new_input(dims=s, dtype=mi.float16, name=n)
                 for s, n in zip(gatedmlp_shapes(m), ("X", "W1", "W2"), strict=True))
    tb = mi.new_threadblock_graph(grid_dim=(grid, 1, 1), block_dim=(threads, 1, 1), forloop_range=iters)
    bx = tb.new_input(x, input_map=(-1, -1, -1), forloop_dim=1)
    b1 = tb.new_input(w1, input_map=(1, -1, -1), forloop_dim=0)
    b2 = tb.new_input(w2, input_map=(1, -1, -1), forloop_dim=0)
    a1 = tb.forloop_accum(tb.matmul(bx, b1))
    a2 = tb.forloop_accum(tb.matmul(bx, b2))
    tb.new_output(tb.mul(tb.silu(a1), a2), output_map=(1, -1, -1))
    (out,) = g.customized([x, w1, w2], tb)
    g.mark_output(out)
    return g.freeze()


def gatedmlp_library(m: int, grid: int = 16, threads: int = 128) -> mi.KernelGraph:
    """Both products as the kernel graph's pre-defined matmuls (the vendor library's GEMMs, as Mirage's
    kernel-level operators are), then ``silu(A1) · A2`` in one kernel of ``grid`` blocks, each a strip
    of the 4096 columns."""
    g = mi.new_kernel_graph("gatedmlp")
    x, w1, w2 = (g.new_input(dims=s, dtype=mi.float16, name=n)
                 for s, n in zip(gatedmlp_shapes(m), ("X", "W1", "W2"), strict=True))
    a1, a2 = g.matmul(x, w1), g.matmul(x, w2)
    tb = mi.new_threadblock_graph(grid_dim=(grid, 1, 1), block_dim=(threads, 1, 1), forloop_range=1)
    b1 = tb.new_input(a1, input_map=(1, -1, -1), forloop_dim=-1)
    b2 = tb.new_input(a2, input_map=(1, -1, -1), forloop_dim=-1)
    tb.new_output(tb.forloop_accum(tb.mul(tb.silu(b1), b2)), output_map=(1, -1, -1))
    (out,) = g.customized([a1, a2], tb)
    g.mark_output(out)
    return g.freeze()


def lora_shapes(m: int = 16) -> list[tuple[int, ...]]:
    return [(m, 256), (256, 4096), (256, 16), (16, 4096)]


def lora_reference(m: int = 16) -> mi.KernelGraph:
    g = mi.new_kernel_graph("lora")
    x, w, la, lb = (g.new_input(dims=s, dtype=mi.float16, name=n)
                    for s, n in zip(lora_shapes(m), ("X", "W", "LA", "LB"), strict=True))
    g.mark_output(g.add(g.matmul(x, w), g.matmul(g.matmul(x, la), lb)))
    return g.freeze()


def lora_fused(m: int = 16, grid: int = 64, concat: bool = False, threads: int = 128,
               iters: int = 1) -> mi.KernelGraph:
    """One kernel; with ``concat`` the two products share one tensor-core pass: (X ‖ XA) @ (W ‖ LB).

    ``iters`` for-loop iterations split K (the 256 of X's columns): iteration k adds
    ``X_k @ W_k + (X_k @ LA_k) @ LB``, which sums to the function since ``(X @ LA) @ LB`` is
    ``Σ_k (X_k @ LA_k) @ LB``.  The weight tiles then stream through the pipeline instead of all
    landing before the first product."""
    g = mi.new_kernel_graph("lora")
    x, w, la, lb = (g.new_input(dims=s, dtype=mi.float16, name=n)
                    for s, n in zip(lora_shapes(m), ("X", "W", "LA", "LB"), strict=True))
    tb = mi.new_threadblock_graph(grid_dim=(grid, 1, 1), block_dim=(threads, 1, 1), forloop_range=iters)
    bx = tb.new_input(x, input_map=(-1, -1, -1), forloop_dim=1 if iters > 1 else -1)
    bw = tb.new_input(w, input_map=(1, -1, -1), forloop_dim=0 if iters > 1 else -1)
    ba = tb.new_input(la, input_map=(-1, -1, -1), forloop_dim=0 if iters > 1 else -1)
    bb = tb.new_input(lb, input_map=(1, -1, -1), forloop_dim=-1)
    xa = tb.matmul(bx, ba)
    y = tb.concat_matmul(bx, xa, bw, bb) if concat else tb.add(tb.matmul(bx, bw), tb.matmul(xa, bb))
    tb.new_output(tb.forloop_accum(y), output_map=(1, -1, -1))
    (out,) = g.customized([x, w, la, lb], tb)
    g.mark_output(out)
    return g.freeze()
