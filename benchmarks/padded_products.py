"""Padded tensor-core products on the GPU (docs/codegen.md, "Padded products"): the µGraphs of
benchmarks/mugraphs/padded.py timed (CUDA-graph replays, median µs a call) beside PyTorch on the
same inputs: eager ``scaled_dot_product_attention`` for the attention graphs (its causal form for
the causal ones), ``torch.mm`` for the
products, ``F.rms_norm`` for a norm. Writes padded_products_<date>.json into ``--out``."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _pytorch(name: str, inputs):
    if "causal" in name:  # the mask input holds the causal pattern: SDPA's own causal kernel
        q, k, v, _ = inputs
        q4, k4, v4 = q[None], k.transpose(1, 2)[None].contiguous(), v[None]
        return lambda: F.scaled_dot_product_attention(q4, k4, v4, is_causal=True)
    if "biased" in name:  # the bias as SDPA's float mask
        q, k, v, bias = inputs
        q4, k4, v4 = q[None], k.transpose(1, 2)[None].contiguous(), v[None]
        return lambda: F.scaled_dot_product_attention(q4, k4, v4, attn_mask=bias[None])
    if "attention" in name:
        q, k, v = inputs  # (heads, tokens, dim), K stored transposed
        q4, k4, v4 = q[None], k.transpose(1, 2)[None].contiguous(), v[None]
        return lambda: F.scaled_dot_product_attention(q4, k4, v4)
    if "rms_norm" in name:
        x, gain = inputs
        return lambda: F.rms_norm(x, (x.shape[-1],), gain[0], eps=1e-6)
    x, w = inputs
    return lambda: torch.mm(x, w)


def main(argv=None) -> None:
    from benchmarks.mugraphs.padded import GRAPHS
    from benchmarks.stream_floor import program_arguments

    time_collection(GRAPHS, "padded_products", program_arguments(__doc__, argv))


def time_collection(collection: dict, record: str, args) -> None:
    """Check each µGraph of ``collection`` (name → builder) against float64 on the GPU and time it beside
    PyTorch's form of the same function; write the rows as ``record``'s JSON into ``args.out``."""
    from benchmarks.stream_floor import write_record
    from mirage.codegen.gpu_check import check_on_gpu, random_inputs
    from mirage.codegen.lower_program import generate_cuda_program
    from mirage.codegen.profile import device_facts, time_graph
    from mirage.codegen.runtime import build_many

    graphs = {name: build() for name, build in collection.items()
              if not args.wanted or name in args.wanted}
    programs = build_many([generate_cuda_program(g, None) for g in graphs.values()])
    rows = []
    for (name, graph), program in zip(graphs.items(), programs, strict=True):
        inputs = random_inputs(graph, seed=1)
        check = check_on_gpu(graph, program, inputs=inputs, name=name)
        row = {"graph": name, "inputs": [list(t.shape) for t in graph.input_types],
               "passed": check.passed, "worst_error": check.worst_error,
               "mirage_us": time_graph(lambda p=program, xs=inputs: p.launch(xs)).median_us,
               "pytorch_us": time_graph(_pytorch(name, inputs)).median_us}
        rows.append(row)
        print(row, flush=True)
    write_record(args.out, record, device_facts(), rows)


if __name__ == "__main__":
    main()
