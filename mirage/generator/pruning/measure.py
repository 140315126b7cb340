"""Measure the subexpression check on the benchmark suite: saturation, query latency, precision.

``python -m mirage.generator.pruning.measure`` prints a markdown report (``docs/pruning.md`` quotes
it).  Per benchmark program:

* **saturation**: time, stop reason and e-graph size of each back end (and of egglog with Mirage's
  factor-chain rules added, to show why they are off by default);
* **query latency** after saturation: median and p99 of first-time queries (what the search pays
  for a new candidate term; sub-terms seen before are memoized) and of repeated queries (cache);
* **precision**: random shape-valid µGraph prefixes, built by random walks over the search's op
  menu (``SearchSpace``) at the kernel level from the reference's inputs and at the block level on
  the hand-built µGraph's first block header.  ``prefixes pruned`` is the fraction of random
  prefixes with some tensor the check rejects; ``extensions pruned`` is the fraction of random
  one-op extensions of *surviving* prefixes that it rejects (what the search sees).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from mirage.errors import GraphError
from mirage.generator import abstract_expr as ae
from mirage.generator.egraph_subexpression import Backend, SubexpressionCheck, SubexpressionConfig
from mirage.generator.pruning.candidate import Candidate, tensor_terms
from mirage.mugraph import build
from mirage.mugraph.graph import BlockGraph, KernelGraph, Ref
from mirage.mugraph.ops import REGISTRY, Op

logger = logging.getLogger(__name__)


@dataclass
class Walks:
    """Counters of the random walks of one benchmark at one level."""

    prefixes: int = 0
    prefixes_pruned: int = 0
    extensions: int = 0
    extensions_pruned: int = 0
    query_seconds: list[float] = field(default_factory=list)  # first-time queries

    def add(self, other: Walks) -> None:
        self.prefixes += other.prefixes
        self.prefixes_pruned += other.prefixes_pruned
        self.extensions += other.extensions
        self.extensions_pruned += other.extensions_pruned
        self.query_seconds += other.query_seconds


def _timed_query(check: SubexpressionCheck, candidate: Candidate, walks: Walks) -> bool:
    term = candidate.term
    assert term is not None, "random extensions always have a term"
    fresh = term not in check._answers
    start = time.perf_counter()
    answer = check.contains(term)
    if fresh:
        walks.query_seconds.append(time.perf_counter() - start)
    return answer


def _random_extension(graph, choices, rng: random.Random, input_terms) -> Candidate | None:
    """A random shape-valid one-op extension of ``graph`` (None after 200 failed draws)."""
    refs = graph.refs()
    for _ in range(200):
        choice = rng.choice(choices)
        arity = REGISTRY[choice.op].arity or 2
        operands = tuple(rng.choice(refs) for _ in range(arity))
        try:
            build.infer(graph, choice.op, operands, choice.attrs)
        except GraphError:
            continue
        candidate = Candidate.extend(graph, choice.op, operands, choice.attrs, input_terms=input_terms)
        if candidate.term is not None:
            return candidate
    return None


def random_walks(
    base, choices, check: SubexpressionCheck, rng: random.Random, walks: int, depth: int, input_terms=None
) -> Walks:
    """Unconstrained walks (prefix precision) and walks through survivors (extension precision)."""
    result = Walks()
    for _ in range(walks):
        graph, pruned = base, False
        for _ in range(depth):  # any random prefix: pruned once one of its tensors is rejected
            candidate = _random_extension(graph, choices, rng, input_terms)
            if candidate is None:
                break
            pruned |= not _timed_query(check, candidate, result)
            result.prefixes += 1
            result.prefixes_pruned += pruned
            graph, _ = build.append(graph, candidate.op, _refs(graph, candidate), candidate.attrs)
        graph = base
        for _ in range(depth):  # the search's view: extend only surviving prefixes
            for _ in range(20):
                candidate = _random_extension(graph, choices, rng, input_terms)
                if candidate is None:
                    break
                result.extensions += 1
                if _timed_query(check, candidate, result):
                    graph, _ = build.append(graph, candidate.op, _refs(graph, candidate), candidate.attrs)
                    break
                result.extensions_pruned += 1
    return result


def _refs(graph, candidate: Candidate) -> tuple[Ref, ...]:
    refs = graph.refs()
    return tuple(refs[i] for i in candidate.inputs)


def _inputs_only(graph: KernelGraph) -> KernelGraph:
    return KernelGraph(tuple(n for n in graph.nodes if n.op is Op.INPUT), (), graph.name)


def _block_base(fused: KernelGraph) -> tuple[BlockGraph, list[ae.Term]] | None:
    terms = tensor_terms(fused)
    for node in fused.nodes:
        if isinstance(node.attrs, BlockGraph):  # the first graph-defined op
            inputs = tuple(n for n in node.attrs.nodes if n.op is Op.INPUT)
            return dataclasses.replace(node.attrs, nodes=inputs), [terms[r] for r in node.inputs]
    return None


def _percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else float("nan")


def measure_program(case, backends: Sequence[Backend], walks: int, depth: int, seed: int) -> dict:
    from mirage.generator.expressions import output_terms
    from mirage.generator.space import SearchSpace

    reference, fused = case.reference(), case.fused()
    targets = output_terms(reference)
    space = SearchSpace.named(case.config)
    row: dict = {"program": case.program, "case": case.name, "saturation": {}, "latency_us": {}}
    configs = {backend.value: SubexpressionConfig(backend=backend) for backend in backends}
    configs["egglog+factor-chains"] = SubexpressionConfig(factor_chains=True)
    checks = {}
    for name, config in configs.items():
        check = SubexpressionCheck(targets, config)
        report = check.saturation
        row["saturation"][name] = {
            "stop": report.stop_reason.value,
            "iterations": report.iterations,
            "nodes": report.nodes,
            "ms": round(report.seconds * 1e3, 1),
        }
        checks[name] = check
    for backend in backends:
        check = checks[backend.value]
        rng = random.Random(seed)
        kernel = random_walks(_inputs_only(reference), space.kernel_ops, check, rng, walks, depth)
        block_base = _block_base(fused)
        block = Walks()
        if block_base is not None:
            base, input_terms = block_base
            block = random_walks(base, space.block_ops, check, rng, walks, depth + 2, input_terms)
        both = Walks()
        both.add(kernel)
        both.add(block)
        repeats = list(check._answers)[:500]
        start = time.perf_counter()
        for term in repeats:
            check.contains(term)
        cached_us = (time.perf_counter() - start) / max(len(repeats), 1) * 1e6
        row["latency_us"][backend.value] = {
            "queries": len(both.query_seconds),
            "median": round(statistics.median(both.query_seconds) * 1e6, 1),
            "p99": round(_percentile(both.query_seconds, 0.99) * 1e6, 1),
            "cached": round(cached_us, 2),
        }
        if backend is backends[0]:
            row["precision"] = {
                level: {
                    "prefixes": w.prefixes,
                    "prefixes_pruned": round(w.prefixes_pruned / max(w.prefixes, 1), 3),
                    "extensions": w.extensions,
                    "extensions_pruned": round(w.extensions_pruned / max(w.extensions, 1), 3),
                }
                for level, w in (("kernel", kernel), ("block", block))
            }
    return row


def markdown(rows: list[dict]) -> str:
    names = list(rows[0]["saturation"])
    lines = ["### Saturation (ms, stop reason, e-nodes)", ""]
    lines.append("| program | " + " | ".join(names) + " |")
    lines.append("|---" * (len(names) + 1) + "|")
    for row in rows:
        cells = [f"{s['ms']} ({s['stop']}, {s['nodes']})" for s in row["saturation"].values()]
        lines.append(f"| {row['program']} | " + " | ".join(cells) + " |")
    backends = list(rows[0]["latency_us"])
    lines += ["", "### Query latency after saturation (µs): median / p99 of first-time queries; cached", ""]
    lines.append("| program | " + " | ".join(backends) + " |")
    lines.append("|---" * (len(backends) + 1) + "|")
    for row in rows:
        cells = [
            f"{s['median']} / {s['p99']} ({s['queries']} queries); {s['cached']}"
            for s in row["latency_us"].values()
        ]
        lines.append(f"| {row['program']} | " + " | ".join(cells) + " |")
    lines += ["", "### Precision: fraction pruned (random prefixes / one-op extensions of survivors)", ""]
    lines.append("| program | kernel prefixes | kernel extensions | block prefixes | block extensions |")
    lines.append("|---|---|---|---|---|")
    for row in rows:
        p = row["precision"]
        lines.append(
            f"| {row['program']} | {p['kernel']['prefixes_pruned']:.1%} of {p['kernel']['prefixes']} "
            f"| {p['kernel']['extensions_pruned']:.1%} of {p['kernel']['extensions']} "
            f"| {p['block']['prefixes_pruned']:.1%} of {p['block']['prefixes']} "
            f"| {p['block']['extensions_pruned']:.1%} of {p['block']['extensions']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="gqa_b1,qknorm_b1,rmsnorm_b1,ntrans_b1,lora_m16,gatedmlp_m1")
    parser.add_argument("--backends", default="egglog,python")
    parser.add_argument("--walks", type=int, default=200)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the measurements to this file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("mirage").setLevel(logging.INFO)
    from benchmarks.mugraphs import CASES

    backends = [Backend(name) for name in args.backends.split(",")]
    rows = []
    for name in args.cases.split(","):
        logger.info("measuring %s", name)
        rows.append(measure_program(CASES[name], backends, args.walks, args.depth, args.seed))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)
    sys.stdout.write(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
