"""Cluster folds on a GPU (mirage.optimizer.cluster_fold): a combine run at the end of the kernel
that writes its partials, after a cluster barrier.

* Attention members of the benchmark families (clusters of 4, 8 and 16 blocks; one and two combine
  blocks per block; 128 and 256 threads; QKNorm's per-key factors): the folded program against the
  float64 reference, and bit for bit against the same µGraph in two kernels (the arithmetic is the
  same, only where it runs moves).
* A split-K GEMM, a µGraph of no benchmark: its partial products summed by a second kernel.
* A matmul whose silu runs in a second kernel of the same tiling: clusters of one block.

The same programs as counter folds (the blocks of a cluster meet at a counter in device memory),
launched several times, since the counter carries over from launch to launch.

Outputs are poisoned with NaN first, so a combine block that never ran shows.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

from benchmarks.variants import family  # noqa: E402
from mirage.codegen.gpu_check import check_on_gpu, random_inputs  # noqa: E402
from mirage.codegen.lower_program import generate_cuda_program  # noqa: E402
from mirage.codegen.runtime import build_many  # noqa: E402
from mirage.optimizer import OptimizerOptions  # noqa: E402
from tests.unit.optimizer.optimizer_graphs import matmul_then_silu, split_k_gemm  # noqa: E402

pytestmark = pytest.mark.gpu

FOLD = OptimizerOptions(cluster_folds=True)
COUNTER = OptimizerOptions(counter_folds=True)


def _member(case: str, label: str):
    return next(g for row, g in family(case, fold=True) if row.label == label)


def _assert_folded_matches(graph, cluster_size: int, seed: int, options=FOLD, launches: int = 1) -> None:
    folded = generate_cuda_program(graph, None, options=options)
    (launch, *_) = [k for k in folded.kernels if k.consumer >= 0]
    assert launch.cluster_size == (1 if launch.counter else cluster_size)
    two_kernels = generate_cuda_program(graph, None)
    assert len(two_kernels.kernels) == len(folded.kernels) + 1
    ours, theirs = build_many([folded, two_kernels])
    inputs = random_inputs(graph, seed)
    result = check_on_gpu(graph, ours.with_poison(), inputs=inputs)
    assert result.passed, result.as_dict()
    expected = theirs(*inputs)
    for _ in range(launches):
        for x, y in zip(ours.with_poison()(*inputs), expected, strict=True):
            assert torch.equal(x, y)


@pytest.mark.parametrize("case, splits, twin, cluster_size", [
    ("gqa_b1", "kv_splits=16,q_splits=4,iters=2,threads=128", "combine_rows=4,combine_threads=128", 16),
    ("gqa_b1", "kv_splits=16,q_splits=2,iters=2,threads=256", "combine_rows=8,combine_threads=256", 16),
    ("gqa_b8", "kv_splits=8,q_splits=2,iters=8,threads=128", "combine_rows=16,combine_threads=128", 8),
    ("gqa_b8", "kv_splits=4,q_splits=4,iters=8,threads=128", "combine_rows=16,combine_threads=128", 4),
    ("qknorm_b1", "kv_splits=16,q_splits=4,iters=2,threads=128",
     "combine_rows=4,combine_threads=128,key_scales=True", 16),
])
def test_folded_attention_matches_two_kernels(case, splits, twin, cluster_size):
    _assert_folded_matches(_member(case, f"{splits},row_sums=True,{twin}"), cluster_size, seed=3)


def test_two_combine_blocks_per_block():
    from benchmarks.variants import attention_fused

    graph = attention_fused(1, False, row_sums=True, combine_rows=4, combine_threads=128, kv_splits=8,
                            q_splits=4, iters=4, threads=128)  # 64 rows / 4 = 16 combine blocks, 8 blocks
    program = generate_cuda_program(graph, None, options=FOLD)
    assert "constexpr int kRounds = 2;" in program.code
    _assert_folded_matches(graph, 8, seed=5)


def test_folded_split_k_gemm():
    _assert_folded_matches(split_k_gemm(), 8, seed=7)


def test_folded_epilogue_kernel_with_clusters_of_one_block():
    _assert_folded_matches(matmul_then_silu(), 1, seed=9)


@pytest.mark.parametrize("case, label", [
    ("gqa_b1", "kv_splits=16,q_splits=4,iters=2,threads=128,row_sums=True,combine_rows=4,"
               "combine_threads=128"),
    ("qknorm_b1", "kv_splits=16,q_splits=4,iters=2,threads=128,row_sums=True,combine_rows=4,"
                  "combine_threads=128,key_scales=True"),
])
def test_counter_folded_attention_matches_two_kernels(case, label):
    _assert_folded_matches(_member(case, label), 16, seed=11, options=COUNTER, launches=3)


def test_counter_folded_split_k_gemm_over_many_launches():
    _assert_folded_matches(split_k_gemm(), 8, seed=13, options=COUNTER, launches=5)


def test_counter_folded_epilogue_kernel_with_groups_of_one_block():
    _assert_folded_matches(matmul_then_silu(), 1, seed=15, options=COUNTER, launches=2)


def test_counter_fold_of_more_blocks_than_sms_is_refused_at_launch(monkeypatch):
    from mirage.codegen import runtime
    from mirage.errors import MirageError

    program = generate_cuda_program(split_k_gemm(), None, options=COUNTER)
    (built,) = build_many([program])
    monkeypatch.setattr(runtime, "_sm_count", lambda: 8)  # fewer SMs than the grid's 64 blocks
    with pytest.raises(MirageError, match="counter fold of 64 blocks"):
        built(*random_inputs(split_k_gemm(), 1))
