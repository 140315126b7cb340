"""What the PyTorch path chooses for suite cases now, without timing the suite: ``mi.superoptimize`` on
each case's program with its family as candidates (as ``benchmarks.run --ours both`` calls it) and a
short search, printing each subprogram's source and the selection's line, so that a change of what
competes there (a generated µGraph joining the family) shows whether it moves the pick.

    python -m benchmarks.torch_path_choices --cases ntrans_b1,ntrans_b8 --time-limit 5
"""

from __future__ import annotations

import argparse

import torch

import mirage as mi
from benchmarks.suite import WORKLOADS
from benchmarks.variants import variants


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", required=True, help="comma-separated suite case names")
    parser.add_argument("--time-limit", type=float, default=5.0, help="seconds of search a subprogram")
    args = parser.parse_args(argv)
    wanted = args.cases.split(",")
    unknown = sorted(set(wanted) - {w.name for w in WORKLOADS})
    if unknown:
        parser.error(f"unknown case(s): {', '.join(unknown)}")
    for workload in (w for w in WORKLOADS if w.name in wanted):
        device = "cuda" if torch.cuda.is_available() else "cpu"  # on a CPU: the choice without timings
        module = mi.superoptimize(workload.function, workload.inputs(device),
                                  candidates=variants(workload.name), time_limit_s=args.time_limit,
                                  use_cache=False, progress=False)
        for spec in module.specializations:
            for name, choice in spec.choices.items():
                print(f"{workload.name} {name}: {choice.source}: {choice.detail}", flush=True)


if __name__ == "__main__":
    main()
