"""The online-softmax chain's forms on the attention cases' tuned members, each a build of the same
kernels with other ``MIRAGE_SOFTMAX_*`` macros (``mirage/gen/softmax.cuh``):

* ``default``: the score scale folded into the exponent's FFMA, exponentials and P·V products
  interleaved per 16 keys;
* ``per_element``: the score functor applied to each score, then log2(e) (the chain before the fold);
* ``two_pass``: the default with exponentials and products in two passes, which must agree with
  ``default`` bit for bit;
* ``warpgroup``: the chain on warpgroup MMAs (``OptimizerOptions.warpgroup_softmax``) where a member
  qualifies, each sub-tile's P·V issued with the next sub-tile's Q·K (``OptimizerOptions.defer_values``);
* ``warpgroup_in_step``: the same with each P·V in its own step, which must agree with ``warpgroup``
  bit for bit.
* ``warpgroup_tma`` and ``warpgroup_deferred_tma``: ``warpgroup_in_step`` and ``warpgroup`` with K and V
  copied by TMA (``OptimizerOptions.tma_copies``), which must agree with them bit for bit;
  ``warpgroup_tma_release``: ``warpgroup_tma`` with its stages handed back through barriers, no block
  barrier in the loop (``OptimizerOptions.tma_release``), bit for bit the same.
* ``lazy_rescale`` and ``warpgroup_lazy``: ``default`` and ``warpgroup_in_step`` with the reference
  maximum raised only when a row's maximum passes it by 2^8 (``MIRAGE_SOFTMAX_RESCALE_SLACK 8``), O's
  rescale skipped by the warps none of whose rows raised it.

(A ``column_pairs`` form, column reductions two outputs a thread, was measured within noise and
removed; its record is ``softmax_forms_h100_2026-11-22_column_pairs.json``.)

Every build is float-checked against float64.  Writes softmax_forms_<date>.json into ``--out``
(default benchmarks/results).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch

from benchmarks.mugraphs import CASES
from benchmarks.variants import family
from mirage.codegen.gpu_check import check_on_gpu, random_inputs
from mirage.codegen.lower_program import generate_cuda_program
from mirage.codegen.profile import device_facts, time_graph
from mirage.codegen.runtime import build_many
from mirage.optimizer import OptimizerOptions

CASES_TIMED = ("gqa_b1", "gqa_b8", "qknorm_b1", "qknorm_b8")
LAZY = "#define MIRAGE_SOFTMAX_RESCALE_SLACK 8\n"
# form → (macros before the code, OptimizerOptions overrides)
FORMS = {
    "default": ("", {}),
    "per_element": ("#define MIRAGE_SOFTMAX_FOLD_SCALE 0\n", {}),
    "two_pass": ("#define MIRAGE_SOFTMAX_INTERLEAVE 0\n", {}),
    "warpgroup": ("", {"warpgroup_softmax": True, "defer_values": True}),
    "warpgroup_in_step": ("", {"warpgroup_softmax": True}),
    "warpgroup_tma": ("", {"warpgroup_softmax": True, "tma_copies": True, "tma_release": False}),
    "warpgroup_deferred_tma": ("", {"warpgroup_softmax": True, "defer_values": True, "tma_copies": True}),
    "warpgroup_tma_release": ("", {"warpgroup_softmax": True, "tma_copies": True, "tma_release": True}),
    "lazy_rescale": (LAZY, {}),
    "warpgroup_lazy": (LAZY, {"warpgroup_softmax": True}),
}
# pairs of forms that must give the same bits
SAME = (("default", "two_pass"), ("warpgroup", "warpgroup_in_step"), ("warpgroup_in_step", "warpgroup_tma"),
        ("warpgroup", "warpgroup_deferred_tma"), ("warpgroup_tma", "warpgroup_tma_release"))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results", help="folder of the JSON record")
    parser.add_argument("--cases", default=",".join(CASES_TIMED), help="comma-separated attention cases")
    parser.add_argument("--forms", default=",".join(FORMS), help="comma-separated forms")
    args = parser.parse_args(argv)
    cases, forms = args.cases.split(","), {f: FORMS[f] for f in args.forms.split(",")}
    rows, programs = [], []
    for case in cases:
        for variant, graph in family(case):
            for form, (prefix, options) in forms.items():
                program = generate_cuda_program(graph, None,
                                                options=dataclasses.replace(OptimizerOptions(), **options))
                programs.append(dataclasses.replace(program, code=prefix + program.code))
                rows.append({"case": case, "label": variant.label, "form": form,
                             "warpgroup": "Swizzled128Layout" in program.code})
    built = build_many(programs)
    results = {}
    for row, program in zip(rows, built, strict=True):
        if isinstance(program, Exception):
            row["failure"] = str(program).splitlines()[0]
            continue
        reference = CASES[row["case"]].reference()
        inputs = random_inputs(reference, seed=0)
        program.load()
        row["us"] = time_graph(lambda p=program, x=inputs: p.launch(x), replays=100).median_us
        check = check_on_gpu(reference, program, inputs=inputs)
        row["passed"], row["relative_error"] = check.passed, check.worst_error
        results[(row["case"], row["label"], row["form"])] = program(*inputs)[0]
        print(row, flush=True)
    identical = {}
    for first, second in SAME:
        same = [torch.equal(results[(c, lab, first)], results[(c, lab, second)])
                for (c, lab, f) in results if f == first and (c, lab, second) in results]
        identical[f"{second}/{first}"] = [sum(same), len(same)]
        print(f"{second} bit-identical to {first}: {sum(same)} of {len(same)}")
    best = {}
    for case in cases:
        for form in forms:
            times = [r["us"] for r in rows if r["case"] == case and r["form"] == form and "us" in r]
            best[f"{case}/{form}"] = min(times)
            print(f"best {case} {form}: {min(times):.2f} µs")
    facts = device_facts()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    with open(Path(args.out) / f"softmax_forms_{facts['date']}.json", "w") as f:
        json.dump({"facts": facts, "builds": rows, "best": best, "bit_identical": identical}, f, indent=1)


if __name__ == "__main__":
    main()
