"""Weights read in place where they arrive transposed (``mirage.codegen.column_major``), against the
row-major build of the same µGraph: for each weight-streaming µGraph of the suite (and an attention's
K), the row-major build on row-major weights (what a kept copy of ``weight.T`` gives), the same build
on ``weight.T`` views
(a copy in every call: what a CUDA graph of an ``nn.Linear`` model recorded before), and the build
that reads ``weight.T`` in place.  CUDA-graph replays, one run; writes column_major_<date>.json into
``--out``.  Needs a GPU.

    python -m benchmarks.column_major
"""

from __future__ import annotations

from benchmarks.mugraphs import mlp
from benchmarks.mugraphs.attention import one_kernel
from benchmarks.rms_forms import gemv

# µGraph, the positions of its weights (K × N inputs that nn.Linear would pass as weight.T; for the
# attention, Kᵀ as q @ k.transpose(-2, -1) passes it), and optionally OptimizerOptions fields
PROGRAMS = {
    "gemv_b8": (lambda: gemv(8, 128, 16, 256), (2,)),
    "rmsnorm_b8": (lambda: mlp.rmsnorm_fused(8, grid=128, iters=16, threads=256), (2,)),
    "rmsnorm_b1": (lambda: mlp.rmsnorm_fused(1, grid=128, iters=16, threads=256), (2,)),
    "gatedmlp_m8": (lambda: mlp.gatedmlp_fused(8, grid=128, iters=16, threads=128), (1, 2)),
    "gatedmlp_m1": (lambda: mlp.gatedmlp_fused(1, grid=128, iters=16, threads=128), (1, 2)),
    "lora_m16": (lambda: mlp.lora_fused(16, grid=64, iters=2, threads=128), (1, 2)),
    "attention_h8_512": (lambda: one_kernel(8, 512, 512, 64, 64, 64), (1,)),
}
# the attention (GPT-2's shape: 12 heads, 512 tokens, 128 keys a tile) in each form of its chain
for form, flags in {"warp": {}, "warpgroup": {"warpgroup_softmax": True},
                    "warpgroup_tma": {"warpgroup_softmax": True, "tma_copies": True}}.items():
    PROGRAMS[f"attention_h12_512_{form}"] = (lambda: one_kernel(12, 512, 512, 64, 64, 128), (1,), flags)


def measure(name: str, stages: int = 2) -> dict:
    import dataclasses

    from mirage.codegen import column_major
    from mirage.codegen.gpu_check import check_on_gpu, random_inputs
    from mirage.codegen.lower_program import generate_cuda_program
    from mirage.codegen.profile import time_graph
    from mirage.codegen.runtime import build_many
    from mirage.optimizer import OptimizerOptions

    make, weights, *flags = PROGRAMS[name]
    graph = make()
    declared = column_major.with_transposed_inputs(graph, weights)
    options = dataclasses.replace(OptimizerOptions(), stages=stages, **(flags[0] if flags else {}))
    row, col = build_many([generate_cuda_program(g, None, options=options) for g in (graph, declared)])
    rows_in = random_inputs(graph, seed=1)
    cols_in = [t.mT.contiguous().mT if p in weights else t for p, t in enumerate(rows_in)]
    check = check_on_gpu(declared, col.with_poison(), inputs=cols_in)

    def timed(program, inputs) -> float:
        return round(time_graph(lambda: program(*inputs), replays=200).median_us, 3)

    return {"program": name, "stages": stages, "read_in_place": list(col.transposed_inputs),
            "passed": check.passed, "row_major_us": timed(row, rows_in),
            "row_major_copying_us": timed(row, cols_in), "in_place_us": timed(col, cols_in)}


def main(argv=None) -> None:
    from benchmarks.stream_floor import program_arguments, write_record
    from mirage.codegen.profile import device_facts

    args = program_arguments(__doc__, argv)
    wanted = args.wanted
    rows = []
    for name in PROGRAMS:
        if wanted and name not in wanted:
            continue
        for stages in (2, 3):
            rows.append(measure(name, stages))
            print(rows[-1], flush=True)
    write_record(args.out, "column_major", device_facts(), rows)


if __name__ == "__main__":
    main()
