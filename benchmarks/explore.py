"""Explore a case's family on the GPU: every member, compiled in parallel, timed, float-checked.

    python -m benchmarks.explore --cases gqa_b1,qknorm_b8 --family wide --out DIR [--op-by-op]
    python -m benchmarks.explore --summarize DIR/explore_<date>.json [--top 10]

Unlike selection (``benchmarks.run --ours select``), which float-checks only the fastest builds,
every member here is checked against the float64 reference, so that a new lowering is tested on
every split of the family it may be chosen from.  ``--op-by-op`` also builds each member with the
register-resident online-softmax chain switched off (``OptimizerOptions(register_softmax=False)``),
for a before/after comparison in one run; ``--plain-launch`` also times every build with ordinary
launches instead of programmatic dependent ones, ``--first-plain`` with dependent launches for every
kernel but the program's first (``Program.first_plain``).  Writes ``explore_<date>.json`` under
``--out``: per member the label, pipeline depth, chain on/off, grids, shared memory, median µs and the
error.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import logging
import re
from pathlib import Path

import numpy as np

from mirage.errors import MirageError

log = logging.getLogger("benchmarks.explore")


def explore_case(
    case_name: str, wide: bool, op_by_op: bool, replays: int, profile_top: int = 3, one_block: bool = False,
    also: list[dict] | None = None, plain_launch: bool = False, spread: bool = False, match: str = "",
    fold: bool = False, depths: tuple[int, ...] = (), base: dict | None = None, first_plain: bool = False,
    combine: bool = False, norm: bool = False,
) -> list[dict]:
    from benchmarks.mugraphs import CASES
    from benchmarks.variants import family
    from mirage.codegen.gpu_check import check_on_gpu, random_inputs
    from mirage.codegen.lower_program import generate_cuda_program
    from mirage.codegen.profile import kernel_times, time_graph
    from mirage.codegen.runtime import build_many
    from mirage.mugraph.interpret import interpret
    from mirage.optimizer import OptimizerOptions

    reference = CASES[case_name].reference()
    inputs = random_inputs(reference, seed=0)
    expected = interpret(reference, [x.detach().cpu() for x in inputs], dtype=np.float64)
    rows, programs = [], []
    for variant, graph in family(case_name, wide=wide, fold=fold, combine=combine, norm=norm):
        if match and not re.search(match, variant.label):
            continue
        for stages in depths or variant.stages:
            for chain, two, extra in itertools.product((True, False) if op_by_op else (True,),
                                                       (True, False) if one_block else (False,),
                                                       ({}, *(also or ()))):
                options = dataclasses.replace(OptimizerOptions(), stages=stages, register_softmax=chain,
                                              two_blocks_per_sm=two, **{**(base or {}), **extra})
                row = {"case": case_name, "label": variant.label, "stages": stages, "register_softmax": chain,
                       "two_blocks_per_sm": two, "options": extra,
                       "grids": [b.grid_dim for b in graph.block_graphs()]}
                try:
                    program = generate_cuda_program(graph, None, options=options)
                except MirageError as error:
                    row["failure"] = f"generate: {type(error).__name__}: {str(error).splitlines()[0]}"
                    rows.append(row)
                    continue
                row["smem_bytes"] = [k.smem_bytes for k in program.kernels]
                row["chain_kernels"] = program.code.count("mirage::gen::OnlineSoftmax<")
                rows.append(row)
                programs.append((row, program))
    log.info("%s: %d builds", case_name, len(programs))
    built = build_many([p for _, p in programs])
    for (row, _), program in zip(programs, built, strict=True):
        if isinstance(program, Exception):
            row["failure"] = f"compile: {str(program).splitlines()[0]}"
            continue
        try:
            program.load()
            row["median_us"] = time_graph(lambda p=program: p.launch(inputs), replays=replays).median_us
            if plain_launch:  # the same kernels launched the ordinary way (no programmatic overlap)
                plain = dataclasses.replace(program, dependent_launch=False)
                row["median_us_plain_launch"] = time_graph(lambda p=plain: p.launch(inputs),
                                                           replays=replays).median_us
            if spread:  # dependent launches, grids of one wave kept at one block per SM
                spread_out = dataclasses.replace(program, spread_blocks=True)
                row["median_us_spread"] = time_graph(lambda p=spread_out: p.launch(inputs),
                                                     replays=replays).median_us
            if first_plain:  # dependent launches but for the program's first kernel
                inner = dataclasses.replace(program, first_plain=True)
                row["median_us_first_plain"] = time_graph(lambda p=inner: p.launch(inputs),
                                                          replays=replays).median_us
                if spread:
                    inner = dataclasses.replace(inner, spread_blocks=True)
                    row["median_us_first_plain_spread"] = time_graph(lambda p=inner: p.launch(inputs),
                                                                     replays=replays).median_us
            result = check_on_gpu(reference, program, inputs=inputs, reference=expected)
            row["relative_error"], row["passed"] = result.worst_error, result.passed
        except Exception as error:  # noqa: BLE001 - recorded and reported, never hidden
            message = str(error).splitlines()[0] if str(error) else ""
            row["failure"] = f"run: {type(error).__name__}: {message}"
    for row in rows:
        if "median_us" in row:
            row["best_us"], row["best_mode"] = best_mode(row)
    timed = sorted((r for r in rows if r.get("passed")), key=lambda r: r["best_us"])
    loaded = {id(row): program for (row, _), program in zip(programs, built, strict=True)}
    for r in timed[:profile_top]:  # where the fastest spend their time, kernel by kernel
        program = loaded[id(r)]
        r["kernel_us"] = kernel_times(lambda p=program: p.launch(inputs))
    for r in timed[:5]:
        log.info("%s", summary_line(case_name, r))
    wrong = [r for r in rows if "passed" in r and not r["passed"]]
    failed = [r for r in rows if "failure" in r]
    log.info("%s: %d passed, %d wrong, %d failed", case_name, len(timed), len(wrong), len(failed))
    return rows


# the launch modes a member may be timed in: the record's key and the mode's name
MODES = (("median_us", "dependent"), ("median_us_plain_launch", "plain"), ("median_us_spread", "spread"),
         ("median_us_first_plain", "first_plain"), ("median_us_first_plain_spread", "first_plain_spread"))


def best_mode(row: dict) -> tuple[float, str]:
    """A member's fastest time over the launch modes it was timed in, and that mode's name (selection
    picks a build's mode the same way, so ranking by the dependent launch alone would mislead)."""
    return min((row[key], name) for key, name in MODES if row.get(key) is not None)


def summary_line(case: str, row: dict) -> str:
    """One member's line: its fastest time and mode, label, depth and options, the other modes' times,
    and the kernels' profiled times where there are any."""
    modes = ", ".join(f"{name} {row[key]:.2f}" for key, name in MODES if row.get(key) is not None)
    kernels = ", ".join(f"{k} {v:.2f}" for k, v in (row.get("kernel_us") or {}).items())
    return (f"{case}  {row['best_us']:.2f} µs ({row['best_mode']})  {row['label']} s{row['stages']}"
            + (f" {row['options']}" if row.get("options") else "")
            + f"  [{modes}]" + (f"  kernels: {kernels}" if kernels else ""))


def summarize(record: dict, top: int = 10) -> list[str]:
    """The ``top`` fastest members of each case of an exploration's record, by their best launch mode,
    with the count of members that passed, failed the float check and failed to build or run."""
    lines = []
    for case, rows in record["cases"].items():
        for row in rows:
            if "median_us" in row and "best_us" not in row:  # records written before best_us
                row["best_us"], row["best_mode"] = best_mode(row)
        passed = sorted((r for r in rows if r.get("passed")), key=lambda r: r["best_us"])
        wrong = sum("passed" in r and not r["passed"] for r in rows)
        failed = sum("failure" in r for r in rows)
        lines.append(f"{case}: {len(passed)} passed, {wrong} wrong, {failed} failed")
        lines += ["  " + summary_line(case, r) for r in passed[:top]]
    return lines


def _options(text: str) -> dict:
    """``name=value,...`` as OptimizerOptions overrides (values: ints, floats or true/false)."""
    out: dict = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        lowered = value.strip().lower()
        out[name.strip()] = lowered == "true" if lowered in ("true", "false") else (
            float(value) if "." in value else int(value))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", help="comma-separated case names")
    parser.add_argument("--summarize", metavar="JSON", default=None,
                        help="no timing: print each case's fastest members of an exploration's record "
                             "(by their best launch mode)")
    parser.add_argument("--top", type=int, default=10, help="with --summarize: members a case")
    parser.add_argument("--family", choices=["tuned", "wide", "fold", "combine", "norm"], default="tuned",
                        help="fold: the tuned family with each attention member's cluster-fold twin; "
                             "combine: each tuned attention split with every shape of its combine; "
                             "norm: QKNorm's splits with every shape of their key kernel")
    parser.add_argument("--op-by-op", action="store_true", help="also build every member without the chain")
    parser.add_argument("--one-block", action="store_true",
                        help="also build every member without OptimizerOptions.two_blocks_per_sm")
    parser.add_argument("--also", default="",
                        help="also build every member with these OptimizerOptions, e.g. prefetch_stages=4; "
                             "several sets separated by ';' give a build each")
    parser.add_argument("--base", default="",
                        help="OptimizerOptions of every build, e.g. warpgroup_softmax=true,tma_copies=true")
    parser.add_argument("--plain-launch", action="store_true",
                        help="also time every build with ordinary launches (no programmatic dependent "
                             "launch)")
    parser.add_argument("--spread", action="store_true",
                        help="also time every build with one block per SM for grids of one wave")
    parser.add_argument("--first-plain", action="store_true",
                        help="also time every build with dependent launches for all but the program's "
                             "first kernel (Program.first_plain); with --spread, also spread so")
    parser.add_argument("--match", default="",
                        help="only the members whose label matches this regular expression, e.g. threads=512")
    parser.add_argument("--stages", default="",
                        help="pipeline depths to build every member at, e.g. 3,4 (default: the family's)")
    parser.add_argument("--replays", type=int, default=100)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    if args.summarize:
        try:
            record = json.loads(Path(args.summarize).read_text())
        except (OSError, ValueError) as error:
            parser.error(f"cannot read the exploration record {args.summarize}: {error}")
        print("\n".join(summarize(record, args.top)))
        return 0
    if not args.cases:
        parser.error("give --cases (or --summarize a record)")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from mirage.codegen.profile import device_facts

    facts = device_facts()
    result = {"facts": facts, "family": args.family, "base": args.base, "also": args.also, "cases": {}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    also = [_options(t) for t in args.also.split(";") if t.strip()]
    for case in args.cases.split(","):
        result["cases"][case] = explore_case(case, args.family == "wide", args.op_by_op, args.replays,
                                             one_block=args.one_block, also=also,
                                             plain_launch=args.plain_launch, spread=args.spread,
                                             match=args.match, fold=args.family == "fold",
                                             combine=args.family == "combine",
                                             norm=args.family == "norm",
                                             depths=tuple(int(d) for d in args.stages.split(",") if d),
                                             base=_options(args.base), first_plain=args.first_plain)
        (out / f"explore_{facts['date']}.json").write_text(json.dumps(result, indent=1))
    bad = [r for rows in result["cases"].values() for r in rows if "passed" in r and not r["passed"]]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
