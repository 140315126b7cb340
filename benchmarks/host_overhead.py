"""What a call of a superoptimized module costs on the host: calls timed one after another without a
CUDA graph (as a user's loop runs them), against eager PyTorch and against the same calls captured
in a CUDA graph (the device time alone), and where the host time goes (cProfile, top functions).

    python -m benchmarks.host_overhead [--out benchmarks/results] [--profile 30]

Programs: the demo's RMSNorm + Linear (float16 on the GPU) and the suite's gqa_b1 through
``mi.superoptimize`` with the first members of its family as candidates (no search; the host time
does not depend on which member runs).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch

import mirage as mi


def host_us(fn, calls: int = 300) -> float:
    """Median over 5 rounds of the wall time per call of ``calls`` back-to-back calls, synchronized
    once at the end of each round (the host's issue rate when it is the bottleneck)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        rounds.append((time.perf_counter() - start) / calls * 1e6)
    return sorted(rounds)[2]


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
    args = parser.parse_args(argv)
    from mirage.codegen.profile import device_facts, time_graph

    rows = []
    for name, program, inputs, options in programs():
        fast = mi.superoptimize(program, inputs, use_cache=False, progress=False, **options)
        with torch.no_grad():
            eager = lambda program=program, xs=inputs: program(*xs)  # noqa: E731
            ours = lambda fast=fast, xs=inputs: fast(*xs)  # noqa: E731
            row = {"program": name, "eager_host_us": host_us(eager), "mirage_host_us": host_us(ours),
                   "eager_graph_us": time_graph(eager).median_us,
                   "mirage_graph_us": time_graph(ours).median_us}
            print(row, flush=True)
            row["profile"] = profile(ours, 200, args.profile)
            print(row["profile"], flush=True)
        rows.append(row)
    if args.out:
        from benchmarks.stream_floor import write_record

        write_record(args.out, "host_overhead", device_facts(), rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
