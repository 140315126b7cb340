"""Helpers of the GPU tests."""

from __future__ import annotations

import torch

from benchmarks.mugraphs import mlp
from benchmarks.rms_forms import gemv

# weight-streaming programs that the copy-path tests (multicast, evict-first) build in several ways
GEMV_PROGRAMS = {
    "rmsnorm_b8": lambda: mlp.rmsnorm_fused(8, grid=128, iters=16, threads=256),
    "gemv_b8": lambda: gemv(8, 128, 16, 256),
    "lora_k_loop": lambda: mlp.lora_fused(16, grid=64, iters=2, threads=128),
}


def assert_equal_bits(x, y) -> None:
    """A ``same`` for the helpers below: bit for bit."""
    import torch

    assert torch.equal(x, y)


def misaligned(tensor):
    """A copy of ``tensor`` that starts 2 bytes past a 16-byte boundary (16-bit elements): what the
    input iterators' element-copy paths take."""
    import torch

    storage = torch.empty(tensor.numel() + 8, dtype=tensor.dtype, device=tensor.device)
    shifted = storage[1:1 + tensor.numel()].view_as(tensor)
    shifted.copy_(tensor)
    assert shifted.data_ptr() % 16 == 2
    return shifted


def assert_checked_and_matching(graph, ours, theirs, seed: int, same, launches: int = 3) -> None:
    """``ours`` passes the float check against the float64 reference of ``graph``, and its outputs
    (into poisoned buffers, ``launches`` times) match ``theirs`` by ``same(x, y)``, which asserts."""
    from mirage.codegen.gpu_check import check_on_gpu, random_inputs

    inputs = random_inputs(graph, seed=seed)
    result = check_on_gpu(graph, ours.with_poison(), inputs=inputs)
    assert result.passed, result.as_dict()
    expected = theirs(*inputs)
    for _ in range(launches):
        for x, y in zip(ours.with_poison()(*inputs), expected, strict=True):
            same(x, y)


def assert_matching_on_misaligned(graph, ours, theirs, index: int, seed: int, same,
                                  launches: int = 2) -> None:
    """Input ``index`` of ``graph`` starting 2 bytes past a 16-byte boundary (:func:`misaligned`):
    ``ours`` on it (into poisoned buffers, ``launches`` times) matches ``theirs`` on the aligned inputs
    by ``same(x, y)``, which asserts."""
    from mirage.codegen.gpu_check import random_inputs

    inputs = random_inputs(graph, seed=seed)
    shifted = list(inputs)
    shifted[index] = misaligned(inputs[index])
    expected = theirs(*inputs)
    for _ in range(launches):
        for x, y in zip(ours.with_poison()(*shifted), expected, strict=True):
            same(x, y)


def replayed(fn, inputs, between=None):
    """``fn(*inputs)`` captured in a CUDA graph (after a warm-up on a side stream), ``between()``
    called (changing inputs in place, say), the graph replayed once: the captured outputs."""
    import torch

    from mirage.codegen.profile import captured

    graph, out = captured(lambda: fn(*inputs))
    if between is not None:
        between()
    graph.replay()
    torch.cuda.synchronize()
    return out


class LinearRelu(torch.nn.Module):
    """relu(x · weightᵀ): nn.Linear reads its weight transposed, a strided view of a parameter."""

    def __init__(self, n: int = 2048):
        super().__init__()
        self.fc = torch.nn.Linear(n, n, bias=False)

    def forward(self, x):
        return torch.relu(self.fc(x))


def built_collection(builders: dict) -> dict:
    """The µGraphs of ``builders`` (name → function building one), generated and built for this GPU
    together: name → (graph, program)."""
    from mirage.codegen.lower_program import generate_cuda_program
    from mirage.codegen.runtime import build_many

    graphs = {name: build() for name, build in builders.items()}
    programs = build_many([generate_cuda_program(g, None) for g in graphs.values()])
    return {name: (graphs[name], program) for name, program in zip(graphs, programs, strict=True)}


def assert_matches_float64(graph, program, seed: int, name: str, scale: float = 1.0) -> None:
    """``program`` (of ``graph``) passes the float check against float64, every output element written
    (outputs poisoned first)."""
    from mirage.codegen.gpu_check import check_on_gpu

    result = check_on_gpu(graph, program, seed=seed, scale=scale, name=name)
    assert result.passed, result.failure()
    assert result.unwritten == 0
