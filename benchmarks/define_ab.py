"""The suite's picks built twice, with a define of the device library or optimizer options and without,
timed in turn and compared bit for bit: what a change behind the define or option does to every case,
in one run.

    python -m benchmarks.define_ab --define MIRAGE_ASSUME_THREAD_INDEX=0 \\
        [--suite benchmarks/results/suite_2026-11-26.json] [--cases gqa_b1,lora_m16] [--out DIR]
    python -m benchmarks.define_ab --options producer_warp=true --cases gqa_b8

Each case's pick is the selection's winner of the suite record (its µGraph found in the case's family
by grids and for-loop ranges, built as the record says: pipeline depth, forms, launch modes).  Both
builds run on the same inputs: ``rounds`` rounds of CUDA-graph timings (``time_graph``), the two
builds in turn, medians reported; their outputs must be equal bit for bit (a define that changes only
index arithmetic must not change a value).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

from benchmarks.stream_floor import write_record


def pick(case: str, best: dict):
    """``case``'s member that is the record's winner ``best``: the µGraph of its content hash, else
    (a family changed since) the first of its grids and for-loop ranges."""
    from benchmarks.variants import family

    digest, alike = best["variant"].split("/")[0], None
    for wide in (False, True):
        for _, graph in family(case, wide=wide):
            if graph.content_hash().startswith(digest):
                return graph
            blocks = graph.block_graphs()
            if alike is None and ([list(b.grid_dim) for b in blocks] == [list(g) for g in best["grids"]]
                                  and [b.forloop_range for b in blocks] == best["forloop_ranges"]):
                alike = graph
    if alike is None:
        raise LookupError(f"{case}: no member of its family has the grids {best['grids']}")
    return alike


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--define", default="", help="NAME=VALUE put before the code of the B builds")
    parser.add_argument("--options", default="",
                        help="OptimizerOptions of the B builds over the pick's, e.g. producer_warp=true")
    parser.add_argument("--suite", default="benchmarks/results/suite_2026-11-26.json")
    parser.add_argument("--cases", default="", help="only these cases (comma-separated)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    if not (args.define or args.options):
        parser.error("give --define, --options or both: what the B builds change")
    import torch

    from benchmarks.explore import _options
    from mirage.codegen.gpu_check import random_inputs
    from mirage.codegen.lower_program import generate_cuda_program
    from mirage.codegen.profile import device_facts, time_graph
    from mirage.codegen.runtime import BuildChoice, build_many

    name, _, value = args.define.partition("=")
    prefix = f"#define {name} {value or 1}\n" if name else ""
    overrides = _options(args.options)
    change = " ".join(filter(None, (args.define, args.options)))
    wanted = set(filter(None, args.cases.split(",")))
    cases = [c for c in json.loads(Path(args.suite).read_text())["cases"]
             if c.get("selection", {}).get("best") and (not wanted or c["case"] in wanted)]
    rows, programs = [], []
    for record in cases:
        best = record["selection"]["best"]
        graph = pick(record["case"], best)
        choice = BuildChoice.from_dict(best)
        program = generate_cuda_program(graph, None, options=choice.options())
        changed = generate_cuda_program(graph, None,
                                        options=dataclasses.replace(choice.options(), **overrides))
        programs += [program, dataclasses.replace(changed, code=prefix + changed.code)]  # A, then B
        rows.append({"case": record["case"], "variant": best["variant"], "graph": graph, "choice": choice})
    built = build_many(programs)
    for k, row in enumerate(rows):
        graph, choice = row.pop("graph"), row.pop("choice")
        pair = built[2 * k: 2 * k + 2]
        failed = [str(p).splitlines()[0] for p in pair if isinstance(p, Exception)]
        if failed:
            row["failure"] = failed
            print(row, flush=True)
            continue
        a, b = (dataclasses.replace(p, dependent_launch=choice.dependent_launch,
                                    spread_blocks=choice.spread_blocks) for p in pair)
        for p in (a, b):
            p.load()
        inputs = random_inputs(graph, seed=0)
        outputs = [p.launch(inputs) for p in (a, b)]
        torch.cuda.synchronize()
        row["identical"] = all(torch.equal(x, y) for x, y in zip(*outputs, strict=True))
        times = {"A": [], "B": []}
        for _ in range(args.rounds):
            for label, p in (("A", a), ("B", b)):
                times[label].append(time_graph(lambda p=p, x=inputs: p.launch(x), replays=100).median_us)
        row["a_us"], row["b_us"] = (statistics.median(times[label]) for label in ("A", "B"))
        row["timings"] = times
        print(f"{row['case']:12s} A {row['a_us']:7.2f}  B ({change}) {row['b_us']:7.2f} µs  "
              f"identical={row['identical']}", flush=True)
    write_record(args.out, "define_ab", {**device_facts(), "define": args.define, "options": args.options},
                 rows)
    return 0 if all(r.get("identical") for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
