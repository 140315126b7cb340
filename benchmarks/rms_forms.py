"""rmsnorm's fused kernel with and without the register forms of its loop work (row sums in
registers, the gain folded into the matmul's A fragments), against a plain GEMV of the same
shapes (X @ W, no norm and no gain: a floor, not a correct rmsnorm).  Each build's output is checked
against its function in float64 (``relative_error``).  Prints one line per build and writes
rms_forms_<date>.json into ``--out`` (default benchmarks/results)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch

import mirage as mi
from benchmarks.mugraphs import mlp
from mirage.codegen.lower_program import generate_cuda_program
from mirage.codegen.profile import device_facts, time_graph
from mirage.codegen.runtime import build_many
from mirage.optimizer import OptimizerOptions

FORMS = {
    "registers": {},
    "no_fold": {"fold_operand_scale": False},
    "no_row_sums": {"register_row_sums": False},
    "shared": {"fold_operand_scale": False, "register_row_sums": False},
}


def gemv(b: int, grid: int, iters: int, threads: int) -> mi.KernelGraph:
    g = mi.new_kernel_graph("gemv")
    x, _, w = (g.new_input(dims=s, dtype=mi.float16) for s in mlp.rmsnorm_shapes(b))
    g.mark_output(mlp.streamed_matmul(g, x, w, grid, iters, threads))
    return g.freeze()


def relative_error(program, inputs: list[torch.Tensor], norm: bool = False) -> float:
    """How far a build's output is from its function in float64, relative to the output's norm: ``X @ W``
    (the first input and the last), or with ``norm`` rmsnorm's ``(rms(X) · G) @ W``. A probe whose build
    computes something else shows it here (``inf`` for an output of another size)."""
    x, w = inputs[0].double(), inputs[-1].double()
    if norm:
        x = x / torch.sqrt((x * x).mean(-1, keepdim=True) + mlp.EPS) * inputs[1].double()
    want = x @ w
    (got,) = program.launch(inputs)
    if got.numel() != want.numel():  # another function altogether: no element to compare
        return float("inf")
    return float((got.double().reshape(want.shape) - want).norm() / want.norm())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results", help="folder of the JSON record")
    args = parser.parse_args(argv)
    rows, programs = [], []
    for b in (1, 8):
        for iters, threads in ((8, 256), (16, 256), (8, 512), (16, 512)):
            for stages in (2, 3):
                builds = [(form, mlp.rmsnorm_fused(b, grid=128, iters=iters, threads=threads), extra)
                          for form, extra in FORMS.items()]
                builds.append(("gemv", gemv(b, 128, iters, threads), {}))
                for form, graph, extra in builds:
                    options = dataclasses.replace(OptimizerOptions(), stages=stages, **extra)
                    try:
                        programs.append(generate_cuda_program(graph, None, options=options))
                    except mi.MirageError:
                        continue
                    rows.append({"b": b, "form": form, "iters": iters, "threads": threads, "stages": stages})
    for row, program in zip(rows, build_many(programs), strict=True):
        inputs = [torch.randn(s, device="cuda").half() for s in mlp.rmsnorm_shapes(row["b"])]
        program.load()
        row["relative_error"] = relative_error(program, inputs, norm=row["form"] != "gemv")
        row["us"] = time_graph(lambda p=program, x=inputs: p.launch(x), replays=100).median_us
        print(row, flush=True)
    best = {}
    for row in rows:
        key = (row["b"], row["form"])
        best[key] = min(best.get(key, 1e9), row["us"])
    for (b, form), us in sorted(best.items()):
        print(f"best b={b} {form:12s} {us:.2f} µs")
    facts = device_facts()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    with open(Path(args.out) / f"rms_forms_{facts['date']}.json", "w") as f:
        json.dump({"facts": facts, "builds": rows}, f, indent=1)


if __name__ == "__main__":
    main()
