"""Where the generated GEMV's time goes: the same generated kernel, built as it is and with parts of
its for-loop taken out, timed in one run (timing only: the cut builds compute nothing useful).

* ``as_generated``: the kernel the family builds;
* ``no_x``: X's copies removed (its tiles hold whatever shared memory held): what X's 128 re-reads
  cost at b = 8;
* ``no_compute``: the matmul (and the norm's row sums) removed: a pipelined copy of the same tiles
  with the same barriers;
* ``no_barrier``: the barrier at the end of each iteration removed;
* ``copy_only``: both removed;
* ``l2_256``, ``l2_none``: nothing removed, the copies ask L2 for 256-byte prefetches instead of
  128, or for none (``MIRAGE_CP_ASYNC_L2_BYTES``); ``evict_first``: no prefetch hint, and every copied
  line marked first to leave L2 (``MIRAGE_CP_ASYNC_EVICT_FIRST``);
* ``bulk_w``: W copied by the TMA unit, one bulk copy a tile row (``MulticastIterator`` with
  clusters of one block), which must match ``as_generated`` bit for bit;
* ``multicast2``: the kernel built with X read once per cluster of 2 blocks
  (``OptimizerOptions.multicast_cluster``), which must match ``as_generated`` bit for bit.

Also names the kernels that cuBLAS (``torch.mm``) and torch.compile run for rmsnorm's shapes.
Prints a line per build and writes gemv_isolate_<date>.json into ``--out``."""

from __future__ import annotations

import argparse
import dataclasses
import re

import torch

import mirage as mi
from benchmarks.mugraphs import mlp
from benchmarks.rms_forms import gemv
from benchmarks.stream_floor import write_record
from mirage.codegen.lower_program import generate_cuda_program
from mirage.codegen.profile import device_facts, time_graph
from mirage.codegen.runtime import build_many
from mirage.optimizer import OptimizerOptions

# what each cut removes from the generated loop (regular expressions over whole statements; those
# marked "?" may match nothing: the plain GEMV has no row sums)
CUTS = {
    "as_generated": (),
    "no_x": (r"in0\.load\([^;]*\);",),
    "no_compute": (r"mm\d+::accumulate\w*\([^;]*\);", r"?row_sums\d+\.add\([^;]*\);"),
    "no_barrier": (r"__syncthreads\(\);  // end of iteration",),
    "copy_only": (r"mm\d+::accumulate\w*\([^;]*\);", r"?row_sums\d+\.add\([^;]*\);",
                  r"__syncthreads\(\);  // end of iteration"),
    "l2_256": (),
    "l2_none": (),
    "evict_first": (),
}
DEFINES = {"l2_256": "#define MIRAGE_CP_ASYNC_L2_BYTES 256\n",
           "l2_none": "#define MIRAGE_CP_ASYNC_L2_BYTES 0\n",
           "evict_first": "#define MIRAGE_CP_ASYNC_L2_BYTES 0\n#define MIRAGE_CP_ASYNC_EVICT_FIRST 1\n"}


def cut(code: str, patterns: tuple[str, ...]) -> str:
    for pattern in patterns:
        optional = pattern.startswith("?")
        code, count = re.subn(pattern.removeprefix("?"), "", code)
        if not count and not optional:
            raise ValueError(f"{pattern!r} matches nothing in the generated kernel")
    return code


def bulk_weights(program) -> str:
    """``program``'s code with W (the input split along grid x) copied by the TMA unit, one bulk copy a
    tile row counted on a transaction barrier per stage, instead of 16-byte cp.async by every thread."""
    code = "#include <mirage/multicast.cuh>\n" + program.code
    (launch,) = program.kernels
    name = re.search(r"InputIterator<[^;]*?> (in\d+)\([^;]*?DimMap\{3, -1, -1\}", code, flags=re.S).group(1)
    barriers = (launch.smem_bytes + 15) // 16 * 16
    declaration = rf"InputIterator<(__half, mirage::dev::Layout<[^>]*>), (\d+), kThreads> {name}\(([^;]*?)\);"
    code = re.sub(declaration, rf"MulticastIterator<\1, \2, kThreads, 1> {name}(\3, "
                  rf"mirage::dev::shared_at<uint64_t>(shared, {barriers}));", code, flags=re.S)
    code = code.replace("mirage::dev::wait_for_prerequisite_grids();",
                        f"{name}.init(); __syncthreads(); mirage::dev::wait_for_prerequisite_grids();")
    code = re.sub(r"(mirage::dev::Pipeline<\d+>::wait\(\);)", rf"\1 {name}.wait(iteration);", code)
    return code, barriers + 256


def _bulk(program):
    """``program`` with :func:`bulk_weights`, its launch asking for the barriers' bytes too."""
    code, smem = bulk_weights(program)
    return dataclasses.replace(program, code=code,
                               kernels=(dataclasses.replace(program.kernels[0], smem_bytes=smem),))


def _with(program, name: str) -> str:
    """The code of ``program`` as the cut ``name`` makes it."""
    return DEFINES.get(name, "") + cut(program.code, CUTS[name])


def kernel_names(fn, *args) -> list[str]:
    """The CUDA kernels one call of ``fn(*args)`` runs (after a warm-up call)."""
    fn(*args)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results", help="folder of the JSON record")
    args = parser.parse_args(argv)
    facts = device_facts()
    rows = []
    for b in (1, 8):
        x, g, w = (torch.randn(s, device="cuda").half() for s in mlp.rmsnorm_shapes(b))
        rows.append({"b": b, "what": "torch.mm kernels", "names": kernel_names(torch.mm, x, w)})

        def rms(x, g, w):
            return ((x / torch.sqrt((x.float() ** 2).mean(-1, keepdim=True) + 1e-6).half()) * g) @ w
        compiled = torch.compile(rms, mode="max-autotune-no-cudagraphs")
        rows.append({"b": b, "what": "torch.compile kernels", "names": kernel_names(compiled, x, g, w)})
        print(rows[-2], rows[-1], flush=True)
    builds, programs = [], []
    for b in (1, 8):
        for form in ("gemv", "rmsnorm"):
            for iters, threads, stages in ((16, 512, 2), (16, 512, 3), (8, 512, 3)):
                graph = (gemv(b, 128, iters, threads) if form == "gemv"
                         else mlp.rmsnorm_fused(b, grid=128, iters=iters, threads=threads))
                try:
                    program = generate_cuda_program(graph, None, options=dataclasses.replace(
                        OptimizerOptions(), stages=stages))
                except mi.MirageError as error:  # a member that does not fit in shared memory
                    print("skipped", b, form, iters, threads, stages, error)
                    continue
                variants = {name: dataclasses.replace(program, code=_with(program, name)) for name in CUTS}
                variants["bulk_w"] = _bulk(program)
                try:  # X's ring has a slot more: it may not fit where the plain build does
                    variants["multicast2"] = generate_cuda_program(graph, None, options=dataclasses.replace(
                        OptimizerOptions(), stages=stages, multicast_cluster=2))
                    variants["bulk_w_multicast2"] = _bulk(variants["multicast2"])
                except mi.MirageError as error:
                    print("skipped multicast", b, form, iters, threads, stages, error)
                for name, variant in variants.items():
                    programs.append(variant)
                    builds.append({"b": b, "form": form, "iters": iters, "threads": threads, "stages": stages,
                                   "cut": name})
    inputs = {b: [torch.randn(s, device="cuda").half() for s in mlp.rmsnorm_shapes(b)] for b in (1, 8)}
    reference = {}  # the as-generated build's output, which the multicast builds must match
    for row, program in zip(builds, build_many(programs), strict=True):
        x = inputs[row["b"]]
        program.load()
        key = (row["b"], row["form"], row["iters"], row["threads"], row["stages"])
        if row["cut"] == "as_generated" or "multicast" in row["cut"] or "bulk" in row["cut"]:
            (out,) = program.launch(x)
            torch.cuda.synchronize()
            reference.setdefault(key, out.float())
            row["max_abs_diff"] = float((out.float() - reference[key]).abs().max())
        row["us"] = time_graph(lambda p=program, x=x: p.launch(x), replays=100).median_us
        rows.append(row)
        print(row, flush=True)
    write_record(args.out, "gemv_isolate", facts, rows)


if __name__ == "__main__":
    try:
        main()
    except mi.MirageError as error:
        raise SystemExit(str(error)) from error
