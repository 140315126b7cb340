"""Launch the suite's gqa_b8 attention member once per build, for Nsight Compute: 128 and 256
threads a block, the online-softmax chain on warp MMAs (mma.sync) and on warpgroup MMAs (wgmma), and
last the suite's form (warpgroup MMAs, K and V copied by TMA, 4 stages; ``-k regex:gqa_k3 -s 4`` picks it).

    ncu --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis \\
        -k regex:gqa_k3 python -m benchmarks.ncu_attention

With ``--case`` and ``--member``, only that member in the suite's form, e.g. gqa_b1's pick:

    python -m benchmarks.ncu_attention --case gqa_b1 --member kv_splits=16,q_splits=4,iters=2,threads=128, \\
        --stages 3
"""

from __future__ import annotations

import argparse
import dataclasses


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="", help="a suite case, e.g. gqa_b1 (default: gqa_b8's forms)")
    parser.add_argument("--member", default="", help="text of the member's label (with --case)")
    parser.add_argument("--stages", type=int, default=4)
    args = parser.parse_args(argv)
    if args.case:
        return launch_member(args.case, args.member, args.stages)
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


def launch_member(case: str, member: str, stages: int, calls: int = 3) -> None:
    """``case``'s member labelled ``member`` in the suite's form (warpgroup MMAs, TMA copies), called
    ``calls`` times in a row (``ncu --cache-control none`` then sees the later calls with the caches
    as the earlier ones left them)."""
    import torch

    from benchmarks.attention_isolate import member as find
    from mirage.codegen.gpu_check import random_inputs
    from mirage.codegen.lower_program import generate_cuda_program
    from mirage.codegen.runtime import build_many
    from mirage.optimizer import OptimizerOptions

    graph = find(case, (member,))
    options = dataclasses.replace(OptimizerOptions(), warpgroup_softmax=True, tma_copies=True, stages=stages)
    (program,) = build_many([generate_cuda_program(graph, None, options=options)])
    program.load()
    inputs = random_inputs(graph, seed=0)
    for _ in range(calls):
        program.launch(inputs)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
