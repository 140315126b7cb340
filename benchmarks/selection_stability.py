"""How steady profile-guided selection is: the same selection run several times in one process, with
and without its final round (taken in turn), then every distinct pick timed again, in turn, to see
what each pick costs against the best of them.

    python -m benchmarks.selection_stability [--cases ntrans_b1,lora_m16,gqa_b1] [--repeats 5] [--out DIR]

Writes ``selection_stability_<date>.json`` into ``--out``: per case, the picks of each kind of
selection (build, launch mode, its selection time), every pick's time re-measured, how many distinct
builds each kind picked and how much slower than the best pick each kind's picks are on average.
"""

from __future__ import annotations

import argparse
import logging
import statistics


def pick_key(selection) -> str:
    from mirage.codegen.select import LAUNCH_MODES

    best = selection.best
    launch = (best.dependent_launch, best.spread_blocks)
    mode = next(n for n, overlap, spread in LAUNCH_MODES if (overlap, spread) == launch)
    return f"{best.variant.label} {mode}"


def stability(case: str, repeats: int, retime_rounds: int = 5) -> dict:
    from benchmarks.mugraphs import CASES
    from benchmarks.run import SELECT_STAGES
    from benchmarks.variants import variants
    from mirage.codegen.gpu_check import random_inputs
    from mirage.codegen.profile import time_graph
    from mirage.codegen.select import FINAL_ROUNDS, select_fastest

    reference = CASES[case].reference()
    candidates = variants(case)
    inputs = random_inputs(reference, seed=0)
    picks: dict[int, list] = {0: [], FINAL_ROUNDS: []}
    programs: dict[str, object] = {}
    for _ in range(repeats):
        for rounds in picks:  # the two kinds in turn, so that a drift of the GPU weighs on both
            selection = select_fastest(reference, candidates, inputs, stages=SELECT_STAGES,
                                       final_rounds=rounds)
            key = pick_key(selection)
            picks[rounds].append((key, selection.best.median_us))
            programs[key] = selection.program
    times: dict[str, list[float]] = {key: [] for key in programs}
    for _ in range(retime_rounds):
        for key, program in programs.items():
            times[key].append(time_graph(lambda p=program: p.launch(inputs)).median_us)
    retimed = {key: statistics.median(t) for key, t in times.items()}
    best = min(retimed.values())
    return {
        "case": case, "candidates": len(candidates), "repeats": repeats,
        "picks": {str(r): [{"build": k, "selection_us": us} for k, us in p] for r, p in picks.items()},
        "retimed_us": retimed,
        "distinct": {str(r): len({k for k, _ in p}) for r, p in picks.items()},
        "mean_excess_us": {str(r): statistics.mean(retimed[k] - best for k, _ in p)
                           for r, p in picks.items()},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="ntrans_b1,lora_m16,gqa_b1")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None, help="folder of the JSON record")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from benchmarks.stream_floor import print_times, write_record
    from mirage.codegen.profile import device_facts

    rows = []
    for case in args.cases.split(","):
        row = stability(case, args.repeats)
        print(f"{case}: distinct picks {row['distinct']}, mean excess over the best pick (µs) "
              f"{ {k: round(v, 3) for k, v in row['mean_excess_us'].items()} }", flush=True)
        print_times(row["retimed_us"], by_time=True)
        rows.append(row)
    if args.out:
        write_record(args.out, "selection_stability", device_facts(), rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
