"""Attention at head dim 128, (16 heads, 1,024 queries, 1,024 keys, 128): hand-built one-kernel µGraphs
(FlashAttention's form, ``mugraphs.attention.one_kernel``) of 64 or 128 query rows a block and 64 or
128 keys a loop step, on warpgroup MMAs with TMA copies, at 2 to 4 pipeline stages, against PyTorch's
SDPA and the softmax written out. The search's pick at this shape (``benchmarks.unseen``'s
wide_head_attention) is the 64-row, 64-key member. Each build is checked against float64 PyTorch
before it is timed. Prints one line per measurement and writes wide_attention_<date>.json into
``--out`` (default benchmarks/results)."""

from __future__ import annotations

import argparse
import dataclasses

import torch
import torch.nn.functional as F

from benchmarks.mugraphs.attention import one_kernel
from benchmarks.stream_floor import write_record
from mirage import MirageError
from mirage.codegen.lower_program import generate_cuda_program
from mirage.codegen.profile import device_facts, time_graph
from mirage.codegen.runtime import build_many
from mirage.optimizer import OptimizerOptions

HEADS, QUERIES, KEYS, DIM = 16, 1024, 1024, 128
WARPGROUP = OptimizerOptions(warpgroup_softmax=True, tma_copies=True)
# (label, one_kernel arguments, options): a warpgroup holds 64 rows, so 128 rows take 256 threads
MEMBERS = [(f"rows{rows}_keys{keys}_stages{stages}", dict(rows=rows, key_tile=keys, threads=2 * rows),
            dataclasses.replace(WARPGROUP, stages=stages))
           for rows in (64, 128) for keys in (64, 128) for stages in (2, 3, 4)]


def builds() -> list:
    """Each member's program, or the error its generation or compilation raised."""
    sources: list = []
    for _, shape, options in MEMBERS:
        try:
            sources.append(generate_cuda_program(one_kernel(HEADS, QUERIES, KEYS, DIM, **shape), None,
                                                 options=options))
        except MirageError as error:
            sources.append(error)
    programs = iter(build_many([s for s in sources if not isinstance(s, Exception)]))
    return [s if isinstance(s, Exception) else next(programs) for s in sources]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results", help="folder of the JSON record")
    args = parser.parse_args(argv)
    facts = device_facts()
    torch.manual_seed(0)
    q, k, v = (torch.randn(HEADS, QUERIES, DIM, device="cuda").half() for _ in range(3))
    kt = k.transpose(-1, -2).contiguous()  # the µGraphs read K as (heads, dim, keys)
    q4, k4, v4 = (x.unsqueeze(0) for x in (q, k, v))
    truth = torch.softmax(q.double() @ k.double().transpose(-1, -2) * DIM ** -0.5, -1) @ v.double()
    rows = []

    def record(row):
        rows.append(row)
        print(row, flush=True)

    baselines = {"eager": lambda: torch.softmax(q @ k.transpose(-1, -2) * DIM ** -0.5, -1) @ v,
                 "sdpa": lambda: F.scaled_dot_product_attention(q4, k4, v4)}
    for label, fn in baselines.items():
        record({"member": label, "us": time_graph(fn, replays=100).median_us})
    for (label, _, _), program in zip(MEMBERS, builds(), strict=True):
        row: dict = {"member": label}
        if isinstance(program, Exception):
            row["error"] = f"{type(program).__name__}: {str(program)[:200]}"
        else:
            kernel = program.cuda.prepared.kernels[0]
            row["shared_bytes"] = kernel.smem_bytes
            (got,) = program(q, kt, v)
            row["max_error"] = (got.double() - truth).abs().max().item()
            if row["max_error"] < 1e-2:
                row["us"] = time_graph(lambda p=program: p(q, kt, v), replays=100).median_us
        record(row)
    write_record(args.out, "wide_attention", facts, rows)


if __name__ == "__main__":
    main()
