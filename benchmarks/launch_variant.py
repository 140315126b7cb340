"""Build one member of a case's family and launch it a few times: a target for Nsight Compute.

    ncu --section SpeedOfLight --section WarpStateStats -k regex:gqa_k \\
        python -m benchmarks.launch_variant --case gqa_b1 --label kv_splits=4,q_splits=16,... --stages 2 \\
            [--base warpgroup_softmax=true,tma_copies=true]

The label is a member's label as ``benchmarks.explore`` writes it (``--family wide`` searches the
wider family).  Prints the kernels with their grids and shared memory.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging

log = logging.getLogger("benchmarks.launch_variant")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", required=True)
    parser.add_argument("--label", required=True)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--family", choices=["tuned", "wide"], default="wide")
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--base", default="",
                        help="OptimizerOptions of the build, e.g. warpgroup_softmax=true,tma_copies=true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    import torch

    from benchmarks.mugraphs import CASES
    from benchmarks.variants import family
    from mirage.codegen.gpu_check import random_inputs
    from mirage.codegen.lower_program import generate_cuda_program
    from mirage.codegen.runtime import build_many
    from mirage.optimizer import OptimizerOptions

    members = {variant.label: graph for variant, graph in family(args.case, wide=args.family == "wide")}
    if args.label not in members:
        raise SystemExit(f"no member {args.label!r} in the {args.family} family of {args.case}; "
                         f"members: {sorted(members)[:5]}...")
    from benchmarks.explore import _options

    options = dataclasses.replace(OptimizerOptions(), stages=args.stages, **_options(args.base))
    cuda = generate_cuda_program(members[args.label], None, options=options)
    (program,) = build_many([cuda])
    if isinstance(program, Exception):
        raise program
    program.load()
    inputs = random_inputs(CASES[args.case].reference(), seed=0)
    for kernel in cuda.kernels:
        log.info("%s: grid %s, block %s, %d bytes of shared memory", kernel.name, kernel.grid, kernel.block,
                 kernel.smem_bytes)
    for _ in range(args.launches):
        program.launch(inputs)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
