"""What a call of a superoptimized module costs on the host: calls timed one after another without a
CUDA graph (as a user's loop runs them), against eager PyTorch and against the same calls captured
in a CUDA graph (the device time alone), and where the host time goes (cProfile, top functions).

    python -m benchmarks.host_overhead [--out benchmarks/results] [--profile 30] [--breakdown]

Programs: the demo's RMSNorm + Linear (float16 on the GPU) and the suite's gqa_b1 through
``mi.superoptimize`` with the first members of its family as candidates (no search; the host time
does not depend on which member runs); each with and without ``cuda_graphs`` (calls replayed from a
CUDA graph of the module's own).  ``--breakdown`` also times, one by one, the steps of a call
of gqa_b1 (each step alone in a loop: the module, its stitched graph, the program's launch, each
kernel's launch, an output's allocation, the stream and device look-ups, the driver's launch itself).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import tempfile
from functools import partial

import torch

import mirage as mi


def host_us(fn, calls: int = 300) -> float:
    """Host time of one call of ``fn`` (µs): see :func:`mirage.codegen.profile.host_times`."""
    from mirage.codegen.profile import host_times

    return host_times({"fn": fn}, calls)["fn"]


def profile(fn, calls: int, top: int) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    return _relative_paths(text.getvalue())


def _relative_paths(text: str) -> str:
    """The profile's file names relative to the checkout and to site-packages (records name no
    machine's folders)."""
    import site
    from pathlib import Path

    prefixes = [str(Path(mi.__file__).resolve().parents[1]), *site.getsitepackages(),
                site.getusersitepackages()]
    for prefix in sorted(prefixes, key=len, reverse=True):
        text = text.replace(prefix.rstrip("/") + "/", "")
    return text


def breakdown(fast, inputs) -> dict[str, float]:
    """The host time of each step of a call of ``fast`` on ``inputs``, timed alone (µs)."""
    import cupy

    from mirage.frontend.runtime import SubprogramModule

    step_us = partial(host_us, calls=2000)  # rounds synchronized at their ends only
    spec = fast.specializations[-1]
    device = inputs[0].device
    steps: dict[str, float] = {"module call": step_us(lambda: fast(*inputs)),
                               "stitched graph (flat)": step_us(lambda: spec.run_flat(inputs))}
    subprograms = [m for m in spec.module.modules() if isinstance(m, SubprogramModule)]
    for m in subprograms:
        executor = m.executor(device)
        program = executor.launch.__self__
        sub_inputs = [b.apply(inputs[m._position[b.source]]) for b in m.subprogram.inputs]
        steps[f"{m.subprogram.name}: module"] = step_us(lambda m=m: m(*inputs))
        steps[f"{m.subprogram.name}: forward"] = step_us(lambda m=m: m.forward(*inputs))
        steps[f"{m.subprogram.name}: input bindings"] = step_us(
            lambda m=m: [b.apply(inputs[m._position[b.source]]) for b in m.subprogram.inputs])
        steps[f"{m.subprogram.name}: executor"] = step_us(lambda e=executor, xs=sub_inputs: e(xs))
        steps[f"{m.subprogram.name}: program.launch"] = step_us(lambda p=program, xs=sub_inputs: p.launch(xs))
        values = dict(zip((r for k, r, _ in program._steps()[1] if k == "input"), sub_inputs, strict=False))
        for kind, ref, launch in program._steps()[1]:
            if kind != "kernel":
                continue
            outs = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype, *_ in ref]
            args = [values.get(r) for r in launch.inputs]
            if any(a is None for a in args):  # reads another kernel's output: allocate a stand-in
                args = [a if a is not None else torch.empty(
                    program.graph.type_of(r).shape, dtype=program.graph.type_of(r).dtype.torch(),
                    device=device) for a, r in zip(args, launch.inputs, strict=True)]
            values.update(zip(launch.outputs, outs, strict=True))
            name = f"{launch.name} ({len(launch.tensor_maps)} tensor maps)"
            steps[f"{name}: Program._launch"] = step_us(partial(program._launch, launch, outs, args))
            steps[f"{name}: torch.empty of its outputs"] = step_us(
                lambda ref=ref: [torch.empty(s, dtype=d, device=device) for s, d, *_ in ref])
            pointers = [t.data_ptr() for t in outs + args]
            maps = []
            if launch.tensor_maps:
                from mirage.codegen import tensor_maps

                maps = [tensor_maps.encode(args[t.input], t) for t in launch.tensor_maps]
                steps[f"{name}: tensor_maps.encode (cached)"] = step_us(
                    partial(lambda a, specs: [tensor_maps.encode(a[t.input], t) for t in specs], args,
                            launch.tensor_maps))
            stream = torch.cuda.current_stream(device).cuda_stream
            packed = program._packed.get((device.index, launch.name))
            if packed:
                steps[f"{name}: PackedLaunch"] = step_us(partial(packed, stream, pointers, maps))
                steps[f"{name}: cuLaunchKernelEx alone"] = step_us(partial(
                    packed._driver.cuLaunchKernelEx, packed._config, packed._handle, packed._arguments, 0))
    steps["torch.cuda.current_stream(device).cuda_stream"] = step_us(
        lambda: torch.cuda.current_stream(device).cuda_stream)
    steps["torch._C._cuda_getCurrentRawStream(index)"] = step_us(
        lambda: torch._C._cuda_getCurrentRawStream(device.index))
    steps["torch.cuda.current_device()"] = step_us(torch.cuda.current_device)

    def enter_device():  # what entering and leaving the context costs, with nothing inside
        with cupy.cuda.Device(device.index):
            pass

    steps["with cupy.cuda.Device(index)"] = step_us(enter_device)

    def no_grad():  # likewise
        with torch.no_grad():
            pass

    steps["with torch.no_grad()"] = step_us(no_grad)
    return steps


def programs():
    from benchmarks.suite import WORKLOADS
    from benchmarks.variants import variants
    from mirage.frontend.examples import rmsnorm_linear

    module, inputs = rmsnorm_linear(1)
    module = module.cuda().half().eval()
    inputs = tuple(x.cuda().half() for x in inputs)
    yield "rmsnorm_linear", module, inputs, dict(time_limit_s=10.0)
    workload = next(w for w in WORKLOADS if w.name == "gqa_b1")
    yield "gqa_b1", workload.function, tuple(workload.inputs()), dict(search=False,
                                                                         candidates=variants("gqa_b1")[:3])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="folder of the JSON record")
    parser.add_argument("--profile", type=int, default=25, help="functions listed per profile")
    parser.add_argument("--breakdown", action="store_true", help="time each step of a gqa_b1 call alone")
    args = parser.parse_args(argv)
    from benchmarks.stream_floor import print_times, write_record
    from mirage.codegen.profile import device_facts, host_times, time_graph

    rows = []
    cache = tempfile.TemporaryDirectory()  # the second superoptimize (cuda_graphs) is answered from it
    for name, program, inputs, options in programs():
        fast, graphed = (mi.superoptimize(program, inputs, cache_dir=cache.name, progress=False,
                                          cuda_graphs=graphs, **options) for graphs in (False, True))
        with torch.no_grad():
            eager = lambda program=program, xs=inputs: program(*xs)  # noqa: E731
            ours = lambda fast=fast, xs=inputs: fast(*xs)  # noqa: E731
            replayed = lambda fast=graphed, xs=inputs: fast(*xs)  # noqa: E731
            torch.testing.assert_close(replayed(), eager(), rtol=2e-2, atol=2e-2)
            host = host_times({"eager": eager, "mirage": ours, "mirage_cuda_graphs": replayed}, rounds=9)
            row = {"program": name, "eager_host_us": host["eager"], "mirage_host_us": host["mirage"],
                   "mirage_cuda_graphs_host_us": host["mirage_cuda_graphs"],
                   "eager_graph_us": time_graph(eager).median_us,
                   "mirage_graph_us": time_graph(ours).median_us}
            print(row, flush=True)
            row["profile"] = profile(ours, 200, args.profile)
            print(row["profile"], flush=True)
            if args.breakdown and name == "gqa_b1":
                row["breakdown_us"] = breakdown(fast, inputs)
                print_times(row["breakdown_us"])
        rows.append(row)
    if args.out:
        write_record(args.out, "host_overhead", device_facts(), rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
