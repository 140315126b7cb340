"""Cluster folds against two kernels, with the GPU's cluster occupancy: for a few attention members,
how many clusters the folded kernel has against how many the GPU runs at once
(``cuOccupancyMaxActiveClusters``), end-to-end times in the four launch modes (dependent or plain
launch, with or without one block per SM) and each kernel's device time.  Writes
fold_occupancy_<date>.json into ``--out`` (default benchmarks/results)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

from benchmarks.mugraphs import CASES
from benchmarks.variants import family
from mirage.codegen import dependent_launch
from mirage.codegen.gpu_check import random_inputs
from mirage.codegen.lower_program import generate_cuda_program
from mirage.codegen.profile import device_facts, kernel_times, time_graph
from mirage.codegen.runtime import build_many
from mirage.optimizer import OptimizerOptions

MEMBERS = [  # (case, splits): each member's cluster-fold twin (benchmarks.variants FOLD_ROWS)
    ("gqa_b1", "kv_splits=16,q_splits=4,iters=2,threads=128,"),
    ("gqa_b1", "kv_splits=8,q_splits=4,iters=4,threads=128,"),
    ("gqa_b8", "kv_splits=8,q_splits=2,iters=8,threads=128,"),
    ("gqa_b8", "kv_splits=4,q_splits=4,iters=8,threads=128,"),
]


def measure(case: str, splits: str, replays: int) -> dict:
    label, graph = next((v.label, g) for v, g in family(case, fold=True)
                        if v.label.startswith(splits) and "combine_threads" in v.label)
    inputs = random_inputs(CASES[case].reference(), seed=0)
    folded = generate_cuda_program(graph, None, options=OptimizerOptions(cluster_folds=True))
    two = generate_cuda_program(graph, None)
    programs = dict(zip(("fold", "two"), build_many([folded, two]), strict=True))
    (launch,) = [k for k in folded.kernels if k.consumer >= 0]
    row = {"case": case, "label": label, "cluster": launch.cluster, "smem_bytes": launch.smem_bytes,
           "clusters": math.prod(launch.grid) // launch.cluster_size}
    for name, program in programs.items():
        program.load()
        if name == "fold":
            function = program._function(launch).kernel.ptr
            row["max_active_clusters"] = dependent_launch.max_active_clusters(
                function, launch.grid, launch.block, launch.smem_bytes, launch.cluster)
        for dependent, spread in ((True, False), (False, False), (True, True), (False, True)):
            mode = dataclasses.replace(program, dependent_launch=dependent, spread_blocks=spread)
            key = f"{name}_{'dependent' if dependent else 'plain'}{'_spread' if spread else ''}_us"
            row[key] = time_graph(lambda p=mode: p.launch(inputs), replays=replays).median_us
        row[f"{name}_kernel_us"] = kernel_times(lambda p=program: p.launch(inputs))
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--replays", type=int, default=100)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    facts = device_facts()
    rows = []
    for case, splits in MEMBERS:
        rows.append(measure(case, splits, args.replays))
        print(json.dumps(rows[-1]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"facts": facts, "rows": rows}
    (out / f"fold_occupancy_{facts['date']}.json").write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
