"""Mutation fuzzing of the verifier on the benchmark µGraphs.

For every benchmark case: wrong mutants of the fused and reference graphs (and of equivalent
variants of them) must be rejected by ``verify`` whenever the float check confirms that they are
not equivalent; equivalent variants (commuted operands, other grid and for-loop splits) must all be
accepted.  Results go to a JSON file::

    python -m mirage.verifier.fuzz --mutants 10000 --equivalents 30 \\
        --output benchmarks/results/verifier_fuzz.json
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import platform
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from mirage.mugraph.graph import KernelGraph
from mirage.verifier.errors import NotVerifiableError
from mirage.verifier.floating_point import FloatChecker
from mirage.verifier.mutate import Mutation, valid_mutants
from mirage.verifier.verify import Verifier

logger = logging.getLogger(__name__)

# relative cost of one mutant per case (a fused-graph fingerprint at full shape), for the quotas
CASE_WEIGHTS = {
    "lora_m16": 3.0, "ntrans_b1": 3.0, "ntrans_b8": 3.0, "gqa_b1": 1.0, "qknorm_b1": 1.0,
    "rmsnorm_b1": 1.0, "rmsnorm_b8": 0.5, "gatedmlp_m1": 0.5, "gatedmlp_m8": 0.5, "gqa_b8": 0.25,
    "qknorm_b8": 0.25,
}


@dataclass
class CaseReport:
    case: str
    mutants_confirmed: int = 0  # float check says not equivalent
    mutants_rejected: int = 0  # ... and verify rejected them
    mutants_accepted: list[str] = field(default_factory=list)  # verify accepted a confirmed mutant: a bug
    float_equivalent: int = 0  # the mutation did not change the function (in floating point)
    not_fingerprintable: int = 0  # e.g. a duplicated exp: verify refuses, float check only
    by_kind: dict[str, int] = field(default_factory=dict)  # confirmed mutants per mutation kind
    equivalents_checked: int = 0
    equivalents_accepted: int = 0
    equivalents_rejected: list[str] = field(default_factory=list)
    variants_not_equivalent: int = 0  # split edits the float check refuted (not used as equivalents)
    seconds_per_mutant: float = 0.0
    seconds: float = 0.0


class _Pool:
    """Valid single mutants of each graph met so far (computing them rebuilds every edit)."""

    def __init__(self) -> None:
        self._cache: dict[tuple[KernelGraph, bool], list[tuple[Mutation, KernelGraph]]] = {}

    def options(self, graph: KernelGraph, equivalent: bool = False) -> list[tuple[Mutation, KernelGraph]]:
        key = (graph, equivalent)
        if key not in self._cache:
            if len(self._cache) > 2000:
                self._cache.clear()
            self._cache[key] = valid_mutants(graph, equivalent)
        return self._cache[key]


def equivalent_variants(graphs: list[KernelGraph], pool: _Pool, limit: int,
                        chooser: random.Random) -> list[tuple[str, KernelGraph]]:
    """First- and second-order equivalent edits of ``graphs`` (distinct, at most ``limit``)."""
    seen = set(graphs)
    first: list[tuple[str, KernelGraph]] = []
    for graph in graphs:
        for mutation, variant in pool.options(graph, equivalent=True):
            if variant not in seen:
                seen.add(variant)
                first.append((mutation.detail, variant))
    second: list[tuple[str, KernelGraph]] = []
    for detail, graph in first:
        for mutation, variant in pool.options(graph, equivalent=True):
            if variant not in seen:
                seen.add(variant)
                second.append((f"{detail}; {mutation.detail}", variant))
    chooser.shuffle(second)
    return (first + second)[:limit]


def fuzz_case(name: str, mutants: int, equivalents: int, seed: int, time_limit: float) -> CaseReport:
    from benchmarks.mugraphs import CASES

    case = CASES[name]
    reference, fused = case.reference(), case.fused()
    report = CaseReport(name)
    start = time.perf_counter()
    chooser = random.Random(seed)
    pool = _Pool()
    verifier = Verifier(reference, seed=seed, input_cache_bytes=2 * 2**30)
    checker = FloatChecker(reference, seed=seed)
    candidates = equivalent_variants([fused, reference], pool, max(2 * equivalents, 16), chooser)
    variants = []
    for detail, variant in candidates:
        if checker.check(variant).equivalent:
            variants.append((detail, variant))
        else:
            report.variants_not_equivalent += 1
    for detail, variant in tqdm(variants[:equivalents], desc=f"{name} equivalents", leave=False):
        report.equivalents_checked += 1
        result = verifier.verify(variant)
        if result.equivalent:
            report.equivalents_accepted += 1
        else:
            report.equivalents_rejected.append(detail)
            logger.error("%s: verify rejected an equivalent variant (%s)", name, detail)
    bases = [fused, reference] + [graph for _, graph in variants]
    seen: set[KernelGraph] = set(bases)
    kinds: collections.Counter[str] = collections.Counter()
    mutant_seconds, attempts = 0.0, 0
    progress = tqdm(total=mutants, desc=f"{name} mutants", leave=False)
    while report.mutants_confirmed < mutants and time.perf_counter() - start < time_limit:
        attempts += 1
        if attempts > 50 * mutants:
            break
        graph = chooser.choice(bases[:2]) if chooser.random() < 0.5 else chooser.choice(bases)
        applied: list[Mutation] = []
        for _ in range(chooser.choice((1, 1, 2, 3))):
            options = pool.options(graph)
            if not options:
                break
            mutation, graph = chooser.choice(options)
            applied.append(mutation)
        if not applied or graph in seen:
            continue
        seen.add(graph)
        began = time.perf_counter()
        if checker.check(graph).equivalent:
            report.float_equivalent += 1
            continue
        try:
            result = verifier.verify(graph)
        except NotVerifiableError:
            report.not_fingerprintable += 1
            continue
        mutant_seconds += time.perf_counter() - began
        report.mutants_confirmed += 1
        progress.update(1)
        for mutation in applied:
            kinds[mutation.kind.value] += 1
        if result.equivalent:
            description = "; ".join(f"{m.kind.value} {m.site} {m.detail}" for m in applied)
            report.mutants_accepted.append(description)
            logger.error("%s: verify accepted a wrong mutant: %s", name, description)
        else:
            report.mutants_rejected += 1
    progress.close()
    report.by_kind = dict(sorted(kinds.items()))
    report.seconds_per_mutant = mutant_seconds / max(1, report.mutants_confirmed)
    report.seconds = time.perf_counter() - start
    return report


@dataclass
class Throughput:
    case: str
    guarantee: str
    tests_run: int
    error_bound: float
    candidate_seconds_per_test: float  # one test of the fused graph, the reference's side cached
    reference_seconds_per_test: float  # random inputs plus the reference's fingerprint, once per test
    tests_per_second: float  # candidate tests per second with the reference cached (the search's case)
    verify_seconds: float  # one fresh verify() call, end to end


def measure_throughput(name: str, repeats: int = 3, seed: int = 0) -> Throughput:
    """Time verification of a benchmark's fused graph against its reference."""
    from benchmarks.mugraphs import CASES

    case = CASES[name]
    reference, fused = case.reference(), case.fused()
    began = time.perf_counter()
    result = Verifier(reference, seed=seed).verify(fused)
    verify_seconds = time.perf_counter() - began
    verifier = Verifier(reference, seed=seed + 1, input_cache_bytes=4 * 2**30)
    began = time.perf_counter()
    verifier.reference_fingerprints(0)
    reference_seconds = time.perf_counter() - began
    candidate = []
    for _ in range(repeats):
        began = time.perf_counter()
        verifier.fingerprints(fused, 0)
        candidate.append(time.perf_counter() - began)
    best = min(candidate)
    return Throughput(name, result.guarantee.value, result.tests_run, float(result.error_bound or 0.0), best,
                      reference_seconds, 1.0 / best, verify_seconds)


def quotas(total: int, names: list[str]) -> dict[str, int]:
    weights = {name: CASE_WEIGHTS.get(name, 1.0) for name in names}
    scale = total / sum(weights.values())
    out = {name: int(round(w * scale)) for name, w in weights.items()}
    out[names[0]] += total - sum(out.values())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mirage.verifier.fuzz",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--mutants", type=int, default=10000, help="confirmed wrong mutants, in total")
    parser.add_argument("--equivalents", type=int, default=30,
                        help="equivalent variants per case (fewer where fewer exist)")
    parser.add_argument("--cases", nargs="*", default=None, help="benchmark cases (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--case-time-limit", type=float, default=1800.0, help="seconds per case")
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/verifier_fuzz.json"))
    parser.add_argument("--resume", action="store_true",
                        help="keep the cases already in --output and run only the others")
    parser.add_argument("--throughput", action="store_true",
                        help="instead of fuzzing, time verification of each fused benchmark graph")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from benchmarks.mugraphs import CASES

    names = args.cases or list(CASES)
    if args.throughput:
        rows = []
        for name in tqdm(names, desc="throughput"):
            rows.append(measure_throughput(name, seed=args.seed))
            logger.info("%s", rows[-1])
        load = os.getloadavg() if hasattr(os, "getloadavg") else None
        document = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "load_average": load,
                    "rows": [asdict(r) for r in rows]}
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(document, indent=2) + "\n")
        return 0
    mutant_quota = quotas(args.mutants, names)
    done = {}
    if args.resume and args.output.exists():
        done = {c["case"]: CaseReport(**c) for c in json.loads(args.output.read_text())["cases"]}
    reports, deficit = [], 0
    for index, name in enumerate(names):
        if name in done:  # kept from an earlier run of the same command
            report = done[name]
        else:
            # a case whose space of mutants ran out hands its shortfall to the next ones
            report = fuzz_case(name, mutant_quota[name] + deficit, args.equivalents, args.seed + index,
                               args.case_time_limit)
        deficit = max(0, deficit + mutant_quota[name] - report.mutants_confirmed)
        logger.info("%s: %d confirmed mutants, %d rejected, %d accepted; %d/%d equivalents accepted "
                    "(%.0f s)", name, report.mutants_confirmed, report.mutants_rejected,
                    len(report.mutants_accepted), report.equivalents_accepted, report.equivalents_checked,
                    report.seconds)
        reports.append(report)
        _write(args.output, reports, args)
    total = sum(r.mutants_confirmed for r in reports)
    accepted = sum(len(r.mutants_accepted) for r in reports)
    equivalent_ok = sum(r.equivalents_accepted for r in reports)
    equivalent_total = sum(r.equivalents_checked for r in reports)
    logger.info("total: %d confirmed mutants, %d accepted by verify; %d/%d equivalents accepted",
                total, accepted, equivalent_ok, equivalent_total)
    return 0 if accepted == 0 and equivalent_ok == equivalent_total else 1


def _write(path: Path, reports: list[CaseReport], args) -> None:
    kinds: collections.Counter[str] = collections.Counter()
    for r in reports:
        kinds.update(r.by_kind)
    summary = {
        "mutants_confirmed": sum(r.mutants_confirmed for r in reports),
        "mutants_rejected": sum(r.mutants_rejected for r in reports),
        "mutants_accepted": sum(len(r.mutants_accepted) for r in reports),
        "equivalents_checked": sum(r.equivalents_checked for r in reports),
        "equivalents_accepted": sum(r.equivalents_accepted for r in reports),
        "mutation_kinds": dict(sorted(kinds.items())),
    }
    document = {
        "command": f"python -m mirage.verifier.fuzz --mutants {args.mutants} "
                   f"--equivalents {args.equivalents} --seed {args.seed}",
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}",
        "summary": summary,
        "cases": [asdict(r) for r in reports],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
