"""Where the attention kernel's time goes: the suite's attention members, built as selection builds
them (warpgroup MMAs, K and V copied by TMA) and with parts of the loop taken out, timed kernel by
kernel in one run (timing only: the cut builds compute nothing useful).

* ``as_generated``: the kernel as built;
* ``no_step``: the chain's step removed: the loop only fetches, waits for and hands back K and V;
* ``no_step_no_copies``: both removed: what a block costs besides its loop (the launch, the
  prologue's copies, the write-back of the chain's registers and the output stores); ``frame``: that
  without the write-back;
* ``no_copies``: the loop's copies and waits removed: the chain computes on the stages fetched
  before the loop, over and over (the compute alone);
* ``no_exp2``: every exponential one FMUL instead of the SFU's ``MUFU.EX2`` (``MIRAGE_PROBE_NO_EXP2``);
* ``no_exp2_no_copies``: both;
* ``sub128``: the warpgroup form's sub-tiles of 128 keys where an iteration has them
  (``MIRAGE_WARPGROUP_SUB_KEYS``; a build of its own, not a cut), ``sub128_no_copies`` likewise;
* ``no_qk``, ``no_pv``, ``no_mma`` (each without the copies too): the Q·K warpgroup MMAs, the P·V
  ones or both skipped (``MIRAGE_PROBE_CHAIN``), the rest of the chain kept;
* QKNorm's members whose chain computes the key norms: ``no_norms`` (each factor 1, the key squares
  and their trade skipped: ``MIRAGE_PROBE_CHAIN`` bit 4);
* ``no_lookahead``: each sub-tile's Q·K issued at its own sub-tile (``MIRAGE_SOFTMAX_LOOKAHEAD`` 0; a
  build of its own, not a cut);
* ``ieee``: every ``a / sqrt(b)`` of the thread functions as IEEE square root and division instead
  of ``a · rsqrt(b)`` (``MIRAGE_PROBE_IEEE_DIV_SQRT``; QKNorm's key factors).

    python -m benchmarks.attention_isolate --out benchmarks/results [--cases qknorm_b8] [--cuts a,b] \
        [--member kv_splits=4,q_splits=2,iters=4,threads=256]
"""

from __future__ import annotations

import argparse
import dataclasses

from benchmarks.gemv_isolate import cut
from benchmarks.stream_floor import write_record
from benchmarks.variants import family
from mirage.codegen.gpu_check import random_inputs
from mirage.codegen.profile import device_facts, kernel_times, time_graph
from mirage.codegen.runtime import build_many
from mirage.optimizer import OptimizerOptions

COPIES = (r"in\d+\.load\(iteration \+ \d+\);", r"in\d+\.wait\(iteration\);")
STEP = r"softmax\d+::step\([^;]*\);"
CUTS = {
    "as_generated": (),
    "no_step": (STEP,),
    "no_step_no_copies": (STEP, *COPIES),  # the loop empty: launch, prologue, write-back, stores
    "frame": (STEP, *COPIES, r"softmax\d+::write_back\([^;]*\);"),  # ...and no write-back either
    "no_copies": COPIES,
    "no_exp2": (),
    "no_exp2_no_copies": COPIES,
    "sub128": (),
    "sub128_no_copies": COPIES,
    "no_qk_no_copies": COPIES,
    "no_pv_no_copies": COPIES,
    "no_mma_no_copies": COPIES,
    "no_mma_no_exp2_no_copies": COPIES,
    "no_norms": (),
    "no_norms_no_copies": COPIES,
    "no_lookahead": (),
    "ieee": (),
}
NORM_CUTS = ("no_norms", "no_norms_no_copies")  # only where the chain has key norms
PROBES = {"sub128": "#define MIRAGE_WARPGROUP_SUB_KEYS 128\n",
          "exp2": "#define MIRAGE_PROBE_NO_EXP2 1\n", "qk": "#define MIRAGE_PROBE_CHAIN 1\n",
          "pv": "#define MIRAGE_PROBE_CHAIN 2\n", "mma": "#define MIRAGE_PROBE_CHAIN 3\n",
          "norms": "#define MIRAGE_PROBE_CHAIN 4\n", "lookahead": "#define MIRAGE_SOFTMAX_LOOKAHEAD 0\n",
          "ieee": "#define MIRAGE_PROBE_IEEE_DIV_SQRT 1\n"}


def probes(name: str) -> str:
    """The probe defines of the cut ``name`` (``no_<probe>`` parts)."""
    parts = name.split("_")
    return "".join(define for probe, define in PROBES.items() if f"no_{probe}" in name or probe in parts)
# (case, label parts, stages): the suite's picks (run 17) and the gqa_b8 member of 128 threads
MEMBERS = (
    ("gqa_b8", ("kv_splits=8,q_splits=2,iters=8,threads=256,", "combine_rows=8"), 4),
    ("gqa_b8", ("kv_splits=8,q_splits=2,iters=8,threads=128,", "combine_rows=8"), 4),
    ("gqa_b1", ("kv_splits=16,q_splits=4,iters=2,threads=128,", "combine_rows=8"), 3),
    # half the keys a block (32 key splits): one or two warpgroups; their kernels take as long
    ("gqa_b1", ("kv_splits=32,q_splits=4,iters=2,threads=128,", "combine_rows=8"), 3),
    ("gqa_b1", ("kv_splits=32,q_splits=2,iters=2,threads=256,", "combine_rows=8"), 3),
    # 128 keys an iteration (the first: the suite's pick since the lookahead, run 21)
    ("gqa_b8", ("kv_splits=4,q_splits=2,iters=8,threads=256,", "combine_rows=8"), 4),
    ("gqa_b8", ("kv_splits=16,q_splits=2,iters=2,threads=256,", "combine_rows=8"), 3),
    ("gqa_b8", ("kv_splits=8,q_splits=4,iters=4,threads=128,", "combine_rows=16"), 3),
    # QKNorm's members whose chain computes the key norms
    ("qknorm_b8", ("kv_splits=8,q_splits=2,iters=8,threads=128,", "combine_rows=8,key_scales"), 3),
    ("qknorm_b8", ("kv_splits=8,q_splits=2,iters=8,threads=256,", "combine_rows=8,key_scales"), 3),
    ("qknorm_b1", ("kv_splits=16,q_splits=4,iters=2,threads=128,", "combine_rows=8,key_scales"), 3),
    # 256 keys an iteration (the wide family's): four 64-key sub-tiles, three Q·K waits behind softmax
    ("gqa_b8", ("kv_splits=4,q_splits=2,iters=4,threads=256,", "combine_rows=8"), 2),
    ("gqa_b8", ("kv_splits=4,q_splits=2,iters=4,threads=256,", "combine_rows=8"), 3),
    ("gqa_b8", ("kv_splits=8,q_splits=2,iters=2,threads=256,", "combine_rows=8"), 2),
)


def member(case: str, parts: tuple[str, ...]):
    """The µGraph of ``case``'s member whose label holds every one of ``parts`` (the suite's family
    first, then the exploration's wider one)."""
    for wide in (False, True):
        graph = next((g for row, g in family(case, wide=wide) if all(p in row.label for p in parts)), None)
        if graph is not None:
            return graph
    raise LookupError(f"{case} has no member labelled {parts}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results", help="folder of the JSON record")
    parser.add_argument("--also", default="",
                        help="OptimizerOptions of every build, e.g. defer_values=true")
    parser.add_argument("--cases", default="", help="only these cases (comma-separated)")
    parser.add_argument("--cuts", default="", help="only these cuts (comma-separated)")
    parser.add_argument("--member", action="append", default=[],
                        help="only members whose label holds this text (repeatable)")
    args = parser.parse_args(argv)
    cases, cuts = set(filter(None, args.cases.split(","))), set(filter(None, args.cuts.split(",")))
    from benchmarks.explore import _options
    from mirage.codegen.lower_program import generate_cuda_program

    facts = device_facts()
    rows, programs, graphs = [], [], []
    for case, parts, stages in MEMBERS:
        if (cases and case not in cases) or (args.member and not any(m in parts[0] for m in args.member)):
            continue
        graph = member(case, parts)
        options = dataclasses.replace(OptimizerOptions(), stages=stages, warpgroup_softmax=True,
                                      tma_copies=True, **_options(args.also))
        program = generate_cuda_program(graph, None, options=options)
        for name, patterns in CUTS.items():
            if (cuts and name not in cuts) or (name in NORM_CUTS and "KeyNorms<" not in program.code):
                continue
            code = probes(name) + cut(program.code, patterns)
            programs.append(dataclasses.replace(program, code=code))
            graphs.append(graph)
            rows.append({"case": case, "member": ",".join(parts), "stages": stages, "cut": name,
                         "options": args.also})
    for row, program, graph in zip(rows, build_many(programs), graphs, strict=True):
        if isinstance(program, Exception):
            row["failure"] = str(program).splitlines()[0]
            print(row, flush=True)
            continue
        program.load()
        inputs = random_inputs(graph, seed=0)
        row["us"] = time_graph(lambda p=program, x=inputs: p.launch(x), replays=100).median_us
        row["kernel_us"] = kernel_times(lambda p=program, x=inputs: p.launch(x))
        print(row, flush=True)
    write_record(args.out, "attention_isolate", facts, rows)


if __name__ == "__main__":
    main()
