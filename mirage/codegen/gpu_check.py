"""The GPU check: run a µGraph's generated kernels and compare with the float64 reference.

``check_on_gpu(graph)`` compiles the graph (or takes a compiled :class:`~mirage.codegen.runtime.Program`),
draws inputs from N(0, scale²) in the graph's dtypes, runs the program with every kernel output
poisoned (NaN) beforehand, so that an element no block writes shows, and compares each output with
``mi.interpret`` of the graph in float64 on the CPU (fed the same, rounded, inputs).

The error of an output is normwise: ``max|gpu − reference| / max|reference|``; it must stay below
the tolerance of the output's dtype (:data:`TOLERANCES`), and every element must be finite where the
reference is. Where the reference lies beyond the dtype's range (a quotient by a value near zero), it
rounds to an infinity: the output must hold that infinity (or the dtype's largest value) of its sign,
and those elements are left out of the error's scale.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mirage.mugraph import patterns
from mirage.mugraph.dtypes import DType
from mirage.mugraph.graph import KernelGraph, split_view

log = logging.getLogger(__name__)

# normwise relative error allowed per output dtype (fp32 matmuls run on TF32 tensor cores)
TOLERANCES: dict[DType, float] = {
    DType.FLOAT16: 1e-2,
    DType.BFLOAT16: 3e-2,
    DType.FLOAT32: 5e-3,
    DType.FLOAT64: 1e-9,
}


@dataclass(frozen=True)
class OutputCheck:
    index: int
    shape: tuple[int, ...]
    dtype: str
    relative_error: float  # max|gpu − ref| / max|ref|
    max_abs_error: float
    reference_max: float
    unwritten: int  # NaN or inf elements where the reference is finite in range, or wrong where it overflows
    tolerance: float

    @property
    def passed(self) -> bool:
        return self.unwritten == 0 and self.relative_error < self.tolerance

    def as_dict(self) -> dict:
        return {
            "index": self.index,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "relative_error": self.relative_error,
            "max_abs_error": self.max_abs_error,
            "reference_max": self.reference_max,
            "unwritten": self.unwritten,
            "tolerance": self.tolerance,
            "passed": self.passed,
        }


@dataclass(frozen=True)
class CheckResult:
    name: str
    outputs: tuple[OutputCheck, ...]
    kernels: int
    run_seconds: float  # first run, loading included
    reference_seconds: float

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    @property
    def worst_error(self) -> float:
        return max((o.relative_error for o in self.outputs), default=0.0)

    @property
    def unwritten(self) -> int:
        """Non-finite output elements where the reference is finite (overflow, or never written)."""
        return sum(o.unwritten for o in self.outputs)

    def failure(self) -> str:
        """Why the check failed, in a few words (empty when it passed)."""
        if self.passed:
            return ""
        if self.unwritten:
            return (f"{self.unwritten} output element(s) NaN or inf where the float64 reference is "
                    f"finite (an overflow, or elements never written)")
        return f"relative error {self.worst_error:.3g}"

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "passed": self.passed,
            "worst_error": self.worst_error,
            "kernels": self.kernels,
            "run_seconds": self.run_seconds,
            "reference_seconds": self.reference_seconds,
            "outputs": [o.as_dict() for o in self.outputs],
        }


def random_inputs(graph: KernelGraph, seed: int = 0, scale: float = 1.0, device: str = "cuda") -> list:
    """Inputs of ``graph`` drawn from N(0, scale²), rounded to each input's dtype; an input that names
    a pattern (mirage.mugraph.patterns) gets the pattern's values, which its generated code may assume,
    and one that names a layout is laid out so (``layout="col"``: a transposed view of a row-major
    tensor; ``strides``: a view with them), as calls pass it."""
    import torch

    from mirage.codegen import column_major

    generator = torch.Generator().manual_seed(seed)
    inputs = []
    for i in graph.input_nodes:
        t, pattern = graph.nodes[i].outputs[0], graph.nodes[i].attrs.pattern
        drawn = torch.randn(t.shape, generator=generator, dtype=torch.float64) * scale
        value = patterns.values(pattern, t.shape, torch.float64) if pattern else drawn
        value = value.to(t.dtype.torch()).to(device)
        attrs = graph.nodes[i].attrs
        if attrs.strides:  # a view; along a dim of stride 0 (a broadcast) its values repeat
            shape, strides = split_view(t.shape, attrs.strides, attrs.splits())  # split dims as two
            value = value.reshape(shape)
            first = tuple(slice(0, 1) if s == 0 else slice(None) for s in strides)
            value = column_major.torch_strided(value[first].expand(shape), strides)
        inputs.append(value.mT.contiguous().mT if attrs.layout == "col" and not attrs.strides else value)
    return inputs


def compare(
    gpu_outputs: Sequence,
    reference_outputs: Sequence[np.ndarray],
    graph: KernelGraph,
    tolerances: dict[DType, float] | None = None,
) -> tuple[OutputCheck, ...]:
    import torch

    tolerances = tolerances or TOLERANCES
    checks = []
    for k, (got, ref, t) in enumerate(zip(gpu_outputs, reference_outputs, graph.output_types, strict=True)):
        got = got.detach().double().cpu().reshape(t.shape).numpy()  # an output of split dims: their view
        ref = np.asarray(ref, dtype=np.float64)
        largest = float(torch.finfo(t.dtype.torch()).max)
        # beyond the dtype's range the reference rounds to an infinity: an overflow of its sign is right
        over = np.isfinite(ref) & (np.abs(ref) > largest)
        finite = np.isfinite(ref) & ~over
        overflowed = over & (np.sign(got) == np.sign(ref)) & (np.abs(got) >= largest)
        bad = int(np.count_nonzero(~np.isfinite(got) & finite) + np.count_nonzero(over & ~overflowed))
        with np.errstate(invalid="ignore"):  # inf - inf where both overflow: left out below
            diff = np.where(finite & np.isfinite(got), np.abs(got - ref), 0.0)
        reference_max = float(np.max(np.abs(ref[finite]), initial=0.0))
        max_abs = float(np.max(diff, initial=0.0))
        relative = max_abs / max(reference_max, 1e-30) if max_abs else 0.0
        checks.append(
            OutputCheck(k, t.shape, t.dtype.value, relative, max_abs, reference_max, bad, tolerances[t.dtype])
        )
    return tuple(checks)


def check_on_gpu(
    graph,
    program=None,
    *,
    inputs: Sequence | None = None,
    seed: int = 0,
    scale: float = 1.0,
    target=None,
    tolerances: dict[DType, float] | None = None,
    name: str = "",
    device: str = "cuda",
    reference: Sequence[np.ndarray] | None = None,
) -> CheckResult:
    """Run ``graph``'s kernels on the GPU and compare with the float64 reference (module docstring).

    ``program``: an already compiled :class:`~mirage.codegen.runtime.Program` of ``graph`` (else it is
    compiled for ``target``, default the current GPU).  ``reference``: ``graph``'s float64 outputs
    on ``inputs`` when already known (checking many programs of one graph interprets it once).
    """
    import torch

    from mirage.codegen.runtime import compile_program
    from mirage.mugraph.builder import as_graph
    from mirage.mugraph.interpret import interpret

    graph = as_graph(graph)
    if program is None:
        program = compile_program(graph, target)
    if inputs is None:
        inputs = random_inputs(graph, seed, scale, device)
    start = time.perf_counter()
    outputs = program.with_poison().launch(list(inputs))
    if any(x.is_cuda for x in inputs):
        torch.cuda.synchronize()
    run_seconds = time.perf_counter() - start
    start = time.perf_counter()
    if reference is None:
        given = [x.detach().cpu().reshape(t.shape)  # a view of split dims as passed
                 for x, t in zip(inputs, graph.input_types, strict=True)]
        reference = interpret(graph, given, dtype=np.float64)
    reference_seconds = time.perf_counter() - start
    result = CheckResult(
        name or graph.name or "graph",
        compare(outputs, reference, graph, tolerances),
        len(program.cuda.kernels),
        run_seconds,
        reference_seconds,
    )
    log.info(
        "%s: %s (worst relative error %.2e)",
        result.name,
        "pass" if result.passed else "FAIL",
        result.worst_error,
    )
    return result


# ---- the suite: every benchmark µGraph, random µGraphs and search results ------------------------
#
#   python -m mirage.codegen.gpu_check compile --random 60 --search FILE --out benchmarks/results   (CPU)
#   python -m mirage.codegen.gpu_check gpu --random 120 --search FILE --out benchmarks/results      (GPU)
#
# ``compile`` generates and compiles every case (nothing runs); ``gpu`` also runs and checks each
# case, in worker processes that are restarted after a CUDA error (which ends a CUDA context).


@dataclass(frozen=True)
class SuiteCase:
    name: str
    group: str  # benchmark, random, odd, search
    graph: KernelGraph
    seed: int = 0
    scale: float = 1.0  # inputs are N(0, scale²)
    baseline: KernelGraph | None = None  # an equivalent graph also interpreted (benchmarks: the unfused one)


BENCHMARK_SCALE = 0.5  # keeps x @ W over 4096-long rows well inside fp16 in the gated MLP


def suite_cases(
    random_count: int = 0, search_file: str | None = None, benchmarks: bool = True, odd_count: int = 0
) -> list[SuiteCase]:
    cases = []
    if benchmarks:
        from benchmarks.mugraphs import CASES, mlp

        cases += [
            SuiteCase(name, "benchmark", c.fused(), 0, BENCHMARK_SCALE, c.reference())
            for name, c in sorted(CASES.items())
        ]
        # the LoRA µGraph with both products in one concat_matmul
        cases.append(
            SuiteCase(
                "lora_m16_concat",
                "benchmark",
                mlp.lora_fused(16, concat=True),
                0,
                BENCHMARK_SCALE,
                mlp.lora_reference(16),
            )
        )
    if random_count or odd_count:
        from mirage.codegen.random_graphs import random_graph

        cases += [SuiteCase(f"random_{s}", "random", random_graph(s).graph, s) for s in range(random_count)]
        cases += [SuiteCase(f"odd_{s}", "odd", random_graph(s, odd=True).graph, s) for s in range(odd_count)]
    if search_file:
        import json

        from mirage.mugraph.serialize import graph_from_dict

        document = json.loads(open(search_file).read())
        for record in document["graphs"] if isinstance(document, dict) else document:
            cases.append(
                SuiteCase(
                    record["name"],
                    "search",
                    graph_from_dict(record["graph"]),
                    0,
                    float(record.get("scale", 1.0)),
                )
            )
    return cases


def _generate_and_build(cases: Sequence[SuiteCase], workers: int | None) -> tuple[dict, dict]:
    """Programs (or the error of each failed stage) of every case."""
    from mirage.codegen.lower_program import generate_cuda_program
    from mirage.codegen.runtime import build_many
    from mirage.errors import MirageError

    programs, failures = {}, {}
    for case in cases:
        try:
            programs[case.name] = generate_cuda_program(case.graph, None)
        except MirageError as error:
            failures[case.name] = ("generate", f"{type(error).__name__}: {error}")
    names = list(programs)
    start = time.perf_counter()
    built = build_many([programs[n] for n in names], max_workers=workers)
    log.info("compiled %d programs in %.0f s", len(names), time.perf_counter() - start)
    compiled = {}
    for name, result in zip(names, built, strict=True):
        if isinstance(result, MirageError):
            failures[name] = ("compile", f"{type(result).__name__}: {str(result)[:4000]}")
        else:
            compiled[name] = result
    return compiled, failures


def _worker(bundle_path: str, results_path: str, start: int) -> None:
    """Run the cases of a bundle from ``start`` on; one JSON line per case; exit 3 after a CUDA error."""
    import json
    import traceback
    from pathlib import Path

    import torch

    from mirage.codegen.lower_program import CudaProgram
    from mirage.codegen.runtime import Program
    from mirage.mugraph.serialize import graph_from_dict

    records = json.loads(Path(bundle_path).read_text())
    with open(results_path, "a") as results:
        for index in range(start, len(records)):
            record = records[index]
            graph = graph_from_dict(record["graph"])
            row = {"index": index, "name": record["name"]}
            try:
                program = Program(
                    CudaProgram.from_dict(record["program"]),
                    Path(record["cubin"]) if record["cubin"] else None,
                )
                inputs = random_inputs(graph, record["seed"], record["scale"], record.get("device", "cuda"))
                check = check_on_gpu(graph, program, inputs=inputs, name=record["name"])
                row.update(check.as_dict())
                if record.get("baseline"):
                    baseline = graph_from_dict(record["baseline"])
                    from mirage.mugraph.interpret import interpret

                    outputs = program.launch(inputs)
                    reference = interpret(baseline, [x.cpu() for x in inputs])
                    row["baseline_error"] = max(
                        c.relative_error for c in compare(outputs, reference, baseline)
                    )
                if record.get("extras"):
                    row.update(_extras(program, inputs))
            except Exception as error:  # noqa: BLE001 - every failure is recorded with its traceback
                row.update(
                    {
                        "passed": False,
                        "stage": "run",
                        "error": f"{type(error).__name__}: {error}",
                        "traceback": traceback.format_exc()[-3000:],
                    }
                )
                results.write(json.dumps(row) + "\n")
                results.flush()
                if "cuda" in f"{type(error).__module__} {error}".lower():
                    raise SystemExit(3) from None  # the CUDA context may be gone: restart
                continue
            results.write(json.dumps(row) + "\n")
            results.flush()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def _extras(program, inputs) -> dict:
    """CUDA-graph capture (replayed output equals the eager one) and the time of one call."""
    import torch

    from mirage.codegen.profile import graph_capture, time_graph

    eager = [o.clone() for o in program.launch(inputs)]
    static: list = []
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        program.launch(inputs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with graph_capture(graph):
        static = program.launch(inputs)
    graph.replay()
    torch.cuda.synchronize()
    same = all(torch.equal(a, b) for a, b in zip(eager, static, strict=True))
    timing = time_graph(lambda: program.launch(inputs))
    return {"cuda_graph_replay_equal": same, "median_us": timing.median_us}


def run_gpu_suite(
    cases: Sequence[SuiteCase],
    directory,
    workers: int | None = None,
    processes: int = 4,
    device: str = "cuda",
) -> list[dict]:
    """Generate, compile, run and check every case; returns one row per case (see the module docs)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from mirage.mugraph.serialize import graph_to_dict

    compiled, failures = _generate_and_build(cases, workers)
    records = [
        {
            "name": c.name,
            "group": c.group,
            "seed": c.seed,
            "scale": c.scale,
            "graph": graph_to_dict(c.graph),
            "program": compiled[c.name].cuda.to_dict(),
            "cubin": str(compiled[c.name].cubin or ""),
            "extras": c.group == "benchmark",
            "device": device,
            "baseline": graph_to_dict(c.baseline) if c.baseline is not None else None,
        }
        for c in cases
        if c.name in compiled
    ]
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    chunks = [chunk for chunk in (records[k::processes] for k in range(processes)) if chunk]
    procs = []
    for k, chunk in enumerate(chunks):
        bundle, results = directory / f"bundle_{k}.json", directory / f"results_{k}.jsonl"
        bundle.write_text(json.dumps(chunk))
        results.write_text("")
        procs.append([bundle, results, 0, None])
    command = [sys.executable, "-m", "mirage.codegen.gpu_check", "worker"]
    while any(p[2] < len(chunks[k]) for k, p in enumerate(procs)):
        for k, p in enumerate(procs):
            if p[3] is None and p[2] < len(chunks[k]):
                p[3] = subprocess.Popen(command + [str(p[0]), str(p[1]), str(p[2])])
        for k, p in enumerate(procs):
            if p[3] is not None and p[3].poll() is not None:
                done = len(p[1].read_text().splitlines())
                if p[3].returncode not in (0, 3) and done == p[2]:
                    with open(p[1], "a") as f:  # the worker died inside this case
                        f.write(
                            json.dumps(
                                {
                                    "name": chunks[k][done]["name"],
                                    "passed": False,
                                    "stage": "run",
                                    "error": f"worker exited with {p[3].returncode}",
                                }
                            )
                            + "\n"
                        )
                    done += 1
                p[2], p[3] = done, None
        time.sleep(0.2)
    rows = {}
    for _, results, _, _ in procs:
        for line in results.read_text().splitlines():
            row = json.loads(line)
            rows[row["name"]] = row
    out = []
    for case in cases:
        row = rows.get(case.name) or {
            "name": case.name,
            "passed": False,
            "stage": failures[case.name][0],
            "error": failures[case.name][1],
        }
        row["group"] = case.group
        out.append(row)
    return out


def run_compile_suite(cases: Sequence[SuiteCase], workers: int | None = None) -> list[dict]:
    """Generate and compile every case (CPU only); one row per case."""
    compiled, failures = _generate_and_build(cases, workers)
    rows = []
    for case in cases:
        if case.name in compiled:
            program = compiled[case.name]
            rows.append(
                {
                    "name": case.name,
                    "group": case.group,
                    "passed": True,
                    "kernels": len(program.cuda.kernels),
                    "smem_bytes": [k.smem_bytes for k in program.cuda.kernels],
                }
            )
        else:
            stage, error = failures[case.name]
            rows.append(
                {"name": case.name, "group": case.group, "passed": False, "stage": stage, "error": error}
            )
    return rows


def _summary(rows: Sequence[dict]) -> dict:
    groups: dict[str, dict] = {}
    for row in rows:
        g = groups.setdefault(row["group"], {"cases": 0, "passed": 0})
        g["cases"] += 1
        g["passed"] += bool(row.get("passed"))
    return groups


def write_report(rows: Sequence[dict], directory, stem: str, facts: dict, title: str) -> tuple:
    """``<stem>.json`` and ``<stem>.md`` in ``directory``: a summary per group and a row per case."""
    import json
    from pathlib import Path

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    summary = _summary(rows)
    json_path, md_path = directory / f"{stem}.json", directory / f"{stem}.md"
    json_path.write_text(
        json.dumps({"facts": facts, "summary": summary, "cases": list(rows)}, indent=1) + "\n"
    )
    lines = [
        f"# {title}",
        "",
        *(f"- {k}: {v}" for k, v in facts.items()),
        "",
        "| group | cases | passed |",
        "|---|---|---|",
    ]
    lines += [f"| {g} | {s['cases']} | {s['passed']} |" for g, s in summary.items()]
    lines += [
        "",
        "| case | group | kernels | passed | worst rel. error | unwritten | CUDA graph | µs | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        unwritten = sum(o.get("unwritten", 0) for o in row.get("outputs", []))
        error = f"{row['worst_error']:.2e}" if "worst_error" in row else ""
        graph = {True: "equal", False: "DIFFERS"}.get(row.get("cuda_graph_replay_equal"), "")
        micro = f"{row['median_us']:.1f}" if "median_us" in row else ""
        note = row.get("error", "").splitlines()[0][:90] if row.get("error") else ""
        if "baseline_error" in row:
            note = f"vs unfused reference {row['baseline_error']:.2e}"
        lines.append(
            f"| {row['name']} | {row['group']} | {row.get('kernels', '')} | "
            f"{'yes' if row.get('passed') else 'NO'} | {error} | {unwritten if 'outputs' in row else ''} | "
            f"{graph} | {micro} | {note} |"
        )
    md_path.write_text("\n".join(lines) + "\n")
    return json_path, md_path


def _host_facts() -> dict:
    import datetime
    import platform

    from mirage.codegen.toolchain import find_nvcc, tool_version

    nvcc = tool_version(find_nvcc()).splitlines()[-1]
    return {
        "host": f"CPU build machine ({platform.machine()}, no GPU)",
        "nvcc": nvcc,
        "date": datetime.date.today().isoformat(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    import argparse
    import datetime
    import sys

    parser = argparse.ArgumentParser(prog="python -m mirage.codegen.gpu_check", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("compile", "gpu"):
        p = sub.add_parser(name)
        p.add_argument("--random", type=int, default=0, help="random µGraphs (seeds 0..N-1)")
        p.add_argument("--odd", type=int, default=0,
                       help="random µGraphs of odd tile dims (padded products; seeds 0..N-1)")
        p.add_argument("--search", default=None, help="JSON file of search results")
        p.add_argument("--no-benchmarks", action="store_true")
        p.add_argument("--out", default="benchmarks/results")
        p.add_argument("--workers", type=int, default=None, help="parallel nvcc processes")
        p.add_argument("--scratch", default=None, help="folder for bundles and worker results (gpu)")
    w = sub.add_parser("worker")
    w.add_argument("bundle")
    w.add_argument("results")
    w.add_argument("start", type=int)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.command == "worker":
        _worker(args.bundle, args.results, args.start)
        return 0
    cases = suite_cases(args.random, args.search, not args.no_benchmarks, args.odd)
    today = datetime.date.today().isoformat()
    if args.command == "compile":
        rows = run_compile_suite(cases, args.workers)
        paths = write_report(
            rows,
            args.out,
            f"codegen_compile_{today}",
            _host_facts(),
            "Generated CUDA compiled for sm_90a (no GPU)",
        )
    else:
        import tempfile

        from mirage.codegen.profile import device_facts

        scratch = args.scratch or tempfile.mkdtemp(prefix="mirage-gpu-check-")
        rows = run_gpu_suite(cases, scratch, args.workers)
        paths = write_report(
            rows,
            args.out,
            f"codegen_gpu_{today}",
            device_facts(),
            "Generated kernels against the float64 reference",
        )
    failed = [r["name"] for r in rows if not r.get("passed")]
    for row in rows:
        if not row.get("passed"):
            detail = row.get("error", "").splitlines()[:1] or [f"worst error {row.get('worst_error', 0):.2e}"]
            log.info("FAILED %s (%s): %s", row["name"], row.get("stage", "check"), detail[0][:300])
    log.info(
        "%d of %d cases passed; wrote %s", len(rows) - len(failed), len(rows), ", ".join(map(str, paths))
    )
    return 1 if failed and not sys.flags.interactive else 0


if __name__ == "__main__":
    raise SystemExit(main())
