"""The online-softmax chain's two instruction orders on the attention cases' tuned members:
exponentials and P·V products interleaved per 16 keys (the default) or in two passes
(``-DMIRAGE_SOFTMAX_INTERLEAVE=0``).  Same kernels otherwise; every build is float-checked, and the
two orders must agree bit for bit.  Writes softmax_order_<date>.json under $OUT (or /tmp)."""

from __future__ import annotations

import dataclasses
import json
import os

import torch

from benchmarks.mugraphs import CASES
from benchmarks.variants import family
from mirage.codegen.gpu_check import check_on_gpu, random_inputs
from mirage.codegen.lower_program import generate_cuda_program
from mirage.codegen.profile import device_facts, time_graph
from mirage.codegen.runtime import build_many

ORDERS = {"interleaved": "", "two_pass": "#define MIRAGE_SOFTMAX_INTERLEAVE 0\n"}


def main() -> None:
    rows, programs = [], []
    for case in ("gqa_b1", "gqa_b8", "qknorm_b1", "qknorm_b8"):
        for variant, graph in family(case):
            program = generate_cuda_program(graph, None)
            for order, prefix in ORDERS.items():
                programs.append(dataclasses.replace(program, code=prefix + program.code))
                rows.append({"case": case, "label": variant.label, "order": order})
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
        row["passed"] = check_on_gpu(reference, program, inputs=inputs).passed
        results[(row["case"], row["label"], row["order"])] = program(*inputs)[0]
        print(row, flush=True)
    same = [torch.equal(results[(c, lab, "interleaved")], results[(c, lab, "two_pass")])
            for (c, lab, o) in results if o == "interleaved" and (c, lab, "two_pass") in results]
    print(f"bit-identical: {sum(same)} of {len(same)}")
    for case in ("gqa_b1", "gqa_b8", "qknorm_b1", "qknorm_b8"):
        for order in ORDERS:
            times = [r["us"] for r in rows if r["case"] == case and r["order"] == order and "us" in r]
            print(f"best {case} {order}: {min(times):.2f} µs")
    facts = device_facts()
    with open(os.path.join(os.environ.get("OUT", "/tmp"), f"softmax_order_{facts['date']}.json"), "w") as f:
        json.dump({"facts": facts, "builds": rows, "bit_identical": [sum(same), len(same)]}, f, indent=1)


if __name__ == "__main__":
    main()
