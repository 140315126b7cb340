"""Weights read in place where they arrive transposed (mirage.codegen.column_major) on a GPU: each
build passes the float check against the float64 reference on ``weight.T`` views, equals the row-major
build of the same µGraph, and takes any layout a call passes; through the PyTorch path an
``nn.Linear`` model keeps no copy of its weight, and a CUDA graph of it sees in-place updates."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

from gpu_helpers import GEMV_PROGRAMS, LinearRelu  # noqa: E402

import mirage as mi  # noqa: E402
from benchmarks.mugraphs import mlp  # noqa: E402
from mirage.codegen import column_major  # noqa: E402
from mirage.codegen.gpu_check import check_on_gpu, random_inputs  # noqa: E402
from mirage.codegen.lower_program import generate_cuda_program  # noqa: E402
from mirage.codegen.runtime import build_many  # noqa: E402
from mirage.optimizer import OptimizerOptions  # noqa: E402

pytestmark = pytest.mark.gpu

# µGraph, and its weights (the K × N inputs)
GRAPHS = {
    **{name: (make, (2,) if name != "lora_k_loop" else (1, 2)) for name, make in GEMV_PROGRAMS.items()},
    "gatedmlp_m8": (lambda: mlp.gatedmlp_fused(8, grid=128, iters=16, threads=128), (1, 2)),
}


def _close(x, y) -> None:
    torch.testing.assert_close(x.float(), y.float(), rtol=1e-2, atol=1e-2 * float(y.float().abs().max()))


def _shifted_transposed(t):
    """``t`` as a column-major view that starts 2 bytes past a 16-byte boundary (the element copies)."""
    storage = torch.empty(t.numel() + 8, dtype=t.dtype, device=t.device)
    view = storage[1:1 + t.numel()].view(t.shape[-1], t.shape[-2]).mT
    view.copy_(t)
    assert view.mT.is_contiguous() and view.data_ptr() % 16 == 2
    return view


@pytest.mark.parametrize("name", list(GRAPHS))
@pytest.mark.parametrize("stages", [2, 3])
def test_a_build_reading_weights_in_place_matches_the_row_major_build(name, stages):
    make, weights = GRAPHS[name]
    graph = make()
    declared = column_major.with_transposed_inputs(graph, weights)
    options = dataclasses.replace(OptimizerOptions(), stages=stages)
    ours, theirs = build_many([generate_cuda_program(g, None, options=options) for g in (declared, graph)])
    assert ours.transposed_inputs == weights and "mirage::dev::Transposed<" in ours.source
    inputs = random_inputs(declared, seed=5)
    assert all(inputs[p].mT.is_contiguous() and not inputs[p].is_contiguous() for p in weights)
    result = check_on_gpu(declared, ours.with_poison(), inputs=inputs)
    assert result.passed, result.as_dict()
    expected = theirs(*[t.contiguous() for t in inputs])
    row_major = [t.contiguous() for t in inputs]  # a call may pass the other layout: copied
    shifted = [_shifted_transposed(t) if p in weights else t for p, t in enumerate(inputs)]
    for given in (inputs, row_major, shifted):
        for x, y in zip(ours.with_poison()(*given), expected, strict=True):
            _close(x, y)


@pytest.mark.parametrize(("warpgroup", "tma", "dim", "key_tile"), [
    (False, False, 64, 64), (True, False, 64, 64), (True, True, 64, 64),  # warp; warpgroup; its K by TMA
    (True, False, 128, 128), (True, True, 128, 128),  # D of two swizzle rows; 128 keys a tile
])
def test_an_attention_reading_k_in_place_matches_the_row_major_build(warpgroup, tma, dim, key_tile):
    from benchmarks.mugraphs.attention import one_kernel

    graph = one_kernel(8, 512, 512, dim, 64, key_tile)
    declared = column_major.with_transposed_inputs(graph, [1])  # K given as k.mT
    options = dataclasses.replace(OptimizerOptions(), warpgroup_softmax=warpgroup, tma_copies=tma)
    ours, theirs = build_many([generate_cuda_program(g, None, options=options) for g in (declared, graph)])
    assert ours.transposed_inputs == (1,)
    assert any(k.tensor_maps for k in ours.cuda.kernels) == tma
    inputs = random_inputs(declared, seed=6)
    result = check_on_gpu(declared, ours.with_poison(), inputs=inputs)
    assert result.passed, result.as_dict()
    expected = theirs(*[t.contiguous() for t in inputs])
    for x, y in zip(ours.with_poison()(*inputs), expected, strict=True):
        _close(x, y)


def _head_split(graph, heads: int = 12, dim: int = 64):
    """``graph`` (Q, K, V inputs) with its inputs declared as Hugging Face's head splits of [s, h·d]
    projections: Q and V [h, s, d] with strides (d, h·d, 1), K [h, d, s] with (d, 1, h·d)."""
    nodes = list(graph.nodes)
    for p, strides in enumerate(((dim, heads * dim, 1), (dim, 1, heads * dim), (dim, heads * dim, 1))):
        i = graph.input_nodes[p]
        layout = "col" if p == 1 else ""
        nodes[i] = dataclasses.replace(nodes[i], attrs=dataclasses.replace(nodes[i].attrs, layout=layout,
                                                                           strides=strides))
    return dataclasses.replace(graph, nodes=tuple(nodes))


@pytest.mark.parametrize(("warpgroup", "tma"), [(False, False), (True, False), (True, True)])
def test_an_attention_reading_head_split_views_in_place_matches_the_dense_build(warpgroup, tma):
    from benchmarks.mugraphs.attention import one_kernel

    graph = one_kernel(12, 128, 128, 64, 64, 64)
    declared = _head_split(graph)
    options = dataclasses.replace(OptimizerOptions(), warpgroup_softmax=warpgroup, tma_copies=tma)
    ours, theirs = build_many([generate_cuda_program(g, None, options=options) for g in (declared, graph)])
    assert ours.transposed_inputs == (1,) and sorted(ours.input_strides) == [0, 1, 2]
    inputs = random_inputs(declared, seed=3)
    assert not any(t.is_contiguous() for t in inputs)
    result = check_on_gpu(declared, ours.with_poison(), inputs=inputs)
    assert result.passed, result.as_dict()
    expected = theirs(*[t.contiguous() for t in inputs])
    for given in (inputs, [t.contiguous() for t in inputs]):  # dense ones are copied into the strides
        for x, y in zip(ours.with_poison()(*given), expected, strict=True):
            _close(x, y)


def _linear_mugraph(n: int = 2048) -> mi.KernelGraph:
    """relu(x · Wᵀ) as one kernel: 128 blocks over N, K in 16 steps (the suite's GEMV form)."""
    g = mi.new_kernel_graph()
    w = g.new_input(dims=(n, n), dtype=mi.float16)
    x = g.new_input(dims=(8, n), dtype=mi.float16)
    tb = mi.new_threadblock_graph(grid_dim=(128, 1, 1), block_dim=(128, 1, 1), forloop_range=16)
    wt = tb.new_input(w, input_map=(1, -1, -1), forloop_dim=0)
    xt = tb.new_input(x, input_map=(-1, -1, -1), forloop_dim=1)
    tb.new_output(tb.relu(tb.forloop_accum(tb.matmul(xt, wt))), output_map=(1, -1, -1))
    (y,) = g.customized([w, x], tb)
    g.mark_output(y)
    return g.graph


def test_a_linear_model_reads_its_weight_in_place_and_a_cuda_graph_sees_updates(monkeypatch):
    from gpu_helpers import replayed

    from mirage.frontend import optimize
    from mirage.frontend.runtime import SubprogramModule

    # the build runs whatever PyTorch's time: under the other tests' load, cuBLAS was once timed faster
    monkeypatch.setattr(optimize, "pytorch_us", lambda reference, runner: None)

    model = LinearRelu().cuda().half().eval()
    x = torch.randn(8, 2048, device="cuda", dtype=torch.float16)
    fast = mi.superoptimize(model, (x,), search=False, candidates=[_linear_mugraph()], use_cache=False,
                            progress=False, whole_program_check=False)
    modules = [m for m in fast.specializations[0].module.modules() if isinstance(m, SubprogramModule)]
    with torch.no_grad():
        reference = torch.relu(x.double() @ model.fc.weight.double().T)
        _close(fast(x), reference)
        executors = [e for m in modules for e in m._executors.values()]
        assert any(e.transposed for e in executors), [m.choice.source for m in modules]
        assert not any(m.copies_constants for m in modules)
        assert sum(e.kept_bytes for e in executors) == 0
        out = replayed(fast, (x,), lambda: model.fc.weight.mul_(-1))
        _close(out, model(x))
