"""Launch the suite's gqa_b8 attention member once per build, for Nsight Compute: 128 and 256
threads a block, the online-softmax chain on warp MMAs (mma.sync) and on warpgroup MMAs (wgmma), and
last the suite's form (warpgroup MMAs, K and V copied by TMA, 4 stages; ``-k regex:gqa_k3 -s 4`` picks it).

    ncu --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis \\
        -k regex:gqa_k3 python -m benchmarks.ncu_attention
"""

from __future__ import annotations

import dataclasses


def main() -> None:
    from benchmarks.ncu_stream import launch_once
    from benchmarks.variants import family
    from mirage.codegen.gpu_check import random_inputs
    from mirage.codegen.lower_program import generate_cuda_program
    from mirage.optimizer import OptimizerOptions

    programs, graph = [], None
    for threads in (128, 256):
        label = f"kv_splits=8,q_splits=2,iters=8,threads={threads},"
        graph = next(g for row, g in family("gqa_b8", wide=True) if label in row.label
                     and "combine_rows=8" in row.label)
        for warpgroup in (False, True):
            options = dataclasses.replace(OptimizerOptions(), warpgroup_softmax=warpgroup)
            programs.append(generate_cuda_program(graph, None, options=options))
    # the suite's form since run 14: warpgroup MMAs, K and V copied by TMA into a ring of 4 stages
    options = dataclasses.replace(OptimizerOptions(), warpgroup_softmax=True, tma_copies=True, stages=4)
    programs.append(generate_cuda_program(graph, None, options=options))
    launch_once(programs, random_inputs(graph, seed=0))


if __name__ == "__main__":
    main()
