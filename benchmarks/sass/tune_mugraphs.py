"""Tune the SASS schedules of the kernels generated for the benchmark µGraphs, on this machine's GPU.

    python benchmarks/sass/tune_mugraphs.py --output-dir DIR [--cases gatedmlp_m1 lora_m16 ...]
        [--budget 60] [--deadline-s 300] [--move-set auto|sip|swap] [--suite RECORD.json]

For every fused benchmark µGraph named (default: the b = 1 set), or with ``--suite`` every named
case's pick in that suite record (its µGraph, forms, pipeline depth and launch modes as selection
chose them; kernels that copy by TMA get their tensor maps in the sandbox), generates and compiles its CUDA,
then tunes each generated kernel with simulated annealing through
:func:`mirage.sass.mugraph.tune_program` (kernels whose code is byte-identical to one already tuned
are listed, not tuned again).  Per kernel it records the legal moves the model finds, the candidates
tested, the candidates the model allowed that then failed or miscomputed on the GPU (the target is
zero), the re-timed gain with its run-to-run spread and the A/A noise floor, and whether the schedule
was taken (verified and beating the noise floor).  Each program whose tuning produced a verified
faster median is then checked end to end: the tuned cubin swapped into the program, outputs compared
bit for bit, and both programs timed as CUDA-graph replays.  Everything goes to
``DIR/sass_mugraph.json``, rewritten after each kernel, with device, driver, versions and date.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from mirage.sass.elf import Cubin  # noqa: E402
from mirage.sass.evaluate import CandidateStatus, EvaluatorOptions  # noqa: E402
from mirage.sass.kernel import load_kernel  # noqa: E402
from mirage.sass.mugraph import decide, tune_program, with_kernel_texts  # noqa: E402
from mirage.sass.mutation import MoveSet, legal_moves  # noqa: E402
from mirage.sass.search import Budget, SearchOptions  # noqa: E402
from mirage.sass.tune import TuneOptions, TuneResult  # noqa: E402

log = logging.getLogger("tune_mugraphs")
DEFAULT_CASES = ("gatedmlp_m1", "rmsnorm_b1", "lora_m16", "ntrans_b1", "gqa_b1", "qknorm_b1")
INPUT_SCALE = 0.5  # as the codegen GPU checks: keeps 4096-long fp16 dot products well inside range
AUTO_SIP_MINIMUM = 20  # "auto" searches SIP's memory moves when at least this many are legal
OVERHEAD_S = 14.0  # per kernel beyond the search: legality census, sandbox start, re-timing, verification


@dataclass(frozen=True)
class KernelJob:
    case: str
    kernel: str
    text_hash: str
    duplicate_of: str | None


def build_programs(names: list[str], suite: Path | None = None) -> dict:
    """The named cases' fused µGraphs, built plainly; with ``suite`` (a suite record), each case's pick
    instead, built and launched as the record's selection chose it (forms, depth, launch modes)."""
    import dataclasses

    from benchmarks.mugraphs import CASES
    from mirage.codegen.lower_program import generate_cuda_program
    from mirage.codegen.runtime import BuildChoice, Program, build_many

    choices = {}
    if suite is not None:
        from benchmarks.define_ab import pick

        records = {c["case"]: c["selection"]["best"] for c in json.loads(suite.read_text())["cases"]
                   if c.get("selection", {}).get("best")}
        choices = {name: records[name] for name in names if name in records}
        log.info("suite picks: %s; not in the record: %s", sorted(choices), sorted(set(names) - set(choices)))
    generated = {}
    for name in names if suite is None else choices:
        try:
            if suite is None:
                generated[name] = generate_cuda_program(CASES[name].fused(), None)
            else:
                choice = BuildChoice.from_dict(choices[name])
                graph = pick(name, choices[name])
                generated[name] = generate_cuda_program(graph, None, options=choice.options())
        except Exception as error:  # noqa: BLE001 - report and go on with the other cases
            log.error("%s did not generate: %s", name, _error_text(error))
    built = build_many(list(generated.values()))
    programs = {}
    for name, program in zip(generated, built, strict=True):
        if not isinstance(program, Program):
            log.error("%s did not compile: %s", name, str(program).splitlines()[0])
            continue
        if name in choices:
            choice = BuildChoice.from_dict(choices[name])
            program = dataclasses.replace(program, dependent_launch=choice.dependent_launch,
                                          spread_blocks=choice.spread_blocks)
        programs[name] = program
    return programs


def static_profile(cubin: Cubin, kernel_name: str) -> dict:
    """How much room the legality model leaves: legal adjacent swaps and SIP moves, without and
    with stall repair."""
    kernel = load_kernel(cubin, kernel_name)
    counts = {f"{move_set.value}{'_repaired' if repair else ''}": len(legal_moves(kernel, move_set,
                                                                                   repair_stalls=repair))
              for move_set in MoveSet for repair in (False, True)}
    return {"instructions": len(kernel), "blocks": len(kernel.blocks), "legal_moves": counts}


def choose_move_set(requested: str, profile: dict) -> MoveSet:
    if requested != "auto":
        return MoveSet(requested)
    return MoveSet.SIP if profile["legal_moves"]["sip_repaired"] >= AUTO_SIP_MINIMUM else MoveSet.SWAP


def tune_options(args, move_set: MoveSet, time_s: float) -> TuneOptions:
    return TuneOptions(
        policy="annealing", budget=Budget(candidates=args.budget, time_s=time_s),
        search=SearchOptions(move_set=move_set, repair_stalls=True, seed=args.seed, progress=False),
        evaluator=EvaluatorOptions(rounds=args.rounds, timeout_s=30.0),
        timing_repeats=args.repeats, verify_sets=args.verify_sets)


def kernel_summary(job: KernelJob, result: TuneResult, profile: dict, move_set: MoveSet,
                   seconds: float) -> dict:
    decision = decide(result)
    summary = {key: value for key, value in result.summary().items() if key != "records"}
    return {"case": job.case, **summary, "move_set": move_set.value, "static": profile,
            "taken": decision.accepted, "decision": decision.reason, "seconds": round(seconds, 1),
            "records": [record.__dict__ for record in result.search.records]}


def _inputs(program, seed: int) -> list:
    import torch

    generator = torch.Generator(device="cuda").manual_seed(seed)
    return [(INPUT_SCALE * torch.randn(t.shape, generator=generator, device="cuda")).to(t.dtype.torch())
            for t in program.graph.input_types]


def _bits(tensor):
    import torch

    return tensor.view(torch.int16) if tensor.element_size() == 2 else tensor.view(torch.int32)


def graph_replay_us(programs: list, inputs: list, calls: int = 20, rounds: int = 15) -> list[list[float]]:
    """Per-call microseconds of each program as CUDA-graph replays of ``calls`` calls, in rounds that
    alternate the programs (medians are taken by the caller)."""
    import torch

    graphs = []
    for program in programs:
        program.load()
        program(*inputs)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                program(*inputs)
        graphs.append(graph)
    times: list[list[float]] = [[] for _ in programs]
    for round_index in range(rounds + 2):
        order = list(range(len(programs)))
        for index in order if round_index % 2 == 0 else order[::-1]:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graphs[index].replay()
            end.record()
            end.synchronize()
            if round_index >= 2:  # two warm-up rounds
                times[index].append(start.elapsed_time(end) * 1000.0 / calls)
    return times


def end_to_end(program, texts: dict[str, bytes], label: str) -> dict:
    """Swap the tuned kernels into the program, compare outputs bit for bit, time both."""
    tuned = with_kernel_texts(program, texts)
    equal = True
    for seed in range(3):
        inputs = _inputs(program, seed)
        before, after = program(*inputs), tuned(*inputs)
        equal = equal and all(bool((_bits(a) == _bits(b)).all()) for a, b in zip(before, after, strict=True))
    original_us, tuned_us = graph_replay_us([program, tuned], _inputs(program, 0))
    speedup = statistics.median(original_us) / statistics.median(tuned_us)
    return {"schedules": label, "kernels": sorted(texts), "outputs_bitwise_equal": equal,
            "original_us": statistics.median(original_us), "tuned_us": statistics.median(tuned_us),
            "gain_percent": (speedup - 1.0) * 100.0, "tuned_cubin": tuned.cubin.name}


def _error_text(error: Exception) -> str:
    lines = str(error).splitlines()
    return f"{type(error).__name__}: {lines[0][:300] if lines else ''}"


def plan(programs: dict) -> list[KernelJob]:
    jobs, seen = [], {}
    for case, program in programs.items():
        cubin = Cubin.read(program.cubin)
        for launch in program.cuda.kernels:
            digest = hashlib.sha256(cubin.text(launch.name)).hexdigest()[:16]
            jobs.append(KernelJob(case, launch.name, digest, seen.get(digest)))
            seen.setdefault(digest, f"{case}/{launch.name}")
    return jobs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", required=True, type=Path)
    parser.add_argument("--cases", nargs="+", default=list(DEFAULT_CASES))
    parser.add_argument("--suite", type=Path, default=None,
                        help="tune each case's pick of this suite record, built and launched as selected")
    parser.add_argument("--budget", type=int, default=60, help="annealing candidates per kernel")
    parser.add_argument("--move-set", default="auto", choices=["auto"] + [m.value for m in MoveSet])
    parser.add_argument("--rounds", type=int, default=9, help="timing rounds per candidate")
    parser.add_argument("--repeats", type=int, default=5, help="timing repeats of finalists and of the noise")
    parser.add_argument("--verify-sets", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deadline-s", type=float, default=300.0, help="whole-run wall-time budget")
    parser.add_argument("--reserve-s", type=float, default=25.0, help="time kept for the end-to-end checks")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    started = time.time()
    deadline = started + args.deadline_s
    args.output_dir.mkdir(parents=True, exist_ok=True)
    from run_tuning import device_info

    report: dict = {**device_info(), "command": " ".join(sys.argv[1:] if argv is None else argv),
                    "input_scale": INPUT_SCALE, "kernels": [], "skipped": [], "end_to_end": []}
    output = args.output_dir / "sass_mugraph.json"

    def save() -> None:
        runs = [k for k in report["kernels"] if "candidates" in k]
        report["candidates_total"] = sum(k["candidates"] for k in runs)
        report["legality_failures_total"] = sum(k["legality_failures"] for k in runs)
        report["rejected_by_static_check_total"] = sum(k["status_counts"].get("rejected", 0) for k in runs)
        report["seconds"] = round(time.time() - started, 1)
        output.write_text(json.dumps(report, indent=1))

    programs = build_programs(args.cases, args.suite)
    report["build_seconds"] = round(time.time() - started, 1)
    jobs = plan(programs)
    results: dict[tuple[str, str], TuneResult] = {}
    for index, job in enumerate(jobs):
        if job.duplicate_of is not None:
            report["kernels"].append({"case": job.case, "kernel": job.kernel,
                                      "same_code_as": job.duplicate_of})
            continue
        left = deadline - args.reserve_s - time.time()
        remaining = sum(1 for later in jobs[index:] if later.duplicate_of is None)
        if left < 25:
            report["skipped"].append(f"{job.case}/{job.kernel}")
            continue
        program = programs[job.case]
        began = time.time()
        try:
            profile = static_profile(Cubin.read(program.cubin), job.kernel)
            move_set = choose_move_set(args.move_set, profile)
            search_s = max(8.0, left / remaining - OVERHEAD_S)
            _, (result,) = tune_program(program, tune_options(args, move_set, search_s), kernels=[job.kernel],
                                        scale=INPUT_SCALE)
        except Exception as error:  # noqa: BLE001 - record and go on with the other kernels
            log.exception("%s/%s failed", job.case, job.kernel)
            report["kernels"].append({"case": job.case, "kernel": job.kernel,
                                      "error": _error_text(error)})
            save()
            continue
        results[(job.case, job.kernel)] = result
        summary = kernel_summary(job, result, profile, move_set, time.time() - began)
        report["kernels"].append(summary)
        log.info("%-12s %-12s %-4s legal %5d  candidates %3d  failures %d  gain %+.2f%% ± %.2f%% "
                 "(noise ± %.2f%%)  %s", job.case, job.kernel, move_set.value,
                 profile["legal_moves"][f"{move_set.value}_repaired"], summary["candidates"],
                 summary["legality_failures"], summary["gain_percent"], summary["spread_percent"],
                 summary["noise_percent"], "taken" if summary["taken"] else "kept: " + summary["decision"])
        save()
    for case, program in programs.items():
        verified = {kernel: result.best.text(kernel) for (name, kernel), result in results.items()
                    if name == case and result.verification.status is CandidateStatus.OK
                    and result.best.data != result.original.data}
        taken = {kernel: text for kernel, text in verified.items()
                 if decide(results[(case, kernel)]).accepted}
        for label, texts in (("taken", taken), ("verified faster median", verified)):
            if not texts or (label != "taken" and texts == taken):
                continue
            try:
                check = {"case": case, **end_to_end(program, texts, label)}
            except Exception as error:  # noqa: BLE001
                log.exception("%s end-to-end check failed", case)
                check = {"case": case, "schedules": label, "error": _error_text(error)}
            report["end_to_end"].append(check)
            log.info("%s end to end (%s): %s", case, label, {k: v for k, v in check.items() if k != "case"})
            save()
    save()
    log.info("candidates %d, legality failures %d, skipped %s", report["candidates_total"],
             report["legality_failures_total"], report["skipped"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
