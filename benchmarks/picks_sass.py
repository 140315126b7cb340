"""The suite's picks compiled for sm_90a, without a GPU: each case's instruction count and a digest of its
SASS (addresses and encodings left out), so that a change of the device library or the code generator
can show that it moves no kernel the suite runs, and so needs no new suite call.

    python -m benchmarks.picks_sass --suite benchmarks/results/suite_h200_2026-11-28.json --out A.json
    (at another revision)
    python -m benchmarks.picks_sass --suite benchmarks/results/suite_h200_2026-11-28.json --against A.json

Each pick is built as ``benchmarks.define_ab`` builds it (its µGraph from the case's family, the
record's options).  With ``--against``, prints which cases differ and exits 1 if any does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from pathlib import Path

INSTRUCTION = re.compile(r"\s+/\*[0-9a-f]{4}\*/")
ADDRESS = re.compile(r"/\*[0-9a-f]{4,}\*/")


def digests(suite: str) -> dict[str, tuple[int, str]]:
    """Case → (instructions, digest of their text) of the record's picks."""
    from benchmarks.define_ab import pick
    from mirage.codegen.compile import CompileOptions, Stage, compile_sources
    from mirage.codegen.lower_program import generate_cuda_program
    from mirage.codegen.runtime import BuildChoice
    from mirage.mugraph.target import TARGETS

    names, codes = [], []
    for record in json.loads(Path(suite).read_text())["cases"]:
        best = record.get("selection", {}).get("best")
        if best:
            graph = pick(record["case"], best)
            names.append(record["case"])
            codes.append(generate_cuda_program(graph, 90, options=BuildChoice.from_dict(best).options()).code)
    results = compile_sources(codes, CompileOptions(target=TARGETS["H100"]), dumps={Stage.SASS})
    out = {}
    for name, result in zip(names, results, strict=True):
        lines = [ADDRESS.sub("", line.split(";")[0]).strip() for line in result.sass().splitlines()
                 if INSTRUCTION.match(line)]
        out[name] = (len(lines), hashlib.sha1("\n".join(lines).encode()).hexdigest()[:12])
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="benchmarks/results/suite_h200_2026-11-28.json")
    parser.add_argument("--out", default="", help="write the digests here (JSON)")
    parser.add_argument("--against", default="", help="a JSON of an earlier run: report what differs")
    args = parser.parse_args(argv)
    now = digests(args.suite)
    if args.out:
        Path(args.out).write_text(json.dumps(now, indent=1))
    for name, (count, digest) in now.items():
        print(f"{name:12s} {count:6d} instructions  {digest}")
    if not args.against:
        return 0
    before = {k: tuple(v) for k, v in json.loads(Path(args.against).read_text()).items()}
    moved = sorted(k for k in now if before.get(k) != now[k])
    print(f"{len(now) - len(moved)} of {len(now)} picks compile to the same SASS"
          + (f"; differ: {', '.join(moved)}" if moved else ""))
    return 1 if moved else 0


if __name__ == "__main__":
    raise SystemExit(main())
