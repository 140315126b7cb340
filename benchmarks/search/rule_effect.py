"""What one pruning rule changes in whole searches: each program searched with the rule on and off,
same budget, same workers.

Reported per program and setting: states visited (kernel and block level), candidates the rule cut,
µGraphs verified, those of them with no identity reduction (a reduction that returns its operand:
what ``identity_reduction`` cuts, so that the two settings' counts of distinct µGraphs compare),
seconds to the first, why the search stopped, and the cost model's estimate for the best µGraph
found. A sound rule that cuts only redundant µGraphs leaves the best estimate as it was (or improves
it, when the time it saves goes to other states). Searches of several workers under a time budget
vary from run to run: compare rows where the rule cut something, and repeat.

    python -m benchmarks.search.rule_effect --rule identity_reduction --time 20 \\
        --out benchmarks/results/search_identity_reduction.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import mirage as mi
from benchmarks.mugraphs import CASES
from mirage.generator import Budget, search
from mirage.generator.driver import machine_description
from mirage.generator.pruning.rules import identity_reductions


def softmax_projection() -> mi.KernelGraph:
    """``softmax(x @ W)`` in the LAX form the frontend captures, 16 × 256 × 512."""
    g = mi.new_kernel_graph("softmax_projection")
    x, w = g.new_input((16, 256), mi.float16, name="x"), g.new_input((256, 512), mi.float16, name="w")
    e = g.exp(g.matmul(x, w))
    g.mark_output(g.div(e, g.reduction(e, 1)))
    return g.freeze()


def gate() -> mi.KernelGraph:
    """``(x + r) · sigmoid(g)``, 8 × 1024: element-wise only, small enough to search to the end."""
    g = mi.new_kernel_graph("gate")
    x, r, s = (g.new_input((8, 1024), mi.float16, name=n) for n in "xrg")
    g.mark_output(g.mul(g.add(x, r), g.sigmoid(s)))
    return g.freeze()


def column_norms() -> mi.KernelGraph:
    """``x / sqrt(Σ_rows x² + ε)``: a reduction over a dim other than the last, 64 × 512."""
    g = mi.new_kernel_graph("column_norms")
    x = g.new_input((64, 512), mi.float16, name="x")
    g.mark_output(g.div(x, g.sqrt(g.add_scalar(g.reduction(g.square(x), 0), 1e-6))))
    return g.freeze()


def log_probs() -> mi.KernelGraph:
    """``log_softmax(x / 0.7)`` over 32,000 logits, 8 rows, as the frontend lowers it."""
    g = mi.new_kernel_graph("log_probs")
    x = g.mul_scalar(g.new_input((8, 32000), mi.float16, name="x"), 1 / 0.7)
    g.mark_output(g.sub(x, g.log(g.reduction(g.exp(x), 1))))
    return g.freeze()


def scaled_softmax() -> mi.KernelGraph:
    """``softmax(x @ W / 8)``, 16 × 256 × 512: a scale before the exp."""
    g = mi.new_kernel_graph("scaled_softmax")
    x, w = g.new_input((16, 256), mi.float16, name="x"), g.new_input((256, 512), mi.float16, name="w")
    e = g.exp(g.mul_scalar(g.matmul(x, w), 0.125))
    g.mark_output(g.div(e, g.reduction(e, 1)))
    return g.freeze()


def centred_rms() -> mi.KernelGraph:
    """LayerNorm's centring and scale without gain, as lowered: ``rms_norm(x − Σx · 1/n)``, 8 × 512."""
    g = mi.new_kernel_graph("centred_rms")
    x = g.new_input((8, 512), mi.float16, name="x")
    g.mark_output(g.rms_norm(g.sub(x, g.mul_scalar(g.reduction(x, 1), 1 / 512)), eps=1e-5))
    return g.freeze()


#: name → (reference builder, config)
PROGRAMS: dict[str, tuple[Callable[[], mi.KernelGraph], str]] = {
    "softmax_projection": (softmax_projection, "mlp"),
    "gate": (gate, "mlp"),
    "column_norms": (column_norms, "mlp"),
    "rmsnorm_b1": (lambda: CASES["rmsnorm_b1"].reference(), "mlp"),
    "lora_m16": (lambda: CASES["lora_m16"].reference(), "lora"),
    "log_probs": (log_probs, "mlp"),
    "scaled_softmax": (scaled_softmax, "mlp"),
    "centred_rms": (centred_rms, "mlp"),
}


def measure(name: str, rule: str, enabled: bool, seconds: float, workers: int) -> dict:
    build, config = PROGRAMS[name]
    disabled = () if enabled else (rule,)
    start = time.time()
    result = search(build(), config, budget=Budget(time_s=seconds), workers=workers, progress=False,
                    cache=False, checkpoint=False, disabled_rules=disabled)
    stats = result.stats
    return {
        "program": name, "rule_on": enabled, "wall_s": round(time.time() - start, 2),
        "states": dict(stats.states_per_level), "cut_by_rule": stats.pruned.get(rule, 0),
        "verified": len(result.found),
        "verified_without_identities": sum(not identity_reductions(f.graph) for f in result.found),
        "first_found_s": stats.first_found_s,
        "stop_reason": result.stop_reason.value,
        "best_estimate_us": result.found[0].estimated_us if result.found else None,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rule", default="identity_reduction")
    parser.add_argument("--programs", nargs="*", default=list(PROGRAMS))
    parser.add_argument("--time", type=float, default=20.0, help="search budget per run, s")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    unknown = sorted(set(args.programs) - set(PROGRAMS))
    if unknown:
        parser.error(f"unknown programs {unknown}; choose from {sorted(PROGRAMS)}")
    rows = []
    for name in args.programs:
        for enabled in (True, False):
            row = measure(name, args.rule, enabled, args.time, args.workers)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        record = {"rule": args.rule, "time_s": args.time, "workers": args.workers,
                  "machine": machine_description(), "date": time.strftime("%Y-%m-%d"), "rows": rows}
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
