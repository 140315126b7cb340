"""Run the benchmark suite end to end on the GPU and write JSON, a markdown table and a bar chart.

    python -m benchmarks.run --out benchmarks/results [--cases gqa_b1,rmsnorm_b1] [--ours superoptimize]

Every variant of a case runs in the same process on the same inputs; timing is by CUDA-graph
replays (``mirage.codegen.profile.time_graph``).  ``limit = max(roofline, launch floor)`` with the
copy bandwidth and the launch floor measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import traceback
from pathlib import Path

import torch

from benchmarks.suite import WORKLOADS, Workload, sdpa_baselines
from mirage.codegen.profile import copy_bandwidth, device_facts, launch_floor, time_graph

log = logging.getLogger("benchmarks")


def ours(workload: Workload, inputs, mode: str, search: bool = True) -> dict:
    """Our callables for ``workload`` by name: ``mirage`` through the builder path (profile-guided
    selection among the case's family) and/or ``mirage_torch`` through ``mi.superoptimize`` on the
    PyTorch program (search cached; the family given as candidates, so that both paths can pick the
    same kernels)."""
    out = {}
    if mode in ("select", "both"):
        out["mirage"] = select_builder(workload, inputs)
    if mode in ("superoptimize", "both"):
        import mirage as mi
        from benchmarks.variants import variants

        # QKNorm's rms(k, dim=1) normalizes over a dim that is not the last: its float32 squares and
        # sums stay in the graph, which the default (upcasts="exact") keeps in PyTorch. The fused
        # candidates hold them at the inputs' precision (float16, float32 accumulators): that
        # precision contract is upcasts="input_precision". The other cases keep the defaults.
        options = {"upcasts": "input_precision"} if workload.program == "qknorm" else {}
        module = mi.superoptimize(workload.function, inputs, candidates=variants(workload.name),
                                  search=search, **options)
        CHOICES[workload.name] = {
            name: {"source": c.source, "detail": c.detail, "graph_hash": c.graph.content_hash()}
            for spec in module.specializations for name, c in spec.choices.items()
        }
        out["mirage" if mode == "superoptimize" else "mirage_torch"] = module
    if mode not in ("select", "superoptimize", "both", "none"):
        raise ValueError(f"unknown --ours mode {mode!r}")
    return out


CHOICES: dict[str, dict] = {}


def select_builder(workload: Workload, inputs):
    """The builder path: profile-guided selection among the fused µGraph family of the case."""
    from benchmarks.mugraphs import CASES
    from benchmarks.variants import variants
    from mirage.codegen.select import select_fastest

    case = CASES[workload.name]
    reference = case.reference()
    views = [x.reshape(t.shape) for x, t in zip(inputs, reference.input_types, strict=True)]
    selection = select_fastest(reference, variants(workload.name), views, stages=SELECT_STAGES)
    SELECTIONS[workload.name] = selection.as_dict()
    program = selection.program

    def run(*xs):
        return program.launch([x.reshape(t.shape) for x, t in zip(xs, reference.input_types, strict=True)])[0]

    return run


SELECT_STAGES = (2, 3)
SELECTIONS: dict[str, dict] = {}


def check(fn, expected, name) -> float:
    out = fn()
    out = out[0] if isinstance(out, (list, tuple)) else out
    out = out.reshape(expected.shape).double()
    error = float((out - expected).norm() / expected.norm())
    if not math.isfinite(error) or error > 2e-2:
        raise AssertionError(f"{name}: relative error {error:.3g} against the float64 reference")
    return error


def run_case(workload: Workload, mode: str, floor: float, bandwidth: float, search: bool = True) -> dict:
    inputs = workload.inputs()
    fn = workload.function
    expected = fn(*[x.double() for x in inputs])
    variants = {"eager": lambda: fn(*inputs)}
    compiled = torch.compile(fn, mode="max-autotune-no-cudagraphs")
    variants["torch_compile"] = lambda: compiled(*inputs)
    for name, run in sdpa_baselines(workload, inputs).items():
        variants[name] = run
    row: dict = {"case": workload.name, "times_us": {}, "errors": {}, "failures": {}}
    try:
        for name, mine in ours(workload, inputs, mode, search).items():
            variants[name] = lambda mine=mine: mine(*inputs)
        if workload.name in SELECTIONS:
            row["selection"] = SELECTIONS[workload.name]
        if workload.name in CHOICES:
            row["torch_path_choices"] = CHOICES[workload.name]
    except Exception as error:  # noqa: BLE001 - recorded, never hidden
        row["failures"]["mirage"] = f"{type(error).__name__}: {error}"
        log.warning("%s: mirage failed: %s", workload.name, traceback.format_exc())
    for name, variant in variants.items():
        try:
            row["errors"][name] = check(variant, expected, name)
            row["times_us"][name] = time_graph(variant).as_dict()
        except Exception as error:  # noqa: BLE001
            row["failures"][name] = f"{type(error).__name__}: {str(error)[:300]}"
    baselines = {k: v["median_us"] for k, v in row["times_us"].items() if not k.startswith("mirage")}
    row["best_baseline"] = min(baselines, key=baselines.get) if baselines else None
    row["best_us"] = min(baselines.values()) if baselines else None
    roofline = workload.min_bytes() / bandwidth * 1e6
    row["roofline_us"], row["launch_floor_us"] = roofline, floor
    row["limit_us"] = max(roofline, floor)
    if "mirage" in row["times_us"] and row["best_us"]:
        t = row["times_us"]["mirage"]["median_us"]
        row["speedup"] = row["best_us"] / t
        row["of_limit"] = row["limit_us"] / t
    return row


def merge(results: list[dict]) -> dict:
    """Suite files of one machine, timed in several calls (each case in one of them), as one: the
    first call's facts, and ``calls`` recording each call's cases, bandwidth and launch floor (each
    case's limit keeps its own call's)."""
    devices = {r["facts"]["device"] for r in results}
    if len(devices) != 1:
        raise SystemExit(f"suite files from different devices ({sorted(devices)}) do not merge")
    seen = [c["case"] for r in results for c in r["cases"]]
    if len(seen) != len(set(seen)):
        raise SystemExit(f"a case appears in more than one file: {sorted(seen)}")
    calls = [call for r in results for call in r.get("calls") or [{
        "cases": [c["case"] for c in r["cases"]], "bandwidth_bytes_per_s": r["bandwidth_bytes_per_s"],
        "launch_floor_us": r["launch_floor_us"]}]]
    order = {w.name: k for k, w in enumerate(WORKLOADS)}
    cases = sorted((c for r in results for c in r["cases"]), key=lambda c: order.get(c["case"], len(order)))
    first = results[0]
    return {"facts": first["facts"], "bandwidth_bytes_per_s": first["bandwidth_bytes_per_s"],
            "launch_floor_us": first["launch_floor_us"], "calls": calls, "cases": cases}


def fastest_baselines(result: dict, others: list[dict]) -> dict:
    """Each case's fastest baseline over ``result`` and ``others`` (more calls on the same device), and
    the speedups and their geometric mean against it: a baseline's own pick moves between calls
    (torch.compile's autotuning), so one call's mean carries that noise."""
    devices = {r["facts"]["device"] for r in (result, *others)}
    if len(devices) != 1:
        raise SystemExit(f"suite files from different devices ({sorted(devices)}) compare no baselines")
    fastest: dict[str, float] = {}
    for suite in (result, *others):
        for row in suite["cases"]:
            for name, timing in row["times_us"].items():
                if not name.startswith("mirage") and timing["median_us"] < fastest.get(row["case"], math.inf):
                    fastest[row["case"]] = timing["median_us"]
    speedups = {row["case"]: fastest[row["case"]] / row["times_us"]["mirage"]["median_us"]
                for row in result["cases"] if row["case"] in fastest and "mirage" in row["times_us"]}
    geo = math.exp(sum(math.log(s) for s in speedups.values()) / len(speedups)) if speedups else None
    return {"files": 1 + len(others), "best_us": fastest, "speedup": speedups, "geometric_mean": geo}


def write_reports(result: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stem = f"suite_{result['facts']['date']}"
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    names = ["eager", "torch_compile", "sdpa_flash", "mirage"]
    if any("mirage_torch" in r["times_us"] for r in result["cases"]):
        names.append("mirage_torch")
    calls = result.get("calls") or [{"cases": [r["case"] for r in result["cases"]],
                                      "bandwidth_bytes_per_s": result["bandwidth_bytes_per_s"],
                                      "launch_floor_us": result["launch_floor_us"]}]
    measured = "; ".join(
        (f"{', '.join(c['cases'])}: " if len(calls) > 1 else "")
        + f"copy bandwidth {c['bandwidth_bytes_per_s'] / 1e12:.2f} TB/s, "
        f"launch floor {c['launch_floor_us']:.2f} µs"
        for c in calls)
    lines = [f"Device {result['facts']['device']}, driver {result['facts']['driver']}, torch "
             f"{result['facts']['torch']}, {result['facts']['date']}"
             + (f", timed in {len(calls)} calls" if len(calls) > 1 else "") + f". {measured}.",
             "", "| case | " + " | ".join(names) + " | best | limit | speedup | of limit |",
             "|" + " --- |" * (len(names) + 5)]
    speedups = []
    for row in result["cases"]:
        cells = [f"{row['times_us'][n]['median_us']:.2f}" if n in row["times_us"] else "–" for n in names]
        sp = row.get("speedup")
        if sp:
            speedups.append(sp)
        lines.append(f"| {row['case']} | " + " | ".join(cells) + f" | {_fmt(row['best_us'])} | "
                     f"{_fmt(row['limit_us'])} | {_fmt(sp)} | {_fmt(row.get('of_limit'))} |")
    if speedups:
        geo = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
        lines += ["", f"Geometric mean speedup over the best baseline: {geo:.2f} ({len(speedups)} cases)."]
    across = result.get("baselines_across_calls")
    if across and across["geometric_mean"]:
        lines += ["", f"Against the fastest baseline of each case in any of {across['files']} suite files of "
                  "this machine (this one and those of --baselines-from): "
                  f"{across['geometric_mean']:.2f} (" + ", ".join(
                      f"{c} {s:.2f}" for c, s in across["speedup"].items()) + ")."]
    failures = [(r["case"], k, v) for r in result["cases"] for k, v in r["failures"].items()]
    if failures:
        lines += ["", "Failures:"] + [f"- {c} / {k}: {v}" for c, k, v in failures]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    _chart(result, out / f"{stem}.png")


def _fmt(value) -> str:
    return "–" if value is None else f"{value:.2f}"


def _chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [r["case"] for r in result["cases"]]
    names = ["eager", "torch_compile", "sdpa_flash", "mirage"]
    fig, ax = plt.subplots(figsize=(12, 4.5))
    width = 0.8 / (len(names) + 1)
    for k, name in enumerate(names + ["limit"]):
        values = [(r["limit_us"] if name == "limit" else r["times_us"].get(name, {}).get("median_us", 0))
                  for r in result["cases"]]
        ax.bar([i + k * width for i in range(len(cases))], values, width, label=name)
    ax.set_xticks([i + 0.4 for i in range(len(cases))], cases, rotation=30, ha="right")
    ax.set_ylabel("µs per call (median, CUDA-graph replays)")
    ax.set_yscale("log")
    ax.legend(ncol=5, fontsize=8)
    ax.set_title(f"{result['facts']['device']} — {result['facts']['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--ours", default="superoptimize",
                        choices=["superoptimize", "select", "both", "none"],
                        help="both: the builder path (mirage) and the PyTorch path (mirage_torch) in one run")
    parser.add_argument("--no-search", action="store_true",
                        help="PyTorch path: no search, only the family given as candidates")
    parser.add_argument("--merge", nargs="+", metavar="JSON", default=None,
                        help="no timing: merge suite files of one machine (split runs) into --out")
    parser.add_argument("--baselines-from", nargs="+", metavar="JSON", default=(),
                        help="with --merge: more suite files of the machine whose baselines count too "
                             "(each case held against its fastest baseline over all of them)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.baselines_from and not args.merge:
        parser.error("--baselines-from needs --merge")
    if args.merge:
        result = merge([json.loads(Path(f).read_text()) for f in args.merge])
        if args.baselines_from:
            result["baselines_across_calls"] = fastest_baselines(
                result, [json.loads(Path(f).read_text()) for f in args.baselines_from])
        write_reports(result, Path(args.out))
        print((Path(args.out) / f"suite_{result['facts']['date']}.md").read_text())
        return 0
    chosen = [w for w in WORKLOADS if not args.cases or w.name in args.cases.split(",")]
    bandwidth, floor = copy_bandwidth(), launch_floor()
    result = {"facts": device_facts(), "bandwidth_bytes_per_s": bandwidth, "launch_floor_us": floor,
              "cases": []}
    for workload in chosen:
        log.info("case %s", workload.name)
        result["cases"].append(run_case(workload, args.ours, floor, bandwidth, not args.no_search))
        write_reports(result, Path(args.out))
    print((Path(args.out) / f"suite_{result['facts']['date']}.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
