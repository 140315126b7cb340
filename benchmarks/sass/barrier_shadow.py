"""Does a barrier's shadow matter on this GPU?  The SASS tuner once produced a wrong candidate of
qknorm_b1's attention kernel whose last move took an ``LDS`` up toward a named
``BAR.SYNC.DEFER_BLOCKING`` (2026-11-30, H200; the legality model had allowed it).  One explanation
would be that a deferred barrier needs the instructions ptxas puts between it and the first shared
load after it.  This probe builds that kernel (the suite record's pick), checks the original against
itself on fresh inputs (is it deterministic?), then moves the first shared load after each barrier up
by one slot at a time until it sits right after the barrier (stall counts repaired as the tuner would),
and checks each candidate against the original, bit for bit.

    python benchmarks/sass/barrier_shadow.py --out DIR [--suite RECORD.json] [--case qknorm_b1]

Writes ``DIR/barrier_shadow.json``: per barrier and distance, the candidate's verification status.
On the H200 every such candidate computed the original's bits (``barrier_shadow_h200_2026-11-30.json``),
so the shadow is not what broke that candidate; ptxas itself puts an ``LDS`` right after the same
barrier elsewhere in the kernel.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--suite", type=Path, default=ROOT / "benchmarks/results/suite_h200_2026-11-28.json")
    parser.add_argument("--case", default="qknorm_b1")
    parser.add_argument("--sets", type=int, default=16, help="fresh input sets per candidate")
    args = parser.parse_args(argv)
    from run_tuning import device_info
    from tune_mugraphs import INPUT_SCALE, build_programs

    from mirage.sass.elf import Cubin
    from mirage.sass.kernel import load_kernel
    from mirage.sass.legality import DEFAULT_LATENCY, _check_distances
    from mirage.sass.mugraph import launch_specs
    from mirage.sass.worker import Session

    program = build_programs([args.case], args.suite)[args.case]
    cubin = Cubin.read(program.cubin)
    rows = []
    for spec in launch_specs(program, scale=INPUT_SCALE):
        kernel = load_kernel(cubin, spec.kernel)
        session = Session(spec, cubin.data, seeds=[0])
        seeds = list(range(100, 100 + args.sets))
        same = session.verify(cubin.data, seeds=seeds)  # the original against itself: deterministic?
        rows.append({"kernel": spec.kernel, "original_against_itself": same["status"],
                     "detail": same.get("detail", "")})
        print(rows[-1], flush=True)
        for i, barrier in enumerate(kernel.instructions):
            if barrier.opcode != "BAR":
                continue
            block = kernel.blocks[kernel.block_of[i]]
            access = next((j for j in range(i + 1, block.end) if kernel.instructions[j].memory is not None
                           and kernel.instructions[j].opcode.startswith("LDS")), None)
            if access is None or any(kernel.instructions[j].memory is not None for j in range(i + 1, access)):
                continue
            moved = kernel
            for distance in range(1, access - i):  # up by one slot at a time, up to right after the barrier
                # the distance rule alone (stall counts repaired as the tuner would); the shadow rule skipped
                legality = _check_distances(moved, access - distance, DEFAULT_LATENCY, True)
                if not legality.ok:
                    rows.append({"kernel": spec.kernel, "barrier": barrier.text, "slots_up": distance,
                                 "status": "not built", "detail": legality.reason})
                    break
                moved = moved.swapped(access - distance, legality.stall_raises)
                candidate = cubin.with_text(spec.kernel, moved.text_bytes())
                result = session.verify(candidate.data, seeds=seeds)
                row = {"kernel": spec.kernel, "barrier": barrier.text,
                       "load": kernel.instructions[access].text,
                       "slots_up": distance, "slots_left": access - i - 1 - distance,
                       "status": result["status"], "detail": result.get("detail", "")}
                rows.append(row)
                print(row, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "barrier_shadow.json").write_text(json.dumps({**device_info(), "case": args.case,
                                                              "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
