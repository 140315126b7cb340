"""Long rows of few rows, split over blocks: ``log_softmax(x / t)`` and ``logsumexp(x / t)`` over a
vocabulary (8 rows of 32,000 logits, a sampler's next-token step), written as the two-kernel µGraph a
split reduction takes, next to the one-kernel µGraph of one block a row that the search finds now.

* ``split``: a first graph-defined op of (rows, splits) blocks, each saving its slice's maximum and
  ``Σ exp(x − max)``; a second that combines a row's partials, ``g = max Mᵢ``,
  ``lse = g + log Σ Pᵢ·exp(Mᵢ − g)``, and (log_softmax) writes its slice of ``x − lse``.  This is the
  combine that the online-softmax rewrite would give a split logsumexp (docs/optimizer.md §8), written
  out (``mirage.generator.split_rows``, which the frontend now proposes: the search's `mlp` space holds
  one graph-defined op, so it cannot find this form).  The record of 2026-11-30
  (``split_rows_h200_2026-11-30.json``) was taken with the slice's maximum saved after its sum; the
  frontend's µGraphs, timed through ``mi.superoptimize``, save it first.
* ``whole``: one block a row, the row's maximum and sum in one step (the form selected now).

``--off OPTION[,OPTION...]`` builds every split µGraph a second time with those fields of
:class:`~mirage.optimizer.OptimizerOptions` off (``--off ragged_rows,short_rows``: both kernels of
GPT-2's slices of 1,733 columns op by op, as before row loops took them), the row marked ``"off"``.

Each build is float-checked against float64 (logits of standard deviation 1 and 30), and PyTorch's
own call is timed in the same run.  Writes ``split_rows_<date>.json`` into ``--out`` (the builds as its
``rows``; the record of 2026-11-30 names them ``builds``).
"""

from __future__ import annotations

import argparse
import dataclasses

import mirage as mi
from mirage.generator import split_rows
from mirage.optimizer import OptimizerOptions

TEMPERATURE = 0.7
SHAPES = ((8, 32000), (4, 128256))  # Llama 2's and Llama 3's vocabularies
SPLITS = (8, 16, 32)
THREADS = (128, 256, 512)
WHOLE_THREADS = (128, 512, 1024)


def reference(rows: int, cols: int, log_softmax: bool) -> mi.KernelGraph:
    """The subprogram as the frontend lowers it (LAX: no maximum)."""
    g = mi.new_kernel_graph("split_rows")
    x = g.mul_scalar(g.new_input((rows, cols), mi.float16, name="x"), 1 / TEMPERATURE)
    lse = g.log(g.reduction(g.exp(x), 1))
    g.mark_output(g.sub(x, lse) if log_softmax else lse)
    return g.freeze()


def split(rows: int, cols: int, log_softmax: bool, splits: int, threads: int) -> mi.KernelGraph:
    """The split-row µGraph that the frontend proposes (:func:`mirage.generator.split_rows.split_graph`)."""
    graph = reference(rows, cols, log_softmax)
    return split_rows.split_graph(graph, split_rows.match(graph), splits, threads)


def whole(rows: int, cols: int, log_softmax: bool, threads: int) -> mi.KernelGraph:
    g = mi.new_kernel_graph("split_rows")
    x = g.new_input((rows, cols), mi.float16, name="x")
    tb = mi.new_threadblock_graph(grid_dim=(rows, 1, 1), block_dim=(threads, 1, 1), forloop_range=1)
    x1 = tb.mul_scalar(tb.new_input(x, input_map=(0, -1, -1)), 1 / TEMPERATURE)
    m = tb.reduction_max(x1, 1)
    lse = tb.add(tb.log(tb.reduction(tb.exp(tb.sub(x1, m)), 1)), m)
    tb.new_output(tb.forloop_accum(tb.sub(x1, lse) if log_softmax else lse), output_map=(0, -1, -1))
    (out,) = g.customized([x], tb)
    g.mark_output(out)
    return g.freeze()


def builds(shapes=SHAPES) -> list[tuple[dict, mi.KernelGraph | str]]:
    """(what, µGraph) per build; in place of the µGraph, why it cannot be built (its tiles exceed
    shared memory: one block of Llama 3's 128,256 logits).  The split counts are :data:`SPLITS`
    that divide the row and the frontend's own (GPT-2's 29)."""
    from mirage.errors import MirageError

    out = []
    for rows, cols in shapes:
        for log_softmax in (True, False):
            case = {"rows": rows, "cols": cols, "op": "log_softmax" if log_softmax else "logsumexp"}
            shape = (rows, cols, log_softmax)
            counts = sorted({*(s for s in SPLITS if cols % s == 0), *split_rows.split_counts(cols, rows)})
            forms = [({**case, "form": "split", "splits": s, "threads": t}, split, (*shape, s, t))
                     for s in counts for t in THREADS]
            forms += [({**case, "form": "whole", "threads": t}, whole, (*shape, t)) for t in WHOLE_THREADS]
            for row, make, given in forms:
                try:
                    out.append((row, make(*given)))
                except MirageError as error:
                    out.append((row, f"build: {str(error).splitlines()[0]}"))
    return out


def main(argv=None) -> None:
    import torch

    from benchmarks.stream_floor import write_record
    from mirage.codegen.gpu_check import check_on_gpu
    from mirage.codegen.lower_program import generate_cuda_program
    from mirage.codegen.profile import device_facts, time_graph
    from mirage.codegen.runtime import build_many
    from mirage.errors import MirageError

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results", help="folder of the JSON record")
    parser.add_argument("--shapes", default=",".join(f"{r}x{c}" for r, c in SHAPES),
                        help="ROWSxCOLS,... (default: %(default)s)")
    parser.add_argument("--off", action="append", default=[], metavar="OPTION[,OPTION...]",
                        help="also build each split µGraph with these OptimizerOptions fields off")
    args = parser.parse_args(argv)
    known = {f.name for f in dataclasses.fields(OptimizerOptions)}
    for name in (n for names in args.off for n in names.split(",")):
        if name not in known:
            parser.error(f"--off {name}: no such OptimizerOptions field (known: {', '.join(sorted(known))})")
    try:
        shapes = [tuple(int(n) for n in shape.split("x")) for shape in args.shapes.split(",")]
    except ValueError:
        shapes = []
    if not shapes or any(len(shape) != 2 or min(shape) < 1 for shape in shapes):
        parser.error(f"--shapes takes ROWSxCOLS pairs such as 8x32000,4x128256, got {args.shapes!r}")
    rows, programs = [], []
    variants = [(row, graph, None) for row, graph in builds(shapes)]
    variants += [({**row, "off": names}, graph,
                  dataclasses.replace(OptimizerOptions(), **dict.fromkeys(names.split(","), False)))
                 for names in args.off for row, graph, _ in variants if row["form"] == "split"]
    for row, graph, options in variants:
        if isinstance(graph, str):
            rows.append({**row, "failure": graph})
            continue
        try:
            programs.append(generate_cuda_program(graph, None, options=options))
        except MirageError as error:
            rows.append({**row, "failure": f"generate: {str(error).splitlines()[0]}"})
            continue
        rows.append(row)
        row["graph"] = graph
    built = iter(build_many(programs))
    for row in rows:
        graph = row.pop("graph", None)
        if graph is None:
            continue
        program = next(built)
        if isinstance(program, Exception):
            row["failure"] = f"compile: {str(program).splitlines()[0]}"
            continue
        ref = reference(row["rows"], row["cols"], row["op"] == "log_softmax")
        x = torch.randn(row["rows"], row["cols"], device="cuda", dtype=torch.float16)
        program.load()
        row["us"] = time_graph(lambda p=program, i=[x]: p.launch(i), replays=100).median_us
        checks = [check_on_gpu(ref, program, inputs=[x * s]) for s in (1.0, 30.0)]
        row["passed"] = all(c.passed for c in checks)
        row["relative_error"] = max(c.worst_error for c in checks)
        print(row, flush=True)
    torch_us = {}
    for rows_, cols in shapes:
        x = torch.randn(rows_, cols, device="cuda", dtype=torch.float16)
        calls = {"log_softmax": lambda v=x: torch.log_softmax(v / TEMPERATURE, -1),
                 "logsumexp": lambda v=x: torch.logsumexp(v / TEMPERATURE, -1)}
        for op, fn in calls.items():
            torch_us[f"{rows_}x{cols}/{op}"] = time_graph(fn, replays=100).median_us
    best = {}
    for key in torch_us:
        shape, op = key.split("/")
        for form in ("split", "whole"):
            times = [r["us"] for r in rows if f"{r['rows']}x{r['cols']}" == shape and r["op"] == op
                     and r["form"] == form and r.get("passed") and "off" not in r]
            best[f"{key}/{form}"] = min(times) if times else None
        print(f"{key}: torch {torch_us[key]:.2f} µs, split {best[f'{key}/split']}, "
              f"whole {best[f'{key}/whole']}")
    write_record(args.out, "split_rows", device_facts(), rows, torch_us=torch_us, best=best)


if __name__ == "__main__":
    main()
