"""Rediscover the hand-built fused µGraphs of the six benchmark programs with the search.

For each case the search runs on the reference (unfused) program with the program's config and
the overrides listed in :data:`RESTRICTIONS` (the user-level restrictions a user would pass; an
empty row means Mirage's default space).  It stops when it finds a µGraph with the structure of
the hand-built one (``mirage.generator.cost.structure``), or at the time limit.  Reported per case:
time to the first verified µGraph, time to the first fully fused one, time to the hand-built
structure, states, states per second, and the search statistics.

    python -m benchmarks.search.rediscover --cases rmsnorm_b1 gatedmlp_m1 --time 600 \\
        --out benchmarks/results/search_rediscover.json
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

from benchmarks.mugraphs import CASES
from mirage.generator import Budget, search
from mirage.generator.cost import is_fused, structure
from mirage.generator.driver import machine_description

logger = logging.getLogger("benchmarks.search")

DEFAULT_CASES = ("rmsnorm_b1", "gatedmlp_m1", "lora_m16", "ntrans_b1", "gqa_b1", "qknorm_b1")

#: Per case: (search-space overrides a user would pass, why).  Empty: Mirage's default space.
#: The FlashDecoding layout of the attention kernels (mirage-notes §1.7): heads × 8 KV splits ×
#: 16 query groups, then a reduction kernel over the splits.  Mirage's generated grids do not
#: include (2, 8, 16); its attention demos rely on saved checkpoints of multi-hour searches.
FLASH_DECODING = {
    "griddims": [(2, 8, 16), (2, 16, 1)],
    "imap_combos": [[(0, -1, 1), (0, 2, -1), (0, 1, -1)], [(0, 1, -1), (0, 1, -1)]],
    "fmap_combos": [[-1, 2, 1], [-1, -1]],
    "franges": [4],
    "omaps": [(0, 2, 1), (0, 1, -1)],
}

RESTRICTIONS: dict[str, tuple[dict[str, Any], str]] = {
    "rmsnorm_b1": ({}, "Mirage's default space (config mlp)"),
    "gatedmlp_m1": ({}, "Mirage's default space (config mlp)"),
    "lora_m16": ({}, "Mirage's default space (config lora)"),
    "ntrans_b1": ({"griddims": [(1, 1, 1)]}, "one grid: one block for the single row (b = 1)"),
    "gqa_b1": (FLASH_DECODING, "the FlashDecoding grids and maps (not in Mirage's generated candidates)"),
    "qknorm_b1": (
        {**FLASH_DECODING, "max_block_ops": 16},
        "the FlashDecoding grids and maps; 16 block ops (the fused QK-norm kernel has 13 ops)",
    ),
}


class HasStructure:
    """Picklable stop condition: the µGraph has one of these structures."""

    def __init__(self, structures) -> None:
        self.structures = list(structures)

    def __call__(self, graph) -> bool:
        return structure(graph) in self.structures


def hand_built_structures(name: str) -> list:
    """The structure of the case's hand-built µGraph (for LoRA also the concat-matmul variant)."""
    case = CASES[name]
    found = [structure(case.fused())]
    if case.program == "lora":
        from benchmarks.mugraphs import mlp

        found.append(structure(mlp.lora_fused(case.size, concat=True)))
    return found


def run_case(
    name: str, time_s: float, workers: int, overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    case = CASES[name]
    restriction, why = RESTRICTIONS.get(name, ({}, "Mirage's default space"))
    restriction = {**restriction, **(overrides or {})}
    targets = hand_built_structures(name)
    kernels = len(case.fused().block_graphs())
    start = time.perf_counter()
    result = search(
        case.reference(),
        case.config,
        budget=Budget(time_s=time_s),
        workers=workers,
        progress=False,
        cache=False,
        checkpoint=False,
        stop_when=HasStructure(targets),
        **restriction,
    )
    wall = time.perf_counter() - start
    by_time = sorted(result.found, key=lambda f: f.elapsed_s)
    first_fused = next((f for f in by_time if is_fused(f.graph, kernels)), None)
    first_target = next((f for f in by_time if f.structure in targets), None)
    record = {
        "case": name,
        "program": case.program,
        "config": case.config or "mlp",
        "restriction": restriction,
        "restriction_note": why,
        "hand_built_structure": targets,
        "time_limit_s": time_s,
        "workers": result.stats.workers,
        "stop_reason": result.stop_reason.value,
        "wall_s": round(wall, 1),
        "first_verified_s": by_time[0].elapsed_s if by_time else None,
        "first_fused_s": first_fused.elapsed_s if first_fused else None,
        "hand_built_structure_s": first_target.elapsed_s if first_target else None,
        "found_structure": first_target is not None,
        "verified": len(result),
        "states": result.stats.states,
        "states_per_second": round(result.stats.states_per_second, 1),
        "found_graph": str(first_target.graph) if first_target else None,
        "stats": result.stats.to_dict(),
    }
    logger.info(
        "%s: first verified %s s, hand-built structure %s s (%s)",
        name,
        record["first_verified_s"],
        record["hand_built_structure_s"],
        record["stop_reason"],
    )
    return record


def table(cases: dict[str, dict[str, Any]]) -> str:
    """A markdown table of the cases."""

    def seconds(value) -> str:
        return "-" if value is None else f"{value:.0f} s"

    lines = [
        "| case | config | restriction | first verified | hand-built structure | states | stop |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in cases.items():
        restriction = ", ".join(sorted(r["restriction"])) or "none"
        lines.append(
            f"| {name} | {r['config']} | {restriction} | {seconds(r['first_verified_s'])} | "
            f"{seconds(r['hand_built_structure_s'])} | {r['states']:,} | {r['stop_reason']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="*", default=list(DEFAULT_CASES))
    parser.add_argument("--time", type=float, default=600.0, help="time limit per case, seconds")
    parser.add_argument("--workers", type=int, default=0, help="worker processes (0: every core)")
    parser.add_argument("--overrides", type=json.loads, default={}, help="JSON search-space overrides")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/search_rediscover.json"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("egglog").setLevel(logging.WARNING)
    previous = json.loads(args.out.read_text()) if args.out.exists() else {"cases": {}}
    cases = previous.get("cases", {})
    workers = args.workers or None
    machine = machine_description()
    for name in args.cases:
        record = run_case(name, args.time, workers or 0, args.overrides)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        per_case = args.out.parent / f"search_{name}.json"  # the full statistics of this case
        per_case.write_text(json.dumps({"machine": machine, **record}, indent=2, default=str) + "\n")
        cases[name] = {k: v for k, v in record.items() if k not in ("stats", "found_graph")}
        document = {"machine": machine, "cases": cases, "table": table(cases)}
        args.out.write_text(json.dumps(document, indent=2, default=str) + "\n")
    logger.info("\n%s", table(cases))


if __name__ == "__main__":
    main()
