"""Attention over narrow heads on the GPU (head dims of no whole 16: Stable Diffusion 1.5's 40): the
µGraphs of benchmarks/mugraphs/narrow_heads.py checked against float64 and timed (CUDA-graph replays,
median µs a call) beside SDPA on the same inputs. Writes narrow_heads_<date>.json into ``--out``.

``--min-blocks 1,2,3`` times each kernel instead with those blocks an SM asked of the register
allocator (``__launch_bounds__``'s second argument; 1 is what the generator emits for these), and
writes narrow_heads_min_blocks_<date>.json. ``--ncu NAME`` launches NAME's kernel and SDPA once each,
for Nsight Compute (``ncu -k regex:"attention|flash" python -m benchmarks.narrow_heads --ncu ...``)."""

from __future__ import annotations

import argparse
import dataclasses
import math


def main(argv=None) -> None:
    from benchmarks.mugraphs.narrow_heads import GRAPHS
    from benchmarks.padded_products import time_collection
    from benchmarks.stream_floor import program_arguments

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--min-blocks", default="")
    parser.add_argument("--ncu", default="")
    extra, rest = parser.parse_known_args(argv)
    args = program_arguments(__doc__, rest)
    if extra.ncu:
        return launch_once(GRAPHS[extra.ncu]())
    if extra.min_blocks:
        return time_min_blocks(GRAPHS, [int(b) for b in extra.min_blocks.split(",")], args)
    time_collection(GRAPHS, "narrow_heads", args)


def _build(graph, min_blocks: list[int]) -> list:
    from mirage.codegen.lower_program import generate_cuda_program
    from mirage.codegen.runtime import build_many

    program = generate_cuda_program(graph, None)
    (kernel,) = program.kernels
    threads = math.prod(kernel.block)
    plain = f"__launch_bounds__({threads})"
    assert plain in program.code, "a kernel that already asks for blocks an SM"
    return build_many([dataclasses.replace(program, code=program.code.replace(
        plain, f"__launch_bounds__({threads}, {b})")) for b in min_blocks])


def time_min_blocks(collection: dict, min_blocks: list[int], args) -> None:
    from benchmarks.padded_products import _pytorch
    from benchmarks.stream_floor import write_record
    from mirage.codegen.gpu_check import check_on_gpu, random_inputs
    from mirage.codegen.profile import device_facts, time_graph

    rows = []
    for name, build in collection.items():
        if args.wanted and name not in args.wanted:
            continue
        graph = build()
        inputs = random_inputs(graph, seed=1)
        row = {"graph": name, "pytorch_us": time_graph(_pytorch(name, inputs)).median_us}
        for blocks, program in zip(min_blocks, _build(graph, min_blocks), strict=True):
            row[f"passed_{blocks}"] = check_on_gpu(graph, program, inputs=inputs, name=name).passed
            row[f"mirage_us_{blocks}"] = time_graph(lambda p=program, xs=inputs: p.launch(xs)).median_us
        rows.append(row)
        print(row, flush=True)
    write_record(args.out, "narrow_heads_min_blocks", device_facts(), rows)


def launch_once(graph) -> None:
    import torch
    import torch.nn.functional as F

    from mirage.codegen.gpu_check import random_inputs

    (program,) = _build(graph, [1])
    inputs = random_inputs(graph, seed=1)
    program.launch(inputs)
    q, k, v = inputs
    F.scaled_dot_product_attention(q[None], k.transpose(1, 2)[None].contiguous(), v[None])
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
