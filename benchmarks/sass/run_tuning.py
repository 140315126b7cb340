"""Tune the SASS schedule of the fixture kernels and of two Triton kernels on this machine's GPU.

    python benchmarks/sass/run_tuning.py --output-dir results/ [--budget 120] [--compare-budget 120]

Runs simulated annealing on every kernel (the element-wise and CuTe GEMM fixtures, a Triton GEMM +
LeakyReLU and a Triton fused attention), then PPO on the two Triton kernels at the same candidate
budget, and writes ``runs.json`` and ``summary.json``: candidates tested, candidates the
legality model allowed that failed or miscomputed on the GPU (the target is zero), gains of the
re-timed winners with their run-to-run spread and the A/A noise floor, device, driver, versions, date.
``runs.json`` holds every run with its per-candidate records.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from mirage.sass.elf import Cubin  # noqa: E402
from mirage.sass.evaluate import EvaluatorOptions  # noqa: E402
from mirage.sass.launch import BufferArgument, LaunchSpec, ScalarArgument  # noqa: E402
from mirage.sass.mutation import MoveSet  # noqa: E402
from mirage.sass.search import Budget, SearchOptions  # noqa: E402
from mirage.sass.tune import TuneOptions, tune_cubin  # noqa: E402

log = logging.getLogger("run_tuning")
FIXTURES = ROOT / "tests" / "fixtures" / "sass"


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    cubin: Cubin
    spec: LaunchSpec
    notes: dict
    move_set: MoveSet = MoveSet.SIP


def fixture_cases(quick: bool) -> list[Case]:
    elements = 1 << (20 if quick else 24)
    elementwise = LaunchSpec(
        kernel="scaled_add_x4", grid=(elements // 1024, 1, 1), block=(256, 1, 1), arguments=(
            BufferArgument("x", (elements,), "float32"), BufferArgument("y", (elements,), "float32"),
            BufferArgument("out", (elements,), "float32", output=True),
            ScalarArgument("alpha", "float32", 0.75), ScalarArgument("n", "int32", elements)))
    size = 1024 if quick else 2048
    gemm = LaunchSpec(
        kernel="cute_gemm_tn", grid=(size // 64, size // 64, 1), block=(128, 1, 1), arguments=(
            BufferArgument("a", (size, size), "float16"), BufferArgument("b", (size, size), "float16"),
            BufferArgument("c", (size, size), "float32", output=True), ScalarArgument("m", "int32", size),
            ScalarArgument("n", "int32", size), ScalarArgument("k", "int32", size)))
    # SIP's move set has almost nothing to move in the element-wise kernel: search adjacent swaps there
    return [Case("elementwise_x4", Cubin.read(FIXTURES / "elementwise.cubin"), elementwise,
                 {"elements": elements}, MoveSet.SWAP),
            Case("cute_gemm", Cubin.read(FIXTURES / "cute_gemm.cubin"), gemm, {"m=n=k": size})]


def triton_cases(quick: bool) -> list[Case]:
    import triton_cases as kernels

    from mirage.sass.triton_kernels import launch_spec_from_triton

    cases = []
    for name, build, kwargs in (
        ("triton_matmul_leaky_relu", kernels.build_matmul, {"size": 1024 if quick else 2048}),
        ("triton_attention", kernels.build_attention, {"batch_heads": 16 if quick else 64}),
    ):
        compiled, arguments, grid, outputs, error = build(**kwargs)
        spec = launch_spec_from_triton(compiled, arguments, grid, outputs)
        cases.append(Case(name, Cubin.from_bytes(compiled.asm["cubin"]), spec,
                          {**{k: str(v) for k, v in kwargs.items()},
                           "relative_error_vs_torch": f"{error:.2e}"}))
        log.info("%s: Triton result vs torch relative error %.2e", name, error)
    return cases


def device_info() -> dict:
    import torch

    info = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "torch": torch.__version__, "device": torch.cuda.get_device_name(0),
            "capability": ".".join(map(str, torch.cuda.get_device_capability(0)))}
    try:
        import cupy

        info["cupy"] = cupy.__version__
        info["driver"] = str(cupy.cuda.runtime.driverGetVersion())
        import subprocess

        query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        driver = subprocess.run(query, capture_output=True, text=True, check=False).stdout.strip()
        info["driver"] = driver or info["driver"]
    except Exception as error:  # noqa: BLE001 - informational only
        info["driver_error"] = str(error)
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        pass
    return info


def run_one(case: Case, policy: str, budget: int, args, deadline: float) -> dict:
    remaining = max(30.0, deadline - time.time())
    options = TuneOptions(
        policy=policy, budget=Budget(candidates=budget, time_s=remaining * 0.8),
        search=SearchOptions(move_set=case.move_set, repair_stalls=args.repair_stalls, seed=args.seed,
                             progress=not args.no_progress),
        evaluator=EvaluatorOptions(rounds=args.rounds, timeout_s=30.0),
        timing_repeats=args.repeats, verify_sets=args.verify_sets)
    started = time.time()
    result = tune_cubin(case.cubin, case.spec, options)
    summary = {"case": case.name, "notes": case.notes, "move_set": case.move_set.value, "seed": args.seed,
               "repair_stalls": args.repair_stalls, **result.summary(),
               "seconds": round(time.time() - started, 1)}
    log.info("%-26s %-9s candidates %4d  failures %d  gain %+.2f%% ± %.2f%% (noise ± %.2f%%)%s",
             case.name, policy, summary["candidates"], summary["legality_failures"], summary["gain_percent"],
             summary["spread_percent"], summary["noise_percent"],
             "  significant" if summary["significant"] else "")
    return summary


PROBED_RULES = ("register-dependence", "stall-distance", "scoreboard", "scoreboard-guard", "memory-order")


def probe_refused(case: Case, count: int, seed: int) -> dict:
    """Force single swaps the model refuses (never across blocks or pinned instructions, which could
    hang) and see what the GPU makes of them: evidence that the refusals are not vacuous."""
    import collections
    import random

    from mirage.sass.evaluate import SandboxEvaluator
    from mirage.sass.kernel import load_kernel
    from mirage.sass.legality import check_swap

    kernel = load_kernel(case.cubin, case.spec.kernel)
    refused = [(p, check_swap(kernel, p, p + 1).rule) for p in range(len(kernel) - 1)]
    refused = [(p, rule.value) for p, rule in refused if rule is not None and rule.value in PROBED_RULES]
    random.Random(seed).shuffle(refused)
    outcomes: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    with SandboxEvaluator(case.cubin, case.spec, EvaluatorOptions(rounds=3, timeout_s=20.0)) as evaluator:
        for position, rule in refused[:count]:
            forced = kernel.swapped(position)
            result = evaluator.evaluate(case.cubin.with_text(kernel.name, forced.text_bytes()))
            outcomes[rule][result.status.value] += 1
    table = {rule: dict(counter) for rule, counter in outcomes.items()}
    log.info("%s refused swaps forced onto the GPU: %s", case.name, table)
    return {"case": case.name, "refused_total": len(refused), "probed": min(count, len(refused)),
            "outcomes": table}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", required=True, type=Path)
    parser.add_argument("--budget", type=int, default=120, help="annealing candidates per kernel")
    parser.add_argument("--compare-budget", type=int, default=120, help="PPO candidates per Triton kernel")
    parser.add_argument("--rounds", type=int, default=9, help="timing rounds per candidate")
    parser.add_argument("--repeats", type=int, default=5, help="timing repeats of finalists and of the noise")
    parser.add_argument("--verify-sets", type=int, default=64)
    parser.add_argument("--deadline-s", type=float, default=480.0, help="stop starting runs after this")
    parser.add_argument("--repair-stalls", action="store_true")
    parser.add_argument("--quick", action="store_true", help="small problem sizes")
    parser.add_argument("--only", nargs="*", help="case names to run")
    parser.add_argument("--skip-triton", action="store_true")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="one search per seed")
    parser.add_argument("--policies", nargs="+", default=["annealing", "ppo"], choices=["annealing", "ppo"])
    parser.add_argument("--move-set", choices=[m.value for m in MoveSet],
                        help="override every case's move set")
    parser.add_argument("--probe-refused", type=int, default=0, metavar="N",
                        help="also force N refused swaps per kernel onto the GPU and tabulate the outcomes")
    parser.add_argument("--probe-cases", nargs="*", help="limit the probes to these cases")
    parser.add_argument("--no-runs", action="store_true", help="skip the tuning runs (probes only)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    args.output_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + args.deadline_s
    info = device_info()
    log.info("device %s", info)
    cases = fixture_cases(args.quick) + ([] if args.skip_triton else triton_cases(args.quick))
    if args.only:
        cases = [case for case in cases if case.name in args.only]
    if args.move_set:
        cases = [dataclasses.replace(case, move_set=MoveSet(args.move_set)) for case in cases]
    # the policy comparison first (both policies per Triton kernel), then the fixture kernels
    plan = [(case, policy, budget) for case in cases if case.name.startswith("triton")
            for policy, budget in (("annealing", args.budget), ("ppo", args.compare_budget))
            if policy in args.policies]
    plan += [(case, "annealing", args.budget) for case in cases if not case.name.startswith("triton")
             and "annealing" in args.policies]
    plan = [(case, policy, budget, seed) for case, policy, budget in plan for seed in args.seeds
            if not args.no_runs]
    runs, skipped = [], []
    for case, policy, budget, seed in plan:
        if time.time() > deadline:
            skipped.append(f"{case.name}/{policy}/seed{seed}")
            continue
        try:
            summary = run_one(case, policy, budget, argparse.Namespace(**{**vars(args), "seed": seed}),
                              deadline)
        except Exception as error:  # noqa: BLE001 - record and go on with the other kernels
            log.exception("%s/%s failed", case.name, policy)
            summary = {"case": case.name, "policy": policy, "seed": seed,
                       "error": f"{type(error).__name__}: {error}"}
        runs.append(summary)
        (args.output_dir / "runs.json").write_text(json.dumps(runs, indent=1))
    probes = []
    for case in cases if args.probe_refused else []:
        if args.probe_cases and case.name not in args.probe_cases:
            continue
        if time.time() > deadline:
            skipped.append(f"{case.name}/probe")
            continue
        try:
            probes.append(probe_refused(case, args.probe_refused, args.seeds[0]))
        except Exception as error:  # noqa: BLE001
            log.exception("%s probe failed", case.name)
            probes.append({"case": case.name, "error": f"{type(error).__name__}: {error}"})
    ok = [run for run in runs if "error" not in run]
    summary = {
        **info, "runs": [{k: v for k, v in run.items() if k != "records"} for run in runs],
        "skipped": skipped, "candidates_total": sum(run["candidates"] for run in ok),
        "legality_failures_total": sum(run["legality_failures"] for run in ok),
        "rejected_by_static_check_total": sum(run["status_counts"].get("rejected", 0) for run in ok),
        "refused_move_probes": probes,
    }
    (args.output_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    log.info("candidates %d, legality failures %d, skipped %s", summary["candidates_total"],
             summary["legality_failures_total"], skipped)
    return 0


if __name__ == "__main__":
    sys.exit(main())
