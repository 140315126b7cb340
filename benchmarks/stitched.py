"""Where a superoptimized program's time goes beyond its kernels: for each program of
``benchmarks.unseen``, the whole module (CUDA-graph replays), each subprogram alone on the inputs it
saw, the kernels of one graph replay (torch.profiler: copies and PyTorch ops between the generated
kernels show up by name), and the module again with every program's dependent launch and one block
per SM turned off.  Writes stitched_<date>.json into ``--out``.  Needs a GPU.

    python -m benchmarks.stitched --programs block,rotary_attention --time-limit 8
"""

from __future__ import annotations

import torch

import mirage as mi


def _time(fn, *inputs) -> float:
    from mirage.codegen.profile import time_graph

    with torch.no_grad():
        return time_graph(lambda: fn(*inputs), replays=100).median_us


def _programs(gm):
    """The compiled programs (mirage.codegen.runtime.Program) of the stitched module's subprograms."""
    for module in gm.children():
        for executor in getattr(module, "_executors", {}).values():
            owner = getattr(getattr(executor, "launch", None), "__self__", None)
            if owner is not None and hasattr(owner, "dependent_launch"):
                yield owner


def _replay_kernels(fn, inputs, replays: int = 10) -> list[dict]:
    """The GPU kernels and copies of ``replays`` replays of one captured call, by total time."""
    from mirage.codegen.profile import captured

    with torch.no_grad():
        graph, _ = captured(lambda: fn(*inputs))
        graph.replay()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(replays):
                graph.replay()
            torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    rows = [{"name": e.key, "calls_per_replay": e.count / replays,
             "us_per_call": e.device_time_total / e.count} for e in events]
    return sorted(rows, key=lambda r: -r["us_per_call"] * r["calls_per_replay"])


def profile(name: str, time_limit: float, split_rounds: int = 1) -> dict:
    from benchmarks.unseen import PROGRAMS
    from mirage.frontend.runtime import SubprogramModule

    cls, shapes = PROGRAMS[name]
    torch.manual_seed(0)
    model = cls().cuda().half().eval()
    inputs = tuple(torch.randn(s, device="cuda").half() for s in shapes)
    fast = mi.superoptimize(model, inputs, time_limit_s=time_limit, use_cache=False, progress=False,
                            whole_program_check=False, split_rounds=split_rounds)
    gm = fast.specializations[0].module
    row = {"program": name, "report": fast.report(), "eager_us": _time(model, *inputs),
           "stitched_us": _time(gm, *inputs)}
    seen: dict[str, tuple] = {}
    hooks = [m.register_forward_hook(lambda module, args, out, n=n: (seen.setdefault(n, args), None)[1])
             for n, m in gm.named_children() if isinstance(m, SubprogramModule)]
    with torch.no_grad():
        gm(*inputs)
    for hook in hooks:
        hook.remove()
    row["alone_us"] = {n: _time(getattr(gm, n), *args) for n, args in seen.items()}
    row["replay_kernels"] = _replay_kernels(gm, inputs)
    for attribute in ("dependent_launch", "spread_blocks"):
        for program in _programs(gm):
            setattr(program, attribute, False)
            program._packed.clear()
        row[f"stitched_us_without_{attribute}"] = _time(gm, *inputs)
    return row


def main(argv=None) -> None:
    from benchmarks.stream_floor import program_arguments

    args = program_arguments(__doc__, argv, programs="block", time_limit=8.0)  # programs of benchmarks.unseen
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.stitched times on a GPU; none is visible")
    from benchmarks.stream_floor import write_record
    from mirage.codegen.profile import device_facts

    rows = []
    for name in sorted(args.wanted):
        rows.append(profile(name, args.time_limit, args.split_rounds))
        print({k: v for k, v in rows[-1].items() if k not in ("report", "replay_kernels")}, flush=True)
        write_record(args.out, "stitched", device_facts(), rows)


if __name__ == "__main__":
    main()
