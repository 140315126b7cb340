"""GPU timing as BENCHMARKS.md prescribes: CUDA-graph replays timed with CUDA events, medians.

``time_graph(fn)`` captures ``calls`` back-to-back calls of ``fn`` in one CUDA graph, replays it
``replays`` times, each between two events, and returns the median time of one call in µs.  Warm-up
(compilation, autotuning, allocator growth) happens before the capture.

``host_times(fns)`` measures the other side: what a call costs the CPU when calls are issued one after
another without a graph (a user's loop), for several functions with their rounds taken in turn.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Timing:
    median_us: float
    p10_us: float
    p90_us: float
    replays: int
    calls_per_replay: int

    def as_dict(self) -> dict:
        return {
            "median_us": self.median_us,
            "p10_us": self.p10_us,
            "p90_us": self.p90_us,
            "replays": self.replays,
            "calls_per_replay": self.calls_per_replay,
        }


@contextlib.contextmanager
def graph_capture(graph, **options) -> Iterator[None]:
    """``torch.cuda.graph(graph, **options)`` that leaves the process usable when the capture fails
    (a host synchronization or a CPU tensor inside it): torch's CUDA random-number state then still
    believes a capture runs, and every later random op on the device raises "Offset increment outside
    graph capture". An empty capture that ends sets it right (measured on torch 2.11)."""
    import torch

    device = torch.cuda.current_device()
    try:
        with torch.cuda.graph(graph, **options):
            yield
    except BaseException:
        _end_failed_capture(device)
        raise


def _end_failed_capture(device: int) -> None:
    """After a failed capture on ``device``: an empty capture, whose end resets torch's random state.
    Should that fail too, a warning says so (the capture's own error is the one raised)."""
    import torch

    try:
        with torch.cuda.device(device), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch's notice that the graph is empty
            empty = torch.cuda.CUDAGraph()
            with torch.cuda.graph(empty):
                pass  # nothing to capture: ending the capture is the repair
    except Exception as error:  # noqa: BLE001 - reported, and the capture's failure is raised after
        logger.warning("mirage: a CUDA-graph capture failed, and resetting torch's random state after it "
                       "failed too (%s: %s); random ops on GPU %d may raise until the process restarts",
                       type(error).__name__, error, device)


def captured(fn: Callable[[], object], calls: int = 1, warmup: int = 1, **options) -> tuple[Any, object]:
    """A CUDA graph of ``calls`` calls of ``fn``, after ``warmup`` calls on a side stream (what a
    capture needs), and what the last captured call returned (rewritten by every replay);
    ``options`` go to ``torch.cuda.graph`` (``capture_error_mode``)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with graph_capture(graph, **options):
        for _ in range(calls - 1):
            fn()  # each result freed at once, so that the next call may reuse its memory
        out = fn()
    return graph, out


def time_graph(fn: Callable[[], object], calls: int = 10, replays: int = 200, warmup: int = 3) -> Timing:
    import torch

    graph, _ = captured(fn, calls, warmup)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    for start, end in zip(starts, ends, strict=True):
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    per_call = sorted(s.elapsed_time(e) * 1000.0 / calls for s, e in zip(starts, ends, strict=True))
    q = statistics.quantiles(per_call, n=10)
    return Timing(statistics.median(per_call), q[0], q[-1], replays, calls)


def host_times(fns: Mapping[str, Callable[[], object]], calls: int = 300, rounds: int = 5,
               synchronize: Callable[[], object] | None = None) -> dict[str, float]:
    """Host time of one call of each of ``fns`` (µs): the median over ``rounds`` rounds of the wall time
    of ``calls`` back-to-back calls, synchronized once at the end of each round (the host's issue rate
    when it is the bottleneck).  The functions' rounds are taken in turn, so that a host whose speed
    drifts during the run (shared machines do) weighs on each alike.  ``synchronize``: waits for the
    GPU (default: ``torch.cuda.synchronize``)."""
    if synchronize is None:
        import torch

        synchronize = torch.cuda.synchronize
    for fn in fns.values():
        for _ in range(5):
            fn()
    synchronize()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            synchronize()
            times[name].append((time.perf_counter() - start) / calls * 1e6)
    return {name: statistics.median(t) for name, t in times.items()}


def kernel_times(fn: Callable[[], object], calls: int = 50, warmup: int = 3) -> dict[str, float]:
    """Mean device time per call of every kernel ``fn`` launches (µs), from the profiler's CUDA
    activity: where a multi-kernel program spends its time (the sum leaves out launch gaps)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    totals: dict[str, float] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] = totals.get(event.name, 0.0) + event.device_time
    return {name: total / calls for name, total in totals.items()}


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    import torch

    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    timing = time_graph(lambda: dst.copy_(src), calls=2, replays=30)
    return 2 * src.numel() / (timing.median_us * 1e-6)


def launch_floor() -> float:
    """The time of one tiny kernel per call, timed like everything else (µs)."""
    import torch

    x = torch.zeros(1, device="cuda")
    return time_graph(lambda: x.add_(1.0)).median_us


def device_facts() -> dict:
    import datetime
    import subprocess

    import torch

    props = torch.cuda.get_device_properties(0)
    try:
        driver = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        driver = "unknown"
    return {
        "device": props.name,
        "sm_count": props.multi_processor_count,
        "compute_capability": f"{props.major}.{props.minor}",
        "driver": driver,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": datetime.date.today().isoformat(),
    }
