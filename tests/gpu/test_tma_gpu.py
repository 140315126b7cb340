"""TMA copies of a warpgroup chain's K and V on a GPU (``OptimizerOptions.tma_copies``): the build
passes the float check against the float64 reference and gives the same bits as the cp.async build
of the same warpgroup form (the same tiles land in the same swizzled places; only who copies them
differs), over several launches, with each P·V in its step or deferred, at two depths, with the
stages handed back through barriers instead of the loop's block barriers (``tma_release``), and with
the Q·K products reading Q's fragments from registers instead of its tile (``q_fragments``), and with
the copies issued by a producer warp of their own (``producer_warp``, where the kernel qualifies);
the tensor maps (by-value kernel parameters) survive a CUDA graph's capture and replay; a misaligned
input is copied into aligned storage, and the encoder refuses one with a clear error."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

from gpu_helpers import (  # noqa: E402
    assert_checked_and_matching,
    assert_matching_on_misaligned,
    misaligned,
)
from test_warpgroup_softmax_gpu import MEMBERS, _member  # noqa: E402

from benchmarks.mugraphs import attention  # noqa: E402
from mirage.codegen import tensor_maps  # noqa: E402
from mirage.codegen.gpu_check import random_inputs  # noqa: E402
from mirage.codegen.lower_program import generate_cuda_program  # noqa: E402
from mirage.codegen.runtime import build_many  # noqa: E402
from mirage.codegen.tensor_maps import TensorMapError  # noqa: E402
from mirage.optimizer import OptimizerOptions  # noqa: E402

pytestmark = pytest.mark.gpu

NAMES = ["gqa_b8_128", "gqa_b8_256", "gqa_b8_512", "gqa_b1", "qknorm_b1", "qknorm_b8_scales"]


def _builds(graph, stages: int, defer: bool = False, release: bool = False, **tma_options):
    """(TMA build, cp.async build) of the warpgroup form; ``release``: the TMA build hands its stages
    back through barriers (no block barrier in the loop, where the loop qualifies); ``tma_options``:
    more options of the TMA build."""
    options = OptimizerOptions(stages=stages, warpgroup_softmax=True, defer_values=defer)
    tma = generate_cuda_program(graph, None, options=dataclasses.replace(
        options, tma_copies=True, tma_release=release, **tma_options))  # release: default on
    assert tma.kernels[0].tensor_maps or any(k.tensor_maps for k in tma.kernels)  # the copies were chosen
    return tma, generate_cuda_program(graph, None, options=options)


# (defer, release, more options of the TMA build): the deferred P·V released a step late, and Q·K
# reading Q's fragments from registers
FORMS = {
    "in_step": (False, False, {}),
    "deferred": (True, False, {}),
    "released": (False, True, {}),
    "deferred_released": (True, True, {}),
    "q_fragments": (False, True, {"q_fragments": True}),
    "q_fragments_deferred": (True, True, {"q_fragments": True}),
    "producer_warp": (False, True, {"producer_warp": True}),
    "producer_warp_deferred": (True, True, {"producer_warp": True}),
}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("form", FORMS)
def test_tma_build_gives_the_cp_async_builds_bits(name, stages, form):
    defer, release, more = FORMS[form]
    graph = _member(*MEMBERS[name])
    ours, theirs = build_many(list(_builds(graph, stages, defer, release, **more)))
    assert_checked_and_matching(graph, ours, theirs, 11, lambda x, y: torch.testing.assert_close(
        x, y, rtol=0, atol=0))


@pytest.mark.parametrize("threads", [128, 256])
def test_head_dim_128_matches_reference_and_cp_async(threads):
    """A shape of no suite case (head dim 128: V's tiles two boxes wide), released stages."""
    graph = attention.rows_fused(2, 128, 128, 2048, kv_splits=8, q_splits=1, iters=4, threads=threads,
                                 combine_splits=2)
    ours, theirs = build_many(list(_builds(graph, 3, release=True)))
    assert_checked_and_matching(graph, ours, theirs, 16, lambda x, y: torch.testing.assert_close(
        x, y, rtol=0, atol=0))


def test_tensor_maps_survive_graph_capture():
    """Captured once, replayed with new values in the same tensors: the maps address the tensors."""
    graph = _member(*MEMBERS["gqa_b8_128"])
    ours, theirs = build_many(list(_builds(graph, 3, release=True)))
    inputs = random_inputs(graph, seed=12)
    out = ours(*inputs)[0]
    stream = torch.cuda.Stream()
    captured = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(captured, stream=stream):
        (replayed,) = ours(*inputs)
    for seed in (13, 14):
        for x, y in zip(inputs, random_inputs(graph, seed=seed), strict=True):
            x.copy_(y)
        captured.replay()
        torch.cuda.synchronize()
        assert torch.equal(replayed, theirs(*inputs)[0])
    assert not torch.equal(replayed, out)


def test_misaligned_k_is_copied_into_aligned_storage():
    """K starting 2 bytes past a 16-byte boundary (a slice of a larger tensor): a tensor map cannot
    address it, so the runtime copies it first; the result is the cp.async build's, bit for bit."""
    graph = _member(*MEMBERS["gqa_b8_128"])
    ours, theirs = build_many(list(_builds(graph, 2, release=True)))
    assert_matching_on_misaligned(graph, ours, theirs, 1, 15, lambda x, y: torch.testing.assert_close(
        x, y, rtol=0, atol=0))


def test_encoding_refuses_a_misaligned_tensor():
    """The encoder itself names the problem (the runtime never hands it such a tensor)."""
    graph = _member(*MEMBERS["gqa_b8_128"])
    program = _builds(graph, 2)[0]
    spec = next(k for k in program.kernels if k.tensor_maps).tensor_maps[0]
    with pytest.raises(TensorMapError, match="16-byte aligned"):
        tensor_maps.encode(misaligned(random_inputs(graph, seed=15)[1]), spec)
