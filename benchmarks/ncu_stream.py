"""Launch the stream-floor kernels once each, for Nsight Compute: the box read of rmsnorm's weight
(128 strips, 512 threads) and our plain GEMV at b = 8 (128 blocks, 16 iterations, 512 threads) with 2
and 3 pipeline stages.

    ncu --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \\
        -k regex:"read_boxes|gemv" python -m benchmarks.ncu_stream
"""

from __future__ import annotations

import dataclasses


def main() -> None:
    import torch

    from benchmarks.rms_forms import gemv
    from benchmarks.stream_floor import box_reader
    from mirage.codegen.lower_program import generate_cuda_program
    from mirage.optimizer import OptimizerOptions

    weight = torch.randn(4096, 6144, device="cuda").half()
    box_reader(weight, 128, 1, 512)()
    inputs = [torch.randn(16, 4096, device="cuda").half(), torch.randn(1, 4096, device="cuda").half(), weight]
    programs = [generate_cuda_program(gemv(8, 128, 16, 512), None,
                                      options=dataclasses.replace(OptimizerOptions(), stages=stages))
                for stages in (2, 3)]
    launch_once(programs, inputs)


def launch_once(programs, inputs) -> None:
    """Build ``programs`` and launch each once on ``inputs`` (what Nsight Compute profiles)."""
    import torch

    from mirage.codegen.runtime import build_many

    for program in build_many(programs):
        program.load()
        program.launch(inputs)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
