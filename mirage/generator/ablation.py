"""Reproduce the paper's Table 5: search time of RMSNorm + MatMul as the block-op budget grows,
with every pruning rule, and with abstract-expression pruning switched off.

    python -m mirage.generator.ablation --ops 5 6 7 8 9 10 11 --cap 300 --out table5.json
    python -m mirage.generator.ablation --ops 11 --modes "all rules" --cap 900 --out table5.json --append

Each run searches the whole default space (config ``mlp``) of ``rms_norm(X) * G @ W`` with
``max_block_ops`` = 5 ... 11 (input iterators counted, as in Mirage) under a wall-time cap; a run
that reaches the cap is reported as ``> cap`` (the paper's "> 10 h").  Every run also reports its
states, verified µGraphs, and when it found the first verified µGraph and the fused one.
The result cache is bypassed so that every row is a fresh search.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

import mirage as mi
from mirage.generator import Budget, StopReason, search
from mirage.generator.cost import is_fused

logger = logging.getLogger(__name__)

#: The paper's Table 5 (seconds; 16 threads; None: more than 10 hours).
PAPER = {
    5: (11, 768),
    6: (16, 19_934),
    7: (22, None),
    8: (24, None),
    9: (26, None),
    10: (26, None),
    11: (28, None),
}
MODES = {"all rules": (), "no abstract expressions": ("abstract_expression",)}


def rmsnorm_reference(batch: int = 1, eps: float = 1e-6) -> mi.KernelGraph:
    """RMSNorm + MatMul of the benchmarks: ``rms_norm(X) * G @ W`` with X (2b, 4096), W (4096, 6144)."""
    g = mi.new_kernel_graph("rmsnorm")
    x = g.new_input(dims=(2 * batch, 4096), dtype=mi.float16, name="X")
    gain = g.new_input(dims=(1, 4096), dtype=mi.float16, name="G")
    w = g.new_input(dims=(4096, 6144), dtype=mi.float16, name="W")
    g.mark_output(g.matmul(g.mul(g.rms_norm(x, eps=eps), gain), w))
    return g.freeze()


def run(max_block_ops: int, disabled: tuple[str, ...], cap_s: float, workers: int | None) -> dict[str, Any]:
    start = time.perf_counter()
    result = search(
        rmsnorm_reference(),
        "mlp",
        budget=Budget(time_s=cap_s),
        max_block_ops=max_block_ops,
        disabled_rules=disabled,
        workers=workers,
        cache=False,
        checkpoint=False,
        progress=False,
    )
    wall = time.perf_counter() - start
    complete = result.stop_reason is StopReason.COMPLETE
    by_time = sorted(result.found, key=lambda f: f.elapsed_s)
    fused = next((f.elapsed_s for f in by_time if is_fused(f.graph)), None)
    return {
        "max_block_ops": max_block_ops,
        "disabled_rules": list(disabled),
        "complete": complete,
        "search_s": round(wall, 1) if complete else None,
        "cap_s": cap_s,
        "wall_s": round(wall, 1),
        "stop_reason": result.stop_reason.value,
        "states": result.stats.states,
        "states_per_second": round(result.stats.states_per_second, 1),
        "verified": len(result),
        "first_verified_s": by_time[0].elapsed_s if by_time else None,
        "first_fused_s": fused,
        "pruned": result.stats.pruned,
        "workers": result.stats.workers,
        "machine": result.stats.machine,
    }


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a markdown table beside the paper's numbers."""

    def cell(row: dict[str, Any] | None) -> str:
        if row is None:
            return "-"
        if row["complete"]:
            return f"{row['search_s']:.0f} s"
        return f"> {row['cap_s']:.0f} s"

    def paper(value: int | None) -> str:
        return "> 10 h" if value is None else f"{value} s"

    lines = [
        "| max block ops | all rules | paper | w/o abstract expressions | paper | states (all rules) "
        "| workers |",
        "|---|---|---|---|---|---|---|",
    ]
    for ops in sorted({r["max_block_ops"] for r in rows}):
        on = next((r for r in rows if r["max_block_ops"] == ops and not r["disabled_rules"]), None)
        off = next((r for r in rows if r["max_block_ops"] == ops and r["disabled_rules"]), None)
        reference = PAPER.get(ops, (None, None))
        states = f"{on['states']:,}" if on else "-"
        workers = "/".join(str(r["workers"]) for r in (on, off) if r is not None)
        lines.append(
            f"| {ops} | {cell(on)} | {paper(reference[0])} | {cell(off)} | {paper(reference[1])} | {states} "
            f"| {workers} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Reproduce Table 5 (pruning ablation on RMSNorm).")
    parser.add_argument("--ops", type=int, nargs="*", default=list(range(5, 12)), help="max block ops")
    parser.add_argument("--cap", type=float, default=300.0, help="wall-time cap per run, seconds")
    parser.add_argument("--workers", type=int, default=0, help="worker processes (0: every core)")
    parser.add_argument("--modes", nargs="*", default=list(MODES), choices=list(MODES))
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    parser.add_argument(
        "--append",
        action="store_true",
        help="keep the rows already in --out (a new run of a row replaces it)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("egglog").setLevel(logging.WARNING)
    rows: list[dict[str, Any]] = []
    if args.append and args.out is not None and args.out.exists():
        rows = json.loads(args.out.read_text())["rows"]
    for ops in args.ops:
        for mode in args.modes:
            row = run(ops, MODES[mode], args.cap, args.workers or None)
            rows = [r for r in rows if (r["max_block_ops"], r["disabled_rules"]) != (ops, list(MODES[mode]))]
            logger.info(
                "max_block_ops=%d %s: %s",
                ops,
                mode,
                f"complete in {row['wall_s']:.1f} s"
                if row["complete"]
                else f"> {args.cap:.0f} s ({row['states']:,} states)",
            )
            rows.append(row)
            if args.out is not None:
                from mirage.generator.driver import machine_description

                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(
                    json.dumps(
                        {
                            "machine": machine_description(),
                            "cap_s": max(r["cap_s"] for r in rows),
                            "rows": sorted(rows, key=lambda r: (r["max_block_ops"], r["disabled_rules"])),
                            "table": table(rows),
                        },
                        indent=2,
                    )
                    + "\n"
                )
    logger.info("Table 5 reproduction:\n%s", table(rows))


if __name__ == "__main__":
    main()
